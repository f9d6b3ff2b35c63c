"""How many study item-runs per hour this machine's arithmetic allows for the tokens a study run computed (#12).

A study run's stage table (report.md) says how many tokens the model computed in each stage; each of them costs at
least 2 x the model's non-embedding matmul parameters in FLOPs. At the machine's sgemm rate (numpy float32 matmul,
measured here at the run's thread count) that is the least time the stage could take with these tokens, so the
item-runs per hour it implies is an upper limit for any engine that computes the same tokens. The limit is loose on
purpose: it leaves out attention, the lm_head rows (one per scored or generated token) and everything outside the
model (the MBPP sandbox, rendering), each of which only adds time. What it cannot bound is an algorithm that computes
fewer tokens.

    python -m fastscore.bench.lab.study_bound RUN/seeded RUN/model [--threads T] [--json-out FILE]
"""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fastscore.bench.roofline import ModelShape, non_embedding_params

log = logging.getLogger(__name__)

TARGET_ITEM_RUNS_PER_HOUR = 1200  # issue #12


@dataclass(frozen=True)
class StageBound:
    stage: str
    tokens: int
    measured_seconds: float
    bound_seconds: float

    @property
    def fraction_of_bound(self) -> float | None:
        """bound / measured: 1.0 would be every FLOP at the sgemm rate."""
        return self.bound_seconds / self.measured_seconds if self.measured_seconds > 0 else None


@dataclass(frozen=True)
class RunBound:
    folder: str
    failures: str
    item_runs: int
    stages: tuple[StageBound, ...]
    measured_seconds: float  # every stage of the run, the model's and the rest

    @property
    def bound_seconds(self) -> float:
        return sum(s.bound_seconds for s in self.stages)

    def per_hour(self, seconds: float) -> float:
        return 3600.0 * self.item_runs / seconds if seconds > 0 else float("inf")


def flops_per_computed_token(shape: ModelShape) -> float:
    """The least FLOPs of one forward position: its matmuls outside the embedding (no attention, no lm_head)."""
    return 2.0 * non_embedding_params(shape)


def run_bound(work: dict, shape: ModelShape, sgemm_gflops: float) -> RunBound:
    """`work`: fastscore.bench.projection.study_work of one failure source's folder."""
    per_token = flops_per_computed_token(shape)
    stages = tuple(StageBound(stage, tokens or 0, seconds, (tokens or 0) * per_token / (sgemm_gflops * 1e9))
                   for stage, (seconds, tokens) in work["stages"].items())
    return RunBound(folder=work["folder"], failures=str(work.get("failures")), item_runs=sum(work["items"].values()),
                    stages=stages, measured_seconds=sum(s.measured_seconds for s in stages))


def pooled(runs: Sequence[RunBound]) -> RunBound:
    """The failure sources together: one RunBound whose stages are the sums of same-named stages."""
    names = list(dict.fromkeys(s.stage for r in runs for s in r.stages))
    stages = tuple(StageBound(name, sum(s.tokens for r in runs for s in r.stages if s.stage == name),
                              sum(s.measured_seconds for r in runs for s in r.stages if s.stage == name),
                              sum(s.bound_seconds for r in runs for s in r.stages if s.stage == name))
                   for name in names)
    return RunBound(folder=", ".join(r.folder for r in runs), failures="+".join(r.failures for r in runs),
                    item_runs=sum(r.item_runs for r in runs), stages=stages,
                    measured_seconds=sum(r.measured_seconds for r in runs))


def measure(folders: Sequence[Path], threads: int, sgemm_n: int = 2048, scratch_dir: Path | None = None) -> dict:
    """The bound of each study run folder at the sgemm rate measured now (in a worker with `threads` threads)."""
    from fastscore.bench.projection import study_work
    from fastscore.bench.roofline import shape_from_gguf
    from fastscore.bench.run import spawn
    from fastscore.errors import DataError
    from fastscore.selection import ModelSelection

    works = [study_work(Path(f)) for f in folders]
    models = {(w["model"], w["quant"]) for w in works}
    if len(models) != 1:
        raise DataError(f"the study runs must share one model and type (got {sorted(map(str, models))})")
    model, quant = models.pop()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    shape = shape_from_gguf(ModelSelection.resolve(model, "llamacpp", quant).artefact(progress=True).path)
    with tempfile.TemporaryDirectory(prefix="fastscore-study-bound-", dir=scratch_dir) as tmp:
        sgemm = spawn({"task": "sgemm", "n": sgemm_n, "repeats": 5, "threads": threads}, Path(tmp), "sgemm")
    runs = [run_bound(w, shape, sgemm["gflops"]) for w in works]
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "model": model, "quant": quant, "shape": shape.to_dict(), "threads": threads,
            "flops_per_computed_token": flops_per_computed_token(shape), "sgemm": sgemm,
            "runs": [_run_dict(r) for r in runs], "pooled": _run_dict(pooled(runs)) if len(runs) > 1 else None,
            "load_average_at_start": load_at_start, "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}


