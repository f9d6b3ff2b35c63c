"""The greedy stage's decoder calls served from one queue: every lane decodes in one session for the whole stage,
pulling the next item's requests as its slots free up (Scorer.serve_greedy).

Calls decoded one by one each end in steps of a few rows as their queue drains, and the lanes wait on the longest
call; on 2 cores more than half of the stage's steps held fewer than 16 rows (docs/performance.md, "What a step
costs, and the calls' narrow tails"). From one queue both lanes stay full until the stage's last items. Which
completions share a step then depends on timing, so it is used only where a completion is the same bits in any
call (DecodePlan.exact); the results are handed back per call, in the calls' order, as `Lanes.ordered` gives them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence

from fastscore.records import GreedyResult
from fastscore.study.stages.lanes import Lanes


# Calls whose items are queued costliest first; a call's results wait for every item queued before its last.
CALLS_PER_WINDOW = 4
# How often the stage, waiting for a call's items, looks whether a lane has failed.
POLL_SECONDS = 0.5


def served(lanes: Lanes, calls: Sequence) -> Iterator[tuple[object, tuple[dict[str, list[GreedyResult]],
                                                                          dict[str, Exception]]]]:
    """(call, (results per item, errors per item)) for every DecoderCall, in order, as DecoderCall.run gives them;
    their items' requests decoded by every lane from one queue (each lane's streams sized for the stage's longest
    sequence), window by window of calls. An item whose requests the scorer rejects (an item-level error) fails
    alone, before any decoding. Close the iterator (contextlib.closing) so that an error in the caller stops the
    lanes too."""
    tokenizing = lanes.first
    failed: list[dict[str, Exception]] = [{} for _ in calls]
    units = []
    for lo in range(0, len(calls), CALLS_PER_WINDOW):
        window = [unit for n in range(lo, min(lo + CALLS_PER_WINDOW, len(calls)))
                  for unit in calls[n].units(tokenizing, n, failed[n]).values()]
        # The costliest units first (the most tokens they may decode), so that the stage ends on small ones and the
        # lanes finish together; only within a window of calls, so that results are stored as the stage goes.
        units += sorted(window, key=lambda unit: -sum(unit.unit.budgets))
    longest = max((unit.longest for unit in units), default=1)
    # A session pulls units until its slots are full: on a small stage one lane would take every unit while the
    # others idle, so no lane gets more slots than its share of the stage's contexts.
    share = -(-sum(len(unit.unit.contexts) for unit in units) // len(lanes.scorers))
    queue = deque(units)
    del units  # the queue holds each unit until a lane takes it
    wanted = [{item_id for item_id in call.requests if item_id not in failed[n]} for n, call in enumerate(calls)]
    results: list[dict[str, list[GreedyResult]]] = [{} for _ in calls]
    lock = threading.Condition()

    def pull():
        with lock:
            return queue.popleft() if queue else None

    def done(key, got: list[GreedyResult]) -> None:
        n, item_id = key
        with lock:
            results[n][item_id] = got
            lock.notify_all()

    def work(scorer) -> None:
        if queue:
            scorer.serve_greedy(pull, done, longest, width=max(share, 1))

    with lanes.side_by_side(work) as ends:
        for n, call in enumerate(calls):
            with lock:
                while len(results[n]) < len(wanted[n]):
                    lock.wait(POLL_SECONDS)
                    for end in ends:
                        if end.done() and end.exception() is not None:
                            raise end.exception()
                    if all(end.done() for end in ends) and len(results[n]) < len(wanted[n]):
                        raise RuntimeError(f"the lanes ended with call {n}'s items not decoded")  # a bug, not data
            ok = {item_id: results[n].pop(item_id) for item_id in call.requests if item_id in wanted[n]}
            if n == len(calls) - 1:
                # Every unit is decoded: the lanes are ending. Their errors reach the stage here, since a caller
                # that has its last results closes the iterator instead of asking for more.
                for end in ends:
                    end.result()
            yield call, (ok, failed[n])
