"""Lanes: decoder calls side by side, each on its own copy of the model, their results taken in job order.

On 2 cores one llama.cpp context on 2 threads leaves a core idle for part of every small decoding step (a step of a
few rows, the barriers between graph nodes, llama.cpp's host work and the Python between steps); two single-threaded
contexts, each decoding its own call, keep both cores busy (docs/performance.md, "Lanes"). A call's result does not
depend on its lane: each is the same call on the same weights as without lanes, and llama.cpp's results do not
depend on its thread count (tests/test_lanes.py). The caller takes the results in job order, so what it stores, and
where a resumed run starts, are those of one lane. Each lane holds a copy of the weights (and its contexts).

Stages that make one call at a time (building on-policy items) or whose calls use two threads well (scoring) run on
the first lane with every lane's threads (`solo`); with one lane nothing changes.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from fastscore.backends.llamacpp_abort import abort_workers, mark_lane_thread

Job = TypeVar("Job")
Result = TypeVar("Result")


class Lanes:
    """Scorers of one model that run jobs side by side; `first` is the one `solo` lends all the threads."""

    def __init__(self, scorers: Sequence) -> None:
        if not scorers:
            raise ValueError("lanes need at least one scorer")
        self.scorers = tuple(scorers)

    @property
    def first(self):
        return self.scorers[0]

    @contextlib.contextmanager
    def solo(self) -> Iterator:
        """The first scorer on every lane's threads, for a stage that makes one call at a time; the other lanes
        idle meanwhile. A backend that cannot change its threads keeps its own."""
        backend = self.first.backend
        threads = [scorer.backend.n_threads for scorer in self.scorers]
        if len(threads) == 1 or not backend.threads_adjustable or None in threads:
            yield self.first
            return
        backend.set_threads(sum(threads))
        try:
            yield self.first
        finally:
            backend.set_threads(threads[0])

    def computed_tokens(self) -> int:
        return sum(scorer.backend.stats.computed_tokens for scorer in self.scorers)

    @contextlib.contextmanager
    def side_by_side(self, work: Callable[[object], None]) -> Iterator[list[Future]]:
        """work(scorer) on every lane at once, each in a thread of its own, for the block's duration; the futures
        report each lane's end. Leaving the block by an error, or before every lane has ended, stops the lanes
        (their llama.cpp calls aborted)."""

        def run(scorer) -> None:
            mark_lane_thread()
            work(scorer)

        futures: dict[int, Future] = {}
        with ThreadPoolExecutor(max_workers=len(self.scorers), thread_name_prefix="lane") as pool, \
                _stop_workers_on_exit(pool, futures):
            for n, scorer in enumerate(self.scorers):
                futures[n] = pool.submit(run, scorer)
            yield list(futures.values())

    def ordered(self, jobs: Iterable[Job], compute: Callable[[Job, object], Result],
                cost: Callable[[Job], float] | None = None) -> Iterator[tuple[Job, Result]]:
        """(job, compute(job, scorer)) for every job, in the jobs' order. With several lanes and jobs, each job runs
        on the first free scorer while the caller handles the results before it. Only the jobs within a window ahead
        of the one the caller waits for are started, costliest first (so the short ones fill the ends), which keeps
        the caller storing as the stage goes. A single job runs alone on every lane's threads (solo). Close the
        iterator (contextlib.closing) so an error in the caller stops the lanes too."""
        jobs = list(jobs)
        if len(self.scorers) == 1 or len(jobs) <= 1:
            with self.solo() as scorer:
                for job in jobs:
                    yield job, compute(job, scorer)
            return
        free: queue.SimpleQueue = queue.SimpleQueue()
        for scorer in self.scorers:
            free.put(scorer)

        def run(job: Job) -> Result:
            mark_lane_thread()  # its llama.cpp calls can then be stopped by abort_workers
            scorer = free.get()
            try:
                return compute(job, scorer)
            finally:
                free.put(scorer)

        window = 2 * len(self.scorers) + 2
        futures: dict[int, Future] = {}
        with ThreadPoolExecutor(max_workers=len(self.scorers), thread_name_prefix="lane") as pool, \
                _stop_workers_on_exit(pool, futures):

            def submit_up_to(stop: int) -> None:
                new = list(range(len(futures), min(stop, len(jobs))))
                for n in sorted(new, key=lambda n: -cost(jobs[n])) if cost is not None else new:
                    futures[n] = pool.submit(run, jobs[n])

            for n, job in enumerate(jobs):
                submit_up_to(n + 1 + window)
                yield job, futures[n].result()


def as_lanes(scorer) -> Lanes:
    """A stage's model: Lanes as given, or one scorer as a single lane."""
    return scorer if isinstance(scorer, Lanes) else Lanes((scorer,))


@contextlib.contextmanager
def _stop_workers_on_exit(pool: ThreadPoolExecutor, futures: dict[int, Future]) -> Iterator[None]:
    """An error or Ctrl-C in the caller (or a caller that stops iterating early) drops the jobs not started and
    stops the llama.cpp calls running in the lanes, instead of waiting for them to finish."""
    try:
        yield
    except BaseException:
        if all(future.done() for future in futures.values()):
            raise  # every job finished: nothing to stop (the usual close after the last result)
        pool.shutdown(wait=False, cancel_futures=True)
        with abort_workers():
            pool.shutdown(wait=True)
        raise