def _run_dict(run: RunBound) -> dict:
    return {"folder": run.folder, "failures": run.failures, "item_runs": run.item_runs,
            "measured_seconds": run.measured_seconds, "bound_seconds": run.bound_seconds,
            "measured_item_runs_per_hour": run.per_hour(run.measured_seconds),
            "bound_item_runs_per_hour": run.per_hour(run.bound_seconds),
            "stages": [{**asdict(s), "fraction_of_bound": s.fraction_of_bound} for s in run.stages]}


def render(result: dict) -> str:
    from fastscore.bench.table import _f, _grid

    sgemm = result["sgemm"]
    parts = [f"study bound — {result['date_utc']} — {result['model']} llama.cpp {result['quant']}: "
             f"{_f(result['flops_per_computed_token'] / 1e6)} MFLOP per computed token (2 x non-embedding matmul "
             f"parameters; attention and lm_head not counted); sgemm {_f(sgemm['gflops'], 1)} GFLOP/s at "
             f"{result['threads']} thread(s) (n = {sgemm['n']}, median of {sgemm['repeats']}); load average "
             f"{result['load_average_at_start']} -> {result['load_average_at_end']}", ""]
    runs = result["runs"] + ([result["pooled"]] if result["pooled"] else [])
    rows = [[r["failures"], s["stage"], str(s["tokens"]), _f(s["measured_seconds"], 1), _f(s["bound_seconds"], 1),
             _f(s["fraction_of_bound"], 2) if s["fraction_of_bound"] is not None else "–"]
            for r in runs for s in r["stages"] if s["tokens"]]
    parts.append(_grid(["failures", "stage", "tokens computed", "measured s", "bound s", "bound / measured"], rows))
    parts.append("")
    rows = [[r["failures"], str(r["item_runs"]), _f(r["measured_seconds"]), _f(r["bound_seconds"], 1),
             _f(r["measured_item_runs_per_hour"]), _f(r["bound_item_runs_per_hour"])] for r in runs]
    parts.append(_grid(["failures", "item-runs", "measured s (all stages)", "bound s (model stages)",
                        "item-runs/h measured", "item-runs/h at the bound"], rows))
    best = runs[-1]
    verdict = "above" if best["bound_item_runs_per_hour"] < TARGET_ITEM_RUNS_PER_HOUR else "within"
    parts.append(f"#12's target of {TARGET_ITEM_RUNS_PER_HOUR:,} item-runs/h is {verdict} what this machine's "
                 f"arithmetic allows for these runs' tokens ({_f(best['bound_item_runs_per_hour'])} item-runs/h, "
                 f"{best['failures']}); the bound leaves out attention, the lm_head and all work outside the model.")
    return "\n".join(parts)


def cli():
    """The script's command line (a click command; tests invoke it with CliRunner)."""
    import click

    from fastscore.bench.table import print_and_save
    from fastscore.exits import friendly

    @click.command()
    @click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option("--threads", default=None, type=click.IntRange(min=1), help="sgemm threads (default: all cores).")
    @click.option("--sgemm-n", default=2048, show_default=True, type=click.IntRange(min=16))
    @click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON line instead of the table.")
    @click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path))
    @friendly
    def command(folders, threads, sgemm_n, as_json, json_out):
        """Item-runs per hour the machine's sgemm rate allows for study runs' computed tokens."""
        print_and_save(measure(folders, threads or os.cpu_count() or 1, sgemm_n), json_out, render, as_json)

    return command


if __name__ == "__main__":
    cli()()
