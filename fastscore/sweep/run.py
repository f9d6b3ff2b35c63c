"""Run a sweep: plan the grid, resolve each model and variant once (a model that cannot be obtained is skipped with
its reason), skip committed shards, run the rest in this process or on Ray, then summarise across models."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fastscore import provenance
from fastscore.errors import (
    ArtefactUnavailableError,
    ConversionError,
    OutputError,
    ResumeConfigError,
    UnsupportedError,
)
from fastscore.outputs import OutDirLock, write_text_atomic
from fastscore.study.data.datafile import default_data_dir
from fastscore.study.data.envs import ENVS
from fastscore.sweep import grid
from fastscore.sweep import items as sweep_items
from fastscore.sweep.grid import Shard
from fastscore.sweep.local import run_in_process
from fastscore.sweep.summary import summarise_cells, write_summary
from fastscore.sweep.worker import ShardDone, ShardSettings, committed

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
ALL = None  # limit: every usable item


@dataclass(frozen=True)
class SweepConfig:
    models: tuple[str, ...]
    variants: tuple[str, ...] = ("llamacpp:f32",)
    envs: tuple[str, ...] = ENVS
    failures: tuple[str, ...] = grid.FAILURE_SOURCES
    limit: int | None = 20  # seeded items per cell; None: all
    shard_size: int = 10
    seed: int = 0
    out_dir: Path = Path("sweep-out")
    data_dir: Path = field(default_factory=default_data_dir)
    resume: bool = False
    ray: str | None = None  # None: in process; "local": a Ray instance started for the run; else a cluster address
    workers: int | None = None  # Ray workers (default: the CPUs of the instance / threads per worker)
    threads: int | None = None  # CPU threads per worker
    max_new_tokens: int | None = None
    n_boot: int = 2000
    sandbox: str = "bwrap"
    command: str = ""
    allow_standins: bool = False  # random-weight stand-ins (NAME@standin) measure time only: run only when asked

    def settings(self) -> dict[str, Any]:
        """What decides the rows: a resumed sweep must use the same (where and how it runs may change)."""
        return {"models": list(self.models), "variants": list(self.variants), "envs": list(self.envs),
                "failures": list(self.failures), "limit": self.limit, "shard_size": self.shard_size,
                "seed": self.seed, "data_dir": str(Path(self.data_dir).resolve()),
                "max_new_tokens": self.max_new_tokens}


@dataclass(frozen=True)
class SweepOutcome:
    out_dir: Path
    n_shards: int
    n_resumed: int  # shards already committed when this invocation started
    skipped: dict[tuple[str, str], str]  # (model, variant) -> why it could not be run
    result: dict[str, Any]
    seconds: float
    files: tuple[Path, ...]


def _check_out(config: SweepConfig) -> None:
    path = Path(config.out_dir) / SWEEP_FILE
    if not path.is_file():
        return
    previous = json.loads(path.read_text())
    if not config.resume:
        raise OutputError(f"{config.out_dir} already holds a sweep: pass --resume to continue it, or choose another "
                          "--out")
    differing = sorted(k for k in set(previous) | set(config.settings()) if previous.get(k) != config.settings().get(k))
    if differing:
        raise ResumeConfigError(f"cannot resume the sweep in {config.out_dir}: "
                                + "; ".join(f"{k} was {previous.get(k)!r}, now {config.settings().get(k)!r}"
                                            for k in differing))


def _prepare(pairs: Sequence[tuple[str, str, str]], progress: bool) -> dict[tuple[str, str], str]:
    """Resolve (convert on first use) each model variant here, once: workers then find it in the cache. A model
    that cannot be obtained is skipped with the reason; an unknown name is the user's error and stops the sweep."""
    from fastscore.selection import ModelSelection

    skipped = {}
    for model, backend, quant in pairs:
        try:
            ModelSelection.resolve(model, backend, quant).artefact(progress=progress)
        except (ArtefactUnavailableError, ConversionError) as exc:
            skipped[(model, f"{backend}:{quant}")] = f"cannot be obtained here: {exc}"
            log.warning("skipping %s %s:%s: %s", model, backend, quant, exc)
    return skipped


