"""Decoder calls (DecoderCall: one chunk's greedy and sampled requests) and serving them from one queue: every lane
decodes in one session for the whole stage, pulling the next item's requests as its slots free up
(Scorer.serve_greedy).

Calls decoded one by one each end in steps of a few rows as their queue drains, and the lanes wait on the longest
call; on 2 cores more than half of the stage's steps held fewer than 16 rows (docs/performance.md, "What a step
costs, and the calls' narrow tails"). From one queue both lanes stay full until the stage's last items. Which
completions share a step then depends on timing, so it is used only where a completion is the same bits in any
call (DecodePlan.exact); the results are handed back per call, in the calls' order, as `Lanes.ordered` gives them.
The greedy stage serves its chunks' calls so, and building on-policy items its calls of the model's attempts.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastscore.records import GreedyRequest, GreedyResult
from fastscore.study.stages.isolate import ITEM_LEVEL_ERRORS, call_isolating
from fastscore.study.stages.lanes import Lanes

log = logging.getLogger(__name__)


# Calls whose items are queued costliest first; a call's results wait for every item queued before its last.
CALLS_PER_WINDOW = 4
# How often the stage, waiting for a call's items, looks whether a lane has failed.
POLL_SECONDS = 0.5
RETRY_TEMPERATURE = 1.0  # sampled completions (the greedy stage's on-policy samples)


def retry_rng(seed: int, request_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(request_id.encode())])


@dataclass(frozen=True)
class DecoderCall:
    """One Scorer.greedy call: per item, its greedy requests, then (the greedy stage's on-policy items) its sampled
    ones; `cap`: the call's max_new_tokens.

    Greedy and sampled requests of one context share a call so that the decoder computes the context once: a sample
    joins as a copy of a stream that holds it. Sampled ones draw from their own generators, so on an exact type, on a
    backend whose steps give a prefill's bits, each completion is the one a call of its own would give."""
    greedy: dict[str, list[GreedyRequest]]
    sampled: dict[str, list[GreedyRequest]]
    cap: int
    seed: int

    @property
    def requests(self) -> dict[str, list[GreedyRequest]]:
        return {i: self.greedy.get(i, []) + self.sampled.get(i, []) for i in (*self.greedy, *self.sampled)}

    @property
    def cost(self) -> int:
        """Tokens it may decode at most: which call a free lane takes first (longest first)."""
        return sum(r.max_new_tokens or self.cap for reqs in self.requests.values() for r in reqs)

    def sampled_ids(self) -> frozenset[str]:
        return frozenset(r.id for reqs in self.sampled.values() for r in reqs)

    def run(self, scorer) -> tuple[dict[str, list[GreedyResult]], dict[str, Exception]]:
        """Results per item in its requests' order (greedy, then sampled), and the items that failed."""
        return call_isolating(lambda reqs: scorer.greedy(reqs, **self._decoding(reqs)), self.requests,
                              lambda r: r.id)

    def units(self, scorer, tag, failed: dict[str, Exception]) -> dict[str, Any]:
        """Each item's requests as a unit for Scorer.serve_greedy, keyed (tag, item id); an item the scorer rejects
        goes to `failed` instead, as `run` would leave it out."""
        out = {}
        for item_id, reqs in self.requests.items():
            try:
                out[item_id] = scorer.greedy_unit((tag, item_id), reqs, **self._decoding(reqs))
            except ITEM_LEVEL_ERRORS as exc:
                log.warning("item %s: %s", item_id, exc)
                failed[item_id] = exc
        return out

    def _decoding(self, reqs: list[GreedyRequest]) -> dict[str, Any]:
        """The budget cap, temperatures and generators of `reqs`: 0 for greedy ones, RETRY_TEMPERATURE with a fresh
        generator (retry_rng) for sampled ones."""
        sampled_ids = self.sampled_ids()
        sampled = [r.id in sampled_ids for r in reqs]
        return {"max_new_tokens": self.cap, "temperature": [RETRY_TEMPERATURE if s else 0.0 for s in sampled],
                "rngs": [retry_rng(self.seed, r.id) if s else None for r, s in zip(reqs, sampled)]}


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
