"""Shards on this machine without Ray: in this process one after another (the default on a laptop), or in a few
worker processes at once. The same runner a Ray worker uses."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from fastscore.errors import FastscoreError
from fastscore.sweep.grid import Shard
from fastscore.sweep.worker import ShardDone, ShardRunner, ShardSettings


def run_in_process(shards: Sequence[Shard], settings: ShardSettings, on_done: Callable[[ShardDone], None]) -> None:
    pool = InProcessPool(settings)
    try:
        for shard in shards:
            on_done(pool.submit(shard).result())
    finally:
        pool.close()


def _run_shard(runner: ShardRunner, shard: Shard) -> ShardDone:
    try:
        return runner.run(shard)
    except FastscoreError as exc:
        exc.add_note(f"in shard {shard.key}")
        raise


class InProcessPool:
    """Runs a shard when it is submitted, in the calling (main) thread, so Ctrl-C aborts a decode promptly."""

    def __init__(self, settings: ShardSettings) -> None:
        self.runner = ShardRunner(settings)

    def submit(self, shard: Shard) -> Future:
        future: Future = Future()
        future.set_result(_run_shard(self.runner, shard))
        return future

    def close(self, abort: bool = False) -> None:
        self.runner.close()


_worker_runner: ShardRunner | None = None  # one per worker process: its model stays loaded across shards


def _start_worker(settings: ShardSettings, runner: Callable[[ShardSettings], ShardRunner]) -> None:
    global _worker_runner
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # idle: see _run_in_worker
    _worker_runner = runner(settings)


def _run_in_worker(shard: Shard) -> ShardDone:
    # The parent interrupts the shards with SIGINT (ProcessPool.close(abort=True)), as Ctrl-C does. While a shard
    # runs, SIGINT raises KeyboardInterrupt (Python's own handler, which also lets a long llama_decode abort): set
    # here because a run started in the background by a shell without job control passes SIGINT on ignored. While
    # idle, a worker ignores it: a KeyboardInterrupt in the executor's own loop would end the worker, break the pool
    # and have the executor kill the other workers in the middle of their shards' clean-up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run_shard(_worker_runner, shard)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessPool:
    """Shards in `workers` processes at once, each keeping its model loaded.

    On 2 cores two 1-thread processes did 1.94x the item-runs per hour of one, one 2-thread process 1.62x
    (docs/performance.md): a decode's threads wait on each other, separate processes do not. A shard killed half way
    resumes from its `.partial` folder like one run in process.
    """

    def __init__(self, settings: ShardSettings, workers: int,
                 runner: Callable[[ShardSettings], ShardRunner] = ShardRunner) -> None:
        # spawn, not fork: the parent may hold llama.cpp or torch thread pools, which a fork does not copy safely.
        # `runner` is made once in each worker (picklable by reference: a module-level class or function).
        self.executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_start_worker, initargs=(settings, runner))

    def submit(self, shard: Shard) -> Future:
        return self.executor.submit(_run_in_worker, shard)

    def close(self, abort: bool = False) -> None:
        """Wait for the workers; with abort, first interrupt their shards (kept half done in `.partial` folders)."""
        if abort:
            # The executor has no public way to interrupt a running call (3.14's terminate_workers sends SIGTERM,
            # which skips the shard's own clean-up); tests/test_sweep_local.py fails if `_processes` goes away.
            for process in list((getattr(self.executor, "_processes", None) or {}).values()):
                if process.is_alive():
                    os.kill(process.pid, signal.SIGINT)
        self.executor.shutdown(wait=True, cancel_futures=True)
