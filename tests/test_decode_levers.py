"""The decoding levers simulated by bench/lab/decode_levers.py, on crafted token sequences counted by hand."""

from __future__ import annotations

from fastscore.bench.lab.decode_levers import cells_attended, drafted_steps, lookup_draft


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_longest_tail():
    assert lookup_draft([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3], k=2) == [7, 5]  # "2 3" last seen before 7 5
    assert lookup_draft([5, 1, 2, 3, 4, 8, 1, 2, 3, 6, 3], k=3) == [6, 3]  # "3" alone: its latest earlier occurrence
    assert lookup_draft([1, 2, 3, 4], k=2) == []


def test_drafted_steps_count_the_steps_that_choose_every_token():
    context, completion = [10, 11, 12, 13, 14, 15], [10, 11, 12, 13, 14, 15]
    # No drafts: one step per token. The completion copies the context: the first token from the prefill, then each
    # step keeps its k drafts and the token its last row chooses.
    assert drafted_steps(context, completion, 6, k=0) == 6
    assert drafted_steps(context, completion, 6, k=2) == 1 + 2  # tokens 1 | 2 3 4 | 5 6 (7 would be past the end)
    assert drafted_steps(context, [20, 21, 22], 3, k=4) == 3  # nothing to look up: one token per step


def test_cells_attended_follow_the_longest_live_stream():
    # Two requests live together: 64-cell and 10-cell contexts, 2 tokens each; every row attends 128 cells once the
    # longer stream passes 64.
    rows, attended, needed = cells_attended([64, 10], [2, 2], [0, 1])
    assert rows == 4
    assert attended == 2 * 128 + 2 * 128
    assert needed == (65 + 11) + (66 + 12)
    # One slot: each request alone, its own cells padded to 64.
    assert cells_attended([64, 10], [2, 2], [0, 1], width=1) == (4, 128 + 128 + 64 + 64, 65 + 66 + 11 + 12)
