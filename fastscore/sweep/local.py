"""Shards in this process, one after another (the default on a laptop): the same runner a Ray worker uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastscore.errors import FastscoreError
from fastscore.sweep.grid import Shard
from fastscore.sweep.worker import ShardDone, ShardRunner, ShardSettings


def run_in_process(shards: Sequence[Shard], settings: ShardSettings, on_done: Callable[[ShardDone], None]) -> None:
    runner = ShardRunner(settings)
    try:
        for shard in shards:
            try:
                done = runner.run(shard)
            except FastscoreError as exc:
                exc.add_note(f"in shard {shard.key}")
                raise
            on_done(done)
    finally:
        runner.close()
