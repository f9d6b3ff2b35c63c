"""Run the full study as shards into a results folder that lives in git: resume from what is committed, stop between
shards when the session's time is up, refuse to mix in rows that the running code does not reproduce.

Each shard runs with the study's own runner (through the sweep's shard worker) in `<run>/.scratch/` (git-ignored;
a shard killed half way resumes there on the same machine), then its rows are written as Parquet under
`<run>/rows/` and recorded in manifest.json. Only then is the shard done: a later invocation, on any machine,
skips it.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastscore.errors import DataError, OutputError, ReproductionError
from fastscore.outputs import LOCK_FILE, HOLDER_FILE, OutDirLock, write_text_atomic
from fastscore.registry import default_model
from fastscore.study.data.datafile import default_data_dir
from fastscore.study.data.envs import ENVS
from fastscore.study.runner import BOTH, FAILURE_SOURCES, StudyConfig, check_config
from fastscore.study.shards import manifest as manifests
from fastscore.study.shards.manifest import Manifest, sha256_file
from fastscore.study.shards.plan import ShardSpec, ensure_plan, partition
from fastscore.study.shards.rescore import rescore, sample
from fastscore.jsonl import read_jsonl
from fastscore.study.shards.rowfiles import write_rows

log = logging.getLogger(__name__)

SCRATCH_DIR = ".scratch"
PRODUCER_FILE = "producer.json"  # in the scratch folder: whose half-done shard it holds
GITIGNORE = f"{SCRATCH_DIR}/\n{LOCK_FILE}\n{HOLDER_FILE}\n"
SAFETY = 1.2  # a shard starts only if this many times its expected seconds still fit in --max-hours


@dataclass(frozen=True)
class ShardRunConfig:
    out_dir: Path
    data_dir: Path = field(default_factory=default_data_dir)
    shard_items: int = 50  # seeded positions per shard (about 13 minutes of the 135M model's default study here)
    max_hours: float | None = None  # start no shard that would not end within this many hours of the start
    max_shards: int | None = None  # run at most this many shards in this invocation
    commit: bool = False  # `git add` + `git commit` the run folder after each shard
    model: str = field(default_factory=default_model)
    envs: tuple[str, ...] = ENVS
    sources: tuple[str, ...] = FAILURE_SOURCES
    seed: int = 0
    max_new_tokens: int | None = None
    threads: int | None = None
    sandbox: str = "bwrap"
    check_items: int = 2  # committed items a new producer re-scores before it may add shards
    # Run only these sources' shards in this invocation (None: all of the run's). The plan and the settings keep
    # every source of the run: a source whose rows the code does not define yet can wait without a new run folder.
    only_sources: tuple[str, ...] | None = None
    # Shards run at once, each in its own process (1: in this process). Each worker gets `threads` threads, by
    # default this machine's cores shared out among the workers.
    workers: int = 1

    def worker_threads(self) -> int | None:
        if self.threads is not None or self.workers == 1:
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.workers)

    def study(self) -> StudyConfig:
        """The study each shard is a window of: `fastscore study --limit all` with default settings."""
        failures = BOTH if set(self.sources) == set(FAILURE_SOURCES) else self.sources[0]
        return StudyConfig(model=self.model, envs=self.envs, limit=None, seed=self.seed, failures=failures,
                           out_dir=self.out_dir, data_dir=self.data_dir, max_new_tokens=self.max_new_tokens,
                           threads=self.threads, sandbox=self.sandbox)

    def settings(self) -> dict[str, Any]:
        """What decides the rows (as `fastscore study` records it, but where the data lies): resumes must match."""
        study = {k: v for k, v in self.study().result_settings().items() if k not in ("data_dir", "limit", "window")}
        return {**study, "sources": list(self.sources), "shard_items": self.shard_items,
                "max_new_tokens_option": self.max_new_tokens}


def config_from_manifest(manifest: Manifest, out_dir: Path, data_dir: Path | None = None, **options
                         ) -> ShardRunConfig:
    """The run a manifest was made by (`options`: how to run it here: threads, sandbox...)."""
    s = manifest.settings
    return ShardRunConfig(out_dir=Path(out_dir), data_dir=Path(data_dir or default_data_dir()),
                          shard_items=s["shard_items"], model=s["model"], envs=tuple(s["envs"]),
                          sources=tuple(s["sources"]), seed=s["seed"], max_new_tokens=s["max_new_tokens_option"],
                          **options)


@dataclass(frozen=True)
class ShardRunOutcome:
    out_dir: Path
    ran: tuple[str, ...]  # shards finished by this invocation
    n_done: int  # shards in the manifest now
    n_total: int
    stopped: str  # why this invocation ended
    seconds: float
    check: dict[str, Any] | None = None  # the mixing check this invocation made, if any
    commit_commands: tuple[str, ...] = ()  # what commits the new shards (empty with --commit)


def _utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _expected_seconds(manifest: Manifest, spec: ShardSpec, threads: int | None = None) -> float:
    """The mean seconds of the committed shards of this kind, of those run with these threads where there are any
    (a shard on 1 thread takes about 1.6x one on 2)."""
    alike = [s for s in manifest.shards.values() if (s["source"], s["env"]) == (spec.source, spec.env)]
    alike = [s for s in alike if s.get("threads") == threads] or alike
    return sum(s["seconds"] for s in alike) / len(alike) if alike else 0.0


def _git(out_dir: Path, *args: str) -> None:
    done = subprocess.run(["git", "-C", str(out_dir), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise OutputError(f"git {' '.join(args[:1])} in {out_dir} failed: {(done.stderr or done.stdout).strip()} "
                          "(the finished shards are on disk; commit them by hand)")


def commit_message(out_dir: Path, ran: list[str]) -> str:
    return f"{out_dir.name}: study shard{'s' if len(ran) > 1 else ''} {', '.join(ran)}"


def commit_commands(out_dir: Path, ran: list[str]) -> tuple[str, ...]:
    try:
        shown = str(out_dir.relative_to(Path.cwd()))
    except ValueError:
        shown = str(out_dir)
    return (f"git add -- {shlex.quote(shown)}",
            f"git commit -m {shlex.quote(commit_message(out_dir, ran))} -- {shlex.quote(shown)}")


def _store_shard(out_dir: Path, spec: ShardSpec, scratch_shard: Path) -> dict[str, dict[str, Any]]:
    """Every JSONL file of the finished scratch shard as one Parquet file under rows/, with its hash."""
    folder = spec.folder(out_dir)
    files = {}
    for path in sorted(scratch_shard.glob("*.jsonl")):
        target = folder / f"{path.stem}.parquet"
        records = read_jsonl(path)
        write_rows(target, records)
        files[path.stem] = {"file": target.relative_to(out_dir).as_posix(), "sha256": sha256_file(target),
                            "n": len(records)}
    return files


def _clear_foreign_scratch(scratch: Path, producer_key: str) -> None:
    """Half-done shards of another producer must not be finished by this one."""
    marker = scratch / PRODUCER_FILE
    if scratch.exists() and (not marker.is_file() or json.loads(marker.read_text())["key"] != producer_key):
        log.info("discarding the half-done shards in %s (made by other code, weights or machine)", scratch)
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    write_text_atomic(marker, json.dumps({"key": producer_key}) + "\n")


def run_shards(config: ShardRunConfig, progress: bool = False,
               say: Callable[[str], None] = lambda line: log.info("%s", line)) -> ShardRunOutcome:
    started = time.perf_counter()
    unknown = [s for s in config.sources if s not in FAILURE_SOURCES]
    if unknown or not config.sources:
        raise DataError(f"unknown failure source(s) {unknown or config.sources}: choose from "
                        f"{', '.join(FAILURE_SOURCES)}")
    if config.only_sources is not None and (not config.only_sources or set(config.only_sources) - set(config.sources)):
        raise DataError(f"--only {','.join(config.only_sources)}: choose among the run's failure sources "
                        f"({', '.join(config.sources)})")
    check_config(config.study())
    out_dir = Path(config.out_dir).resolve()
    with OutDirLock(out_dir):
        if not (out_dir / ".gitignore").is_file():
            write_text_atomic(out_dir / ".gitignore", GITIGNORE)
        manifest = Manifest.open(out_dir, config.settings())
        manifest.save()
        plans = ensure_plan(out_dir, manifest, config.envs, config.seed, config.data_dir, progress)
        specs = partition({env: len(plans[env][0]) for env in config.envs}, config.sources, config.shard_items)
        pending = [s for s in specs if s.key not in manifest.shards
                   and (config.only_sources is None or s.source in config.only_sources)]
        study = config.study()
        model = manifests.model_record(study.model, study.backend, study.quant)
        producer = manifests.producer(model)
        key = manifests.producer_key(producer)
        manifest.record.setdefault("producers", {})[key] = producer
        check = None
        if pending and manifest.shards and key not in manifest.trusted_producers():
            check = _check_mixing(out_dir, manifest, plans, config, key)
        scratch = out_dir / SCRATCH_DIR
        _clear_foreign_scratch(scratch, key)
        ran: list[str] = []
        stopped = ("every shard of the plan is done" if config.only_sources is None
                   else f"every shard of {', '.join(config.only_sources)} is done")
        from fastscore.sweep import items as sweep_items
        from fastscore.sweep.local import InProcessPool, ProcessPool
        from fastscore.sweep.worker import ShardSettings, shard_dir

        for env in config.envs:
            sweep_items.save(scratch, {"env": env, "seed": config.seed}, plans[env])
        settings = ShardSettings(out_dir=scratch, data_dir=Path(config.data_dir).resolve(), seed=config.seed,
                                 max_new_tokens=config.max_new_tokens, threads=config.worker_threads(),
                                 sandbox=config.sandbox)
        pool = InProcessPool(settings) if config.workers == 1 else ProcessPool(settings, config.workers)
        queue, running, too_long = deque(pending), {}, []
        finished = max_shards_reached = False
        try:
            while True:
                while queue and len(running) < config.workers:
                    if config.max_shards is not None and len(ran) + len(running) >= config.max_shards:
                        stopped = f"--max-shards {config.max_shards} reached"
                        max_shards_reached = True
                        queue.clear()
                        break
                    spec = queue.popleft()
                    elapsed = time.perf_counter() - started
                    expected = _expected_seconds(manifest, spec, settings.threads)
                    if config.max_hours is not None and elapsed + SAFETY * expected > config.max_hours * 3600:
                        # Skipped for good (the time left only shrinks), but a shorter shard later in the queue may
                        # still fit: a long model/mbpp shard does not keep the short ones from the session's end.
                        too_long.append(f"{spec.key} (about {expected:.0f} s)")
                        continue
                    say(f"shard {spec.key}: seeded positions {spec.start}-{spec.stop - 1} ...")
                    shard = spec.sweep_shard(study.model, study.backend, study.quant)
                    running[pool.submit(shard)] = (spec, shard, _utc())
                if not running:
                    break
                complete, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(complete, key=lambda f: running[f][0].key):
                    spec, shard, began = running.pop(future)
                    done = future.result()
                    files = _store_shard(out_dir, spec, shard_dir(scratch, shard))
                    provenance = json.loads((shard_dir(scratch, shard) / "config.json").read_text()).get("provenance")
                    manifest.shards[spec.key] = {
                        "source": spec.source, "env": spec.env, "index": spec.index, "start": spec.start,
                        "stop": spec.stop, "n_items": done.n_items, "n_item_errors": done.n_item_errors,
                        "seconds": done.seconds, "stage_seconds": done.stage_seconds, "started_utc": began,
                        "finished_utc": _utc(), "commit": producer["code"]["commit"],
                        "dirty": producer["code"]["dirty"], "model_sha256": model["sha256"],
                        "weights_note": model["weights_note"], "machine": producer["machine"], "producer_key": key,
                        "threads": settings.threads, "workers": config.workers,
                        "provenance": provenance, "files": files}
                    manifest.save()
                    shutil.rmtree(shard_dir(scratch, shard))
                    ran.append(spec.key)
                    say(f"shard {spec.key}: {done.n_items} items in {done.seconds:.0f} s "
                        f"({len(manifest.shards)}/{len(specs)} shards done)")
                    if config.commit:
                        _git(out_dir, "add", "--", ".")
                        _git(out_dir, "commit", "-q", "-m", commit_message(out_dir, [spec.key]), "--", ".")
            if too_long and not max_shards_reached:
                stopped = (f"--max-hours {config.max_hours}: {len(too_long)} shard(s) would not end in time, "
                           f"first {too_long[0]}")
            finished = True
        finally:
            pool.close(abort=not finished)
    commands = commit_commands(out_dir, ran) if ran and not config.commit else ()
    return ShardRunOutcome(out_dir, tuple(ran), len(manifest.shards), len(specs), stopped,
                           time.perf_counter() - started, check, commands)


def _check_mixing(out_dir: Path, manifest: Manifest, plans, config: ShardRunConfig, key: str) -> dict[str, Any]:
    """Before a new producer adds shards: it must reproduce committed items of the others (checked, not trusted)."""
    picks = sample(out_dir, manifest, config.check_items, config.seed)
    log.info("new code, libraries, weights or machine: re-scoring %d committed item(s) first", len(picks))
    comparison = rescore(out_dir, manifest, picks, plans, config.data_dir, config.threads, config.sandbox)
    record = {"producer_key": key, "utc": _utc(), **comparison.to_dict()}
    if not comparison.passed:
        raise ReproductionError(
            f"refusing to add shards to {out_dir}: the running code does not reproduce its committed rows "
            f"(re-scored {', '.join(comparison.items)}):\n" + "\n".join(comparison.lines())
            + "\nRun the code that made them (see manifest.json) or start a new run folder.")
    manifest.record["checks"].append(record)
    manifest.save()
    return record
