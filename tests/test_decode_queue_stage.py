"""The greedy stage's queue (decode_queue.served) on instrumented fake lanes: every call's results come back in the
calls' order whichever lane decoded its items, costliest items first within a window, an item the scorer rejects
fails alone, and a lane's error reaches the stage."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from fastscore.errors import ContextTooLongError
from fastscore.records import GreedyRequest, GreedyResult, Message
from fastscore.study.stages import decode_queue
from fastscore.study.stages.decode import DecoderCall
from fastscore.study.stages.lanes import Lanes


@dataclass(frozen=True)
class FakeUnit:
    key: tuple
    budgets: tuple[int, ...]
    requests: tuple[GreedyRequest, ...]

    @property
    def unit(self):
        return self

    @property
    def longest(self) -> int:
        return 10 + max(self.budgets)

    @property
    def contexts(self) -> tuple[GreedyRequest, ...]:
        return self.requests


class FakeLane:
    """Makes units of requests (rejecting those named in `reject`) and serves them: each completion's text is its
    request id and the lane's name; records the order in which it pulled units."""

    def __init__(self, name: str, reject=(), fail_after: int | None = None) -> None:
        self.name, self.reject, self.fail_after = name, set(reject), fail_after
        self.pulled: list[tuple] = []
        self.longest: list[int] = []
        self.widths: list[int] = []

    def greedy_unit(self, key, requests, max_new_tokens=128, ban_prefix=False, *, temperature=0.0, rngs=None):
        if key[1] in self.reject:
            raise ContextTooLongError("too long", request_id=requests[0].id)
        return FakeUnit(key, tuple(r.max_new_tokens for r in requests), tuple(requests))

    def serve_greedy(self, pull, on_done, longest, width=None):
        self.longest.append(longest)
        self.widths.append(width)
        if self.fail_after == -1:  # before taking any unit
            raise RuntimeError(f"lane {self.name} broke")
        while (unit := pull()) is not None:
            self.pulled.append(unit.key)
            if self.fail_after is not None and len(self.pulled) > self.fail_after:
                raise RuntimeError(f"lane {self.name} broke")
            threading.Event().wait(0.01)  # let the other lane pull too
            on_done(unit.key, [GreedyResult(id=r.id, text=f"{r.id}@{self.name}", token_ids=(1,),
                                            stopped_by="end_of_turn") for r in unit.requests])


def _calls(budgets_per_call: list[list[int]]) -> list[DecoderCall]:
    calls = []
    for c, budgets in enumerate(budgets_per_call):
        greedy = {f"item{c}.{k}": [GreedyRequest(f"item{c}.{k}::{cond}", (Message("user", "hi"),),
                                                 max_new_tokens=budget) for cond in ("before", "after")]
                  for k, budget in enumerate(budgets)}
        calls.append(DecoderCall(greedy, {}, cap=64, seed=0))
    return calls


def test_results_come_back_in_the_calls_order_costliest_items_pulled_first_and_a_rejected_item_fails_alone():
    calls = _calls([[4, 30], [8, 16], [2, 6]])
    lanes = [FakeLane("a", reject={"item1.0"}), FakeLane("b", reject={"item1.0"})]
    got = list(decode_queue.served(Lanes(lanes), calls))
    assert [call for call, _ in got] == calls
    for call, (ok, failed) in got:
        assert list(ok) == [i for i in call.requests if i != "item1.0"]
        for item_id, results in ok.items():
            assert [r.id for r in results] == [r.id for r in call.requests[item_id]]
    assert list(got[1][1][1]) == ["item1.0"] and isinstance(got[1][1][1]["item1.0"], ContextTooLongError)
    pulled = lanes[0].pulled + lanes[1].pulled
    budgets = {key: 2 * b for key, b in zip([(0, "item0.0"), (0, "item0.1"), (1, "item1.1"), (2, "item2.0"),
                                            (2, "item2.1")], [4, 30, 16, 2, 6])}
    print("pulled", lanes[0].pulled, lanes[1].pulled)
    assert len(pulled) == 5 and set(pulled) == set(budgets)
    assert lanes[0].pulled and lanes[1].pulled  # both lanes served
    # one window of up to CALLS_PER_WINDOW calls: each lane pulls in descending cost
    for lane in lanes:
        assert [budgets[key] for key in lane.pulled] == sorted((budgets[key] for key in lane.pulled), reverse=True)
    assert set(lanes[0].longest + lanes[1].longest) == {10 + 30}  # sized for the stage's longest unit
    assert lanes[0].widths == lanes[1].widths == [5]  # at most its share of the stage's 10 contexts


def test_a_lanes_error_reaches_the_stage():
    calls = _calls([[4, 30], [8, 16], [2, 6]])
    lanes = Lanes([FakeLane("a", fail_after=0), FakeLane("b", fail_after=0)])
    with pytest.raises(RuntimeError, match="broke"):
        list(decode_queue.served(lanes, calls))


def test_a_lanes_error_reaches_the_stage_when_the_other_lane_decodes_everything():
    """One lane fails before taking any unit; the other decodes them all: the stage still sees the error."""
    calls = _calls([[4, 30], [8, 16]])
    broken = FakeLane("a", fail_after=-1)
    lanes = Lanes([FakeLane("b"), broken])
    with pytest.raises(RuntimeError, match="lane a broke"):
        list(decode_queue.served(lanes, calls))


def test_more_calls_than_a_window_keep_the_calls_order_and_each_windows_costliest_first():
    budgets = [[2, 40], [8, 16], [4, 6], [30, 2], [50, 1], [3, 3]]  # windows: calls 0-3, then 4-5
    calls = _calls(budgets)
    lane = FakeLane("a")
    got = list(decode_queue.served(Lanes([lane]), calls))
    assert [call for call, _ in got] == calls
    cost = {(c, f"item{c}.{k}"): b for c, row in enumerate(budgets) for k, b in enumerate(row)}
    first, second = lane.pulled[:8], lane.pulled[8:]
    assert {key[0] for key in first} == {0, 1, 2, 3} and {key[0] for key in second} == {4, 5}
    for window in (first, second):
        assert [cost[key] for key in window] == sorted((cost[key] for key in window), reverse=True)

