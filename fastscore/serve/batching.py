"""One worker thread owns the backend; HTTP threads hand it jobs through a bounded queue.

The worker takes the first waiting job, keeps collecting the jobs that arrive within `window_s` (up to
`max_batch_items` items), and scores all jobs of a kind in ONE backend call, so their prefixes share one trie. A
job whose batch fails is retried alone, so one bad request never fails the others. A full queue refuses at once
(`ServerBusyError`): the caller answers 503 rather than letting latency grow without bound.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from fastscore.errors import FastscoreError, ServerBusyError

log = logging.getLogger(__name__)

TOKENS = "tokens"  # items are TokenRequests, scored by backend.score_tokens
SETS = "sets"  # items are CandidateSets, scored by Scorer.score_candidates


@dataclass(eq=False)
class Job:
    kind: str
    items: Sequence[Any]
    future: Future = field(default_factory=Future)


@dataclass
class BatchStats:
    """What the worker did (mutable: it accumulates): one entry per backend call, the number of jobs in it."""

    jobs_per_call: list[int] = field(default_factory=list)
    refused: int = 0


class BatchingQueue:
    def __init__(self, scorer, *, max_waiting: int = 64, window_s: float = 0.005,
                 max_batch_items: int = 1024) -> None:
        if max_waiting < 1 or max_batch_items < 1 or window_s < 0:
            raise ValueError("max_waiting and max_batch_items must be >= 1 and window_s >= 0")
        self.scorer = scorer
        self.window_s = window_s
        self.max_batch_items = max_batch_items
        self.stats = BatchStats()
        self._waiting: queue.Queue[Job | None] = queue.Queue(maxsize=max_waiting)
        self._scorers: dict[str, Callable[[list], list]] = {
            TOKENS: scorer.backend.score_tokens,
            SETS: scorer.score_candidates,
        }
        self._thread = threading.Thread(target=self._run, name="fastscore-batcher", daemon=True)
        self._thread.start()

    def submit(self, kind: str, items: Sequence[Any]) -> Future:
        """Queue a job; its future resolves to one result per item, in order (or to the job's error)."""
        if kind not in self._scorers:
            raise ValueError(f"unknown job kind {kind!r}")
        job = Job(kind, list(items))
        try:
            self._waiting.put_nowait(job)
        except queue.Full:
            self.stats.refused += 1
            raise ServerBusyError(f"the server is busy: {self._waiting.maxsize} requests are already waiting; "
                                 "retry shortly") from None
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker after the job in hand; waiting jobs fail with an error."""
        while True:
            try:
                job = self._waiting.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.set_exception(FastscoreError("the server is shutting down"))
        self._waiting.put(None)
        self._thread.join(timeout)

    # --- the worker ---

    def _run(self) -> None:
        while True:
            first = self._waiting.get()
            if first is None:
                return
            batch, stop = self._collect(first)
            # A job whose caller gave up (timed out) was cancelled: it is not scored, and no result is set on it.
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            for kind in (TOKENS, SETS):
                jobs = [job for job in batch if job.kind == kind]
                if jobs:
                    self._execute(kind, jobs)
            if stop:
                return

    def _collect(self, first: Job) -> tuple[list[Job], bool]:
        batch, n_items = [first], len(first.items)
        deadline = time.monotonic() + self.window_s
        while n_items < self.max_batch_items:
            try:
                job = self._waiting.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                return batch, True
            batch.append(job)
            n_items += len(job.items)
        return batch, False

    def _execute(self, kind: str, jobs: list[Job]) -> None:
        score = self._scorers[kind]
        try:
            results = score([item for job in jobs for item in job.items])
        except Exception as exc:  # noqa: BLE001  (each job gets its own outcome below)
            if len(jobs) == 1:
                jobs[0].future.set_exception(exc)
                return
            log.info("a batch of %d requests failed together (%s); scoring them one by one", len(jobs), exc)
            for job in jobs:
                self._execute(kind, [job])
            return
        self.stats.jobs_per_call.append(len(jobs))
        start = 0
        for job in jobs:
            job.future.set_result(results[start : start + len(job.items)])
            start += len(job.items)
