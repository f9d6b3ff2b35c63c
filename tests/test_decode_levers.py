"""The decoding levers simulated by bench/lab/decode_levers.py, on crafted token sequences counted by hand."""

from __future__ import annotations

from fastscore.bench.lab.decode_levers import cells_attended, drafted_steps, lookup_draft


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_longest_tail():
    assert lookup_draft([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3], k=2) == [7, 5]  # "2 3" last seen before 7 5
    assert lookup_draft([5, 1, 2, 3, 4, 8, 1, 2, 3, 6, 3], k=3) == [6, 3]  # "3" alone: its latest earlier occurrence
    assert lookup_draft([1, 2, 3, 4], k=2) == []


def test_drafted_steps_count_the_steps_after_the_prefills_token():
    context = [10, 11, 12, 13, 14, 15]
    # No drafts: one step per token after the first, which the prefill's logits give.
    assert drafted_steps(context, context, 6, k=0) == 5
    # The completion copies its context: each step keeps its k drafts and the token its last row chooses:
    # 10 (prefill) | 11 12 13 | 14 15 (and a 7th the budget does not take).
    assert drafted_steps(context, context, 6, k=2) == 2
    assert drafted_steps(context, [20, 21, 22], 3, k=4) == 2  # nothing to look up: one token per step
    # A draft rejected partway: 10 (prefill) | 11 (drafted 11 12; 12 rejected) 99 (the row's choice) | the stop token
    # (chosen = the completion's 3 tokens and the stop token).
    assert drafted_steps([10, 11, 12, 13], [10, 11, 99], 4, k=2) == 2


def test_cells_attended_follow_the_longest_live_stream():
    # Two requests live together: 64- and 10-token contexts, 2 tokens each (the first from the prefill), so one
    # step, whose rows both attend 128 cells (65 padded to 64s) while they need 65 and 11.
    assert cells_attended([64, 10], [2, 2], [0, 1]) == (1 * 2, 2 * 128, 65 + 11)
    # One slot: the first alone (one step over 65 cells), then the second joins, feeding its last context token
    # (10 cells) and then its first (11): three rows.
    assert cells_attended([64, 10], [2, 2], [0, 1], width=1) == (3, 128 + 64 + 64, 65 + 10 + 11)
    # A request whose first token (from the prefill) was its stop token takes no step.
    assert cells_attended([64, 10], [1, 2], [0, 1]) == (1, 64, 11)


def test_a_steps_cost_is_fitted_to_a_fixed_part_and_a_part_per_row():
    from fastscore.bench.lab.step_widths import fit_step_cost

    a, b = fit_step_cost([1, 4, 10, 32], [0.05 + 0.007 * r for r in (1, 4, 10, 32)])
    assert abs(a - 0.05) < 1e-12 and abs(b - 0.007) < 1e-12


def test_a_session_refills_freed_slots_in_order():
    from fastscore.bench.lab.step_widths import session_rows

    # Two slots; tokens chosen 4, 1, 2. The first two start with a token from the prefill; the second chose only
    # its stop token there and takes no step, so request 2 joins at once, feeding its last context token.
    # Step 1: request 0 (1 -> 2 of 4) and request 2 (0 -> 1 of 2); step 2: both again (request 2 done);
    # step 3: request 0 alone (3 -> 4).
    assert session_rows([4, 1, 2], width=2) == [2, 2, 1]


def _cost(rows: int) -> float:
    """A step's cost in the shared-queue tests: a fixed part and one per row."""
    return 1.0 + rows


def test_one_queue_for_two_lanes_shares_the_sequences_out():
    from fastscore.bench.lab.step_widths import session_rows, shared_queue

    chosen = [5, 5, 2, 2]
    # One lane: the session over the whole queue.
    assert shared_queue(chosen, 1, _cost, width=2) == [sum(_cost(r) for r in session_rows(chosen, width=2))]
    # Two lanes of one slot: lane 0 takes request 0 (4 steps after its prefill token), lane 1 request 1 (the
    # same); neither frees a slot before the other's clock passes it, so requests 2 and 3 join one each (2 steps).
    assert shared_queue(chosen, 2, _cost, width=1) == [6 * _cost(1), 6 * _cost(1)]


def test_a_lane_of_the_shared_queue_frees_a_slot_its_first_fill_left_at_once():
    from fastscore.bench.lab.step_widths import session_rows, shared_queue

    # Request 1 chose only its stop token, from the prefill: its slot goes to request 2 in the first step. (Both
    # fail if that slot idles for a step: 4 and 7 instead of 3 and 6.)
    for chosen in ([2, 1, 1], [3, 1, 1, 1]):
        assert shared_queue(chosen, 1, _cost, width=2) == [sum(_cost(r) for r in session_rows(chosen, width=2))]


def test_the_timed_decoder_passes_everything_through_and_times_each_step():
    import numpy as np

    from fastscore.backends.base import Decoder
    from fastscore.bench.lab.decode_levers import TimedDecoder

    class Fake(Decoder):
        refills = True

        def __init__(self) -> None:
            self.calls: list[str] = []

        def reserve_slots(self, slots, longest):
            self.calls.append("reserve")
            return slots

        def start(self, contexts):
            self.calls.append("start")
            return np.zeros((len(contexts), 4), dtype=np.float32)

        def step(self, active, tokens):
            self.calls.append("step")
            return np.zeros((len(active), 4), dtype=np.float32)

        def join_step(self, active, tokens, joining):
            self.calls.append("join")
            return np.zeros((len(active) + len(joining), 4), dtype=np.float32)

        def close(self):
            self.calls.append("close")

    inner = Fake()
    with TimedDecoder(inner) as timed:
        assert timed.refills and timed.reserve_slots(3, 10) == 3
        timed.start([[1, 2], [3]])
        timed.step([0, 1], [5, 6])
        timed.join_step([0], [7], [[8, 9]])
    assert inner.calls == ["reserve", "start", "step", "join", "close"]
    assert timed.rows == [2, 2] and timed.joins == [0, 1] and len(timed.seconds) == 2
    assert timed.cells == [None, None]  # a decoder that keeps no positions says nothing of its cells


def test_the_timed_decoder_counts_the_cells_each_step_attends():
    """A stream decoder's next_pos: the next token's position, so its row attends next_pos + 1 cells; a joining
    context's last token runs in the step at position len - 1, attending len cells."""
    import numpy as np

    from fastscore.backends.base import Decoder
    from fastscore.bench.lab.decode_levers import TimedDecoder

    class Positions(Decoder):
        refills = True

        def __init__(self) -> None:
            self.next_pos: list[int] = []

        def start(self, contexts):
            self.next_pos = [len(c) for c in contexts]
            return np.zeros((len(contexts), 4), dtype=np.float32)

        def step(self, active, tokens):
            for i in active:
                self.next_pos[i] += 1
            return np.zeros((len(active), 4), dtype=np.float32)

        def join_step(self, active, tokens, joining):
            self.next_pos += [len(c) - 1 for c in joining]
            return self.step([*active, *range(len(self.next_pos) - len(joining), len(self.next_pos))], tokens)

        def close(self):
            pass

    with TimedDecoder(Positions()) as timed:
        timed.start([[1, 2, 3], [4]])  # next positions 3 and 1
        timed.step([0, 1], [5, 6])  # rows attend 4 + 2 cells
        timed.step([0], [7])  # 5
        timed.join_step([0], [8], [[9, 9, 9, 9, 9, 9]])  # 6 + 6
    assert timed.cells == [6, 5, 12]