def run_sweep(config: SweepConfig, progress: bool = False) -> SweepOutcome:
    started = time.perf_counter()
    variant_pairs = tuple(grid.parse_variant(v) for v in config.variants)
    all_cells = grid.cells(config.models, variant_pairs, config.envs, config.failures)
    from fastscore.resolve import model_source

    for model in config.models:
        if model_source(model).standin and not config.allow_standins:  # an unknown name stops here, suggested
            raise UnsupportedError(f"{model} is a random-weight stand-in (its G means nothing); pass "
                                   "--allow-stand-ins to run it anyway (the summary marks it)")
    out_dir = Path(config.out_dir).resolve()
    _check_out(config)
    with OutDirLock(out_dir):
        write_text_atomic(out_dir / SWEEP_FILE, json.dumps(config.settings(), indent=2, sort_keys=True) + "\n")
        skipped = _prepare(list(dict.fromkeys((c.model, c.backend, c.quant) for c in all_cells)), progress)
        seeded = sweep_items.prepare(out_dir, config.envs, config.seed, config.limit, Path(config.data_dir),
                                     config.resume, progress)
        counts = {env: len(items) for env, (items, _) in seeded.items()}
        shards_by_cell = {c: grid.shards_of(c, counts[c.env], config.shard_size) for c in all_cells
                          if (c.model, c.variant) not in skipped}
        shards = [s for cell_shards in shards_by_cell.values() for s in cell_shards]
        pending = [s for s in shards if committed(out_dir, s) is None]
        log.info("sweep: %d cells, %d shards, %d to run", len(all_cells), len(shards), len(pending))
        _execute(config, out_dir, shards, pending, progress)
        result = summarise_cells(out_dir, shards_by_cell, skipped, all_cells, config.seed, config.n_boot)
        meta = {"command": config.command, "seed": config.seed, "shard_size": config.shard_size,
                "limit": "all" if config.limit is None else config.limit,
                "ran_on": "in process" if config.ray is None else f"Ray ({config.ray})",
                "versions": provenance.versions()}  # the driver's; each shard's config.json records its worker's
        files = write_summary(out_dir, result, meta, _params(config.models))
    return SweepOutcome(out_dir, len(shards), len(shards) - len(pending), skipped, result,
                        time.perf_counter() - started, tuple(files))


def _execute(config: SweepConfig, out_dir: Path, shards: list[Shard], pending: list[Shard], progress: bool) -> None:
    settings = ShardSettings(out_dir=out_dir, data_dir=Path(config.data_dir).resolve(), seed=config.seed,
                             max_new_tokens=config.max_new_tokens, threads=config.threads, sandbox=config.sandbox)
    total = sum(s.size for s in shards)
    with tqdm(total=total, initial=total - sum(s.size for s in pending), desc="sweep", unit="item",
              disable=not progress) as bar:
        sizes = {s.key: s.size for s in pending}

        def on_done(done: ShardDone) -> None:
            bar.update(sizes[done.key])

        if config.ray is None:
            run_in_process(pending, settings, on_done)
            return
        from fastscore.sweep.ray_exec import run_on_ray

        threads = config.threads or 1
        workers = config.workers or max(1, (os.cpu_count() or 1) // threads)
        run_on_ray(pending, ShardSettings(**{**settings.__dict__, "threads": threads}), config.ray, workers,
                   threads, on_done)


def _params(models: Sequence[str]) -> dict[str, int | None]:
    """Parameter counts for the size plot: the registry's, else counted from a local folder's safetensors."""
    from fastscore.resolve import model_source

    out: dict[str, int | None] = {}
    for model in models:
        source = model_source(model)
        if source.local_dir is not None:
            out[model] = _count_safetensors(source.local_dir)
        else:
            out[model] = getattr(source.entry, "params", None)
    return out


def _count_safetensors(folder: Path) -> int | None:
    import numpy as np

    total = 0
    for path in Path(folder).glob("*.safetensors"):
        with open(path, "rb") as f:  # the format's header: 8-byte length, then JSON of dtypes and shapes
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(int(np.prod(t["shape"])) for k, t in header.items() if k != "__metadata__")
    return total or None
