"""Run one shard: the study's own runner on the shard's item window, with a scorer kept open across shards.

A shard is committed atomically: it runs in `<shard>.partial/` (resumed item by item if a killed run left one) and
becomes `<shard>/` by one rename once its rows and its `shard.json` are written, so a shard folder is either complete
or absent.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastscore.errors import SweepError
from fastscore.outputs import write_text_atomic
from fastscore.sweep.grid import Cell, Shard

log = logging.getLogger(__name__)

DONE_FILE = "shard.json"


@dataclass(frozen=True)
class ShardSettings:
    """What every shard of a sweep shares (picklable: Ray ships it to the workers)."""

    out_dir: Path
    data_dir: Path
    seed: int = 0
    max_new_tokens: int | None = None
    threads: int | None = None
    sandbox: str = "bwrap"


@dataclass(frozen=True)
class ShardDone:
    key: str
    n_items: int
    n_item_errors: int
    seconds: float
    worker: str  # "pid@host" of the process that ran it
    stage_seconds: dict[str, float] = field(default_factory=dict)  # this run's stages (empty: resumed as committed)

    @classmethod
    def from_dict(cls, raw: dict) -> ShardDone:
        return cls(**{k: raw[k] for k in ("key", "n_items", "n_item_errors", "seconds", "worker")},
                   stage_seconds=raw.get("stage_seconds", {}))


def shard_dir(out_dir: Path, shard: Shard) -> Path:
    return Path(out_dir) / "cells" / shard.key


def committed(out_dir: Path, shard: Shard) -> ShardDone | None:
    path = shard_dir(out_dir, shard) / DONE_FILE
    return ShardDone.from_dict(json.loads(path.read_text())) if path.is_file() else None


class ShardRunner:
    """Runs shards one after another; consecutive shards of the same model and variant share one loaded scorer."""

    def __init__(self, settings: ShardSettings) -> None:
        self.settings = settings
        self._open: tuple[tuple[str, str, str], object] | None = None
        self._seeded: dict[str, object] = {}  # env -> its seeded items, read once from the sweep folder

    def run(self, shard: Shard) -> ShardDone:
        done = committed(self.settings.out_dir, shard)
        if done is not None:
            return done
        from fastscore.study.runner import StudyConfig, run_study

        started = time.perf_counter()
        final = shard_dir(self.settings.out_dir, shard)
        partial = final.with_name(final.name + ".partial")
        cell = shard.cell
        config = StudyConfig(
            model=cell.model, backend=cell.backend, quant=cell.quant, envs=(cell.env,), limit=shard.size,
            seed=self.settings.seed, failures=cell.failures, out_dir=partial, data_dir=self.settings.data_dir,
            resume=(partial / "config.json").is_file(), max_new_tokens=self.settings.max_new_tokens,
            threads=self.settings.threads, sandbox=self.settings.sandbox, window=(shard.start, shard.stop),
        )  # fmt: skip
        outcome = run_study(config, scorer=self._scorer(cell), report=False, items={cell.env: self._items(cell.env)})
        record = ShardDone(shard.key, sum(outcome.n_items.values()), outcome.n_item_errors,
                           round(time.perf_counter() - started, 3), f"{os.getpid()}@{socket.gethostname()}",
                           {stage: round(seconds, 3) for stage, seconds in outcome.stage_seconds.items()})
        write_text_atomic(partial / DONE_FILE, json.dumps({**asdict(record), "shard": shard.to_dict()}, indent=2))
        os.replace(partial, final)  # the commit: one rename of the whole folder
        log.info("shard %s: %d items in %.1f s", shard.key, record.n_items, record.seconds)
        return record

    def _items(self, env: str):
        """The environment's seeded items as the driver built and stored them (the shard's window is cut from them)."""
        if env not in self._seeded:
            from fastscore.sweep import items

            stored = items.read(self.settings.out_dir, env)
            if stored is None:
                raise SweepError(f"no stored seeded items for {env} in {self.settings.out_dir}: the sweep's driver "
                                 "builds them before any shard runs")
            self._seeded[env] = stored
        return self._seeded[env]

    def _scorer(self, cell: Cell):
        wanted = (cell.model, cell.backend, cell.quant)
        if self._open is not None and self._open[0] == wanted:
            return self._open[1]
        self.close()
        from fastscore.selection import ModelSelection

        scorer = ModelSelection.resolve(cell.model, cell.backend, cell.quant, threads=self.settings.threads).open()
        self._open = (wanted, scorer)
        return scorer

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None
