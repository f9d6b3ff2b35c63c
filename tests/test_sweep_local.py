"""The local worker pool's abort: an error or Ctrl-C in the parent interrupts the shards its workers are running.

The shard runner here is an instrumented fake (it loads no model: a shard waits until interrupted and leaves a file
saying what happened), so the test sees the pool's own behaviour in a second or two; the shards' rows under worker
processes are tested on the tiny model in tests/test_study_shards.py.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import wait
from pathlib import Path

import pytest

from fastscore.errors import DataError
from fastscore.sweep.grid import Cell, Shard
from fastscore.sweep.local import ProcessPool
from fastscore.sweep.worker import ShardSettings

SHARD_SECONDS = 300  # far longer than the test waits: a shard that ends did so because it was interrupted
CLEAN_UP_SECONDS = 1.0


class WaitingRunner:
    """A shard that waits SHARD_SECONDS, marking in `out_dir` when it started and whether it was interrupted."""

    def __init__(self, settings: ShardSettings) -> None:
        self.out_dir = settings.out_dir

    def run(self, shard: Shard):
        mark = self.out_dir / f"{shard.index}-{os.getpid()}"
        mark.with_suffix(".started").touch()
        if shard.stop - shard.start == 0:  # an empty shard: fails at once, leaving its worker idle
            raise DataError(f"shard {shard.index} has no item")
        try:
            time.sleep(SHARD_SECONDS)
        except KeyboardInterrupt:
            time.sleep(CLEAN_UP_SECONDS)  # a shard's clean-up after Ctrl-C takes a moment
            mark.with_suffix(".interrupted").touch()
            raise
        mark.with_suffix(".finished").touch()

    def close(self) -> None:
        pass


def _wait_for(out: Path, suffix: str, count: int, timeout: float) -> list[Path]:
    deadline = time.monotonic() + timeout
    while len(found := sorted(out.glob(f"*{suffix}"))) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@pytest.fixture
def sigint_ignored():
    """The parent as a shell without job control starts a background run: SIGINT ignored, inherited by workers."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_abort_interrupts_the_shards_workers_are_running_and_ends_them(tmp_path, sigint_ignored):
    settings = ShardSettings(out_dir=tmp_path, data_dir=tmp_path)
    cell = Cell(model="m", backend="llamacpp", quant="f32", env="tools", failures="seeded")
    pool = ProcessPool(settings, workers=2, runner=WaitingRunner)
    # As the run submits them: no more shards than workers (a call already queued to a worker cannot be cancelled)
    futures = [pool.submit(Shard(cell, index, index, index + 1)) for index in range(2)]
    started = _wait_for(tmp_path, ".started", 2, timeout=120)  # spawning a worker imports fastscore
    assert len(started) == 2, "both workers should be running a shard"
    processes = list(pool.executor._processes.values())
    began = time.perf_counter()
    pool.close(abort=True)
    took = time.perf_counter() - began
    print(f"close(abort=True) returned {took:.2f} s after it was called")
    assert took < 30, "abort waited for the shards instead of interrupting them"
    assert len(list(tmp_path.glob("*.interrupted"))) == 2 and not list(tmp_path.glob("*.finished"))
    assert wait(futures, timeout=0).not_done == set()
    assert all(isinstance(f.exception(), KeyboardInterrupt) for f in futures)
    assert not [p for p in processes if p.is_alive()], "a worker outlived the pool"


def test_abort_after_a_shard_failed_interrupts_the_busy_worker_and_leaves_the_idle_one_alone(tmp_path, sigint_ignored):
    """The run's error path: one shard failed (its worker is idle), the other runs. The idle worker must not die
    of the SIGINT (that breaks the pool, and the executor then kills the busy worker in its clean-up)."""
    settings = ShardSettings(out_dir=tmp_path, data_dir=tmp_path)
    cell = Cell(model="m", backend="llamacpp", quant="f32", env="tools", failures="seeded")
    pool = ProcessPool(settings, workers=2, runner=WaitingRunner)
    failing, running = pool.submit(Shard(cell, 0, 0, 0)), pool.submit(Shard(cell, 1, 1, 2))
    assert isinstance(failing.exception(timeout=120), DataError)
    assert len(_wait_for(tmp_path, ".started", 2, timeout=120)) == 2
    time.sleep(0.5)  # the failed shard's worker back in the executor's loop, waiting for work
    pool.close(abort=True)
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.interrupted")] == ["1"], "the clean-up was cut short"
    assert isinstance(running.exception(), KeyboardInterrupt)
