"""`fastscore bench scale`: conversion and scoring at real size, per registry model, resumable step by step.

Each model is the embedded 135M (real weights) or the random-weight stand-in of a registry checkpoint with its exact
config (`NAME@standin`, fastscore.conversion.standin). Per model, every step runs in its own process
(`python -m fastscore.bench.worker`), so its wall time, CPU time and peak RSS (that process and the subprocesses it
waited for, e.g. llama.cpp's converter) are its own:

- conversion: the fp32 HF folder (for a stand-in: building it), GGUF f32 f16 q8_0 q4_k_m, ONNX fp32 int8, each read
  back and checked by the pipeline (forced, so it is timed; a recorded step is never redone);
- scoring per backend/type: pp512 and shared scoring of the bench workload (unique and computed tok/s), peak RSS;
- greedy decoding per type: B contexts in one batch (decode-phase tok/s, and with the contexts' prefill).

Results go to OUT/<model>.json after every step (atomically), with the load average before and after each step, so
an interrupted run continues where it stopped and a rerun measures only what is missing.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from fastscore import cache as artefact_cache
from fastscore.conversion import standin
from fastscore.errors import BenchmarkError
from fastscore.variants import variant_name

log = logging.getLogger(__name__)

# The embedded model (real weights) first, then the stand-ins in order of size.
DEFAULT_MODELS = ("smollm2-135m-instruct", "smollm2-360m-instruct@standin", "qwen2.5-0.5b-instruct@standin",
                  "qwen3-0.6b@standin", "llama-3.2-1b-instruct@standin", "smollm2-1.7b-instruct@standin")
CONVERSIONS = ("hf-fp32", "gguf-f32", "gguf-f16", "gguf-q8_0", "gguf-q4_k_m", "onnx-fp32", "onnx-int8")
SCORING = (("llamacpp", "f32"), ("llamacpp", "f16"), ("llamacpp", "q8_0"), ("llamacpp", "q4_k_m"),
           ("onnx", "fp32"), ("onnx", "int8"))


@dataclass(frozen=True)
class ScaleOptions:
    out_dir: Path
    data_dir: Path
    models: tuple[str, ...] = DEFAULT_MODELS
    items_per_env: int = 1
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    repeats: int = 2
    pp_tokens: int = 512
    greedy_batch: int = 8
    new_tokens: int = 32
    skip: tuple[str, ...] = ()  # steps to leave out this time, e.g. "onnx-int8", "score", "greedy-onnx-int8"
    prune: bool = False  # delete a stand-in's cached artefacts once the recorded steps no longer need them (disk)
    seed: int = 0


def step_name(kind: str, backend: str, quant: str) -> str:
    """e.g. "score-gguf-q8_0": the kind of step, then the variant's cache folder name."""
    return f"{kind}-{variant_name(backend, quant)}"


def step_names() -> list[str]:
    names = [f"convert-{v}" for v in CONVERSIONS]
    names += [step_name("score", b, q) for b, q in SCORING]
    names += [step_name("greedy", b, q) for b, q in SCORING]
    return names


def _skipped(step: str, skip: Sequence[str]) -> bool:
    """`skip` names steps ("score-onnx-int8"), kinds ("score"), variants ("gguf-f16") or formats ("onnx")."""
    parts = step.split("-")
    return any(s in ("-".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))
               for s in skip)


def results_path(out_dir: Path, model: str) -> Path:
    return Path(out_dir) / f"{model.replace('@', '.').replace('/', '_')}.json"


def load_results(out_dir: Path, model: str) -> dict:
    path = results_path(out_dir, model)
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"model": model, "label": standin.label(model), "standin": standin.is_standin(model), "steps": {}}


def _record(out_dir: Path, model: str, update: Callable[[dict], None]) -> dict:
    """Apply `update` to the model's results file as it is now and save it, under a lock: two runs (say one
    converting, one measuring) may record steps of the same model side by side without losing each other's."""
    path = results_path(out_dir, model)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load_results(out_dir, model)
        update(results)
        tmp = path.with_suffix(".json.part")
        tmp.write_text(json.dumps(results, indent=2), encoding="utf-8")
        os.replace(tmp, path)
    return results


def _spec(step: str, model: str, opts: ScaleOptions, workload: Path) -> dict:
    kind, _, rest = step.partition("-")
    common = {"model": model, "threads": opts.threads, "repeats": opts.repeats, "workload": str(workload)}
    if kind == "convert":
        return {**common, "task": "convert", "variant": rest, "force": True}
    backend, quant = next((b, q) for b, q in SCORING if variant_name(b, q) == rest)
    if kind == "score":
        return {**common, "task": "rates", "backend": backend, "quant": quant, "pp_tokens": opts.pp_tokens}
    return {**common, "task": "greedy", "backend": backend, "quant": quant, "batch_sizes": [opts.greedy_batch],
            "new_tokens": opts.new_tokens, "repeats": 1, "sequential": False}


def _converted(model: str, step: str) -> bool:
    """Whether a scoring step's artefacts are all built: a measurement never includes a conversion."""
    from fastscore.conversion.pipeline import missing_variants
    from fastscore.resolve import model_source

    variant = step.partition("-")[2]
    backend, quant = next((b, q) for b, q in SCORING if variant_name(b, q) == variant)
    return not missing_variants(model_source(model), backend, quant)


def artefact_sizes(model: str) -> dict[str, int]:
    """Bytes on disk of each cached variant of `model`."""
    from fastscore.resolve import model_source

    folder = artefact_cache.home() / model_source(model).key
    sizes = {}
    for variant in CONVERSIONS:
        path = folder / variant
        if path.is_dir():
            sizes[variant] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return sizes


def run_model(model: str, opts: ScaleOptions, workload: Path, scratch: Path,
              on_step: Callable[[str], None] = lambda step: None) -> dict:
    """Every step of `model` not yet recorded in its results file; the results dict as saved."""
    from fastscore.bench.run import spawn

    for step in step_names():
        on_step(step)
        if step in load_results(opts.out_dir, model)["steps"]:
            continue
        if _skipped(step, opts.skip):  # not recorded: a later run without --skip measures it
            continue
        if not step.startswith("convert-") and not _converted(model, step):
            log.info("%s %s: not converted yet (its convert step comes first); left for a later run", model, step)
            continue
        load_before = [round(x, 2) for x in os.getloadavg()]
        started = time.perf_counter()
        try:
            figures = spawn(_spec(step, model, opts, workload), scratch, f"{Path(results_path(opts.out_dir, model)).stem}-{step}")
        except BenchmarkError as exc:  # recorded, so the table says why the cell is empty; other steps go on
            log.warning("%s %s failed: %s", model, step, exc)
            figures = {"error": str(exc)}
        figures["wall_seconds"] = time.perf_counter() - started
        figures["load_average_before"] = load_before
        figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        figures["nice"] = os.nice(0)
        figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if step.startswith("convert-") and "error" not in figures:
            figures["bytes"] = artefact_sizes(model).get(step.removeprefix("convert-"))
        _record(opts.out_dir, model, lambda results: results["steps"].__setitem__(step, figures))
    sizes = artefact_sizes(model)
    results = _record(opts.out_dir, model, lambda results: results.setdefault("artefact_bytes", {}).update(sizes))
    if opts.prune and standin.is_standin(model):
        _prune(model, results, opts.skip)
    return results


def _prune(model: str, results: dict, skip: Sequence[str]) -> None:
    """Delete the stand-in's variants no step of this run still needs: a format's files once all its steps not
    skipped are recorded (quantised GGUFs are made from the f32 one, int8 ONNX from the fp32 export), everything
    once every step is."""
    from fastscore.resolve import model_source

    folder = artefact_cache.home() / model_source(model).key
    done = set(results["steps"])
    if done >= set(step_names()):
        shutil.rmtree(folder, ignore_errors=True)
        log.info("pruned every cached artefact of %s", model)
        return
    for kind in ("gguf", "onnx"):
        needed = [s for s in step_names() if f"-{kind}-" in s and not _skipped(s, skip)]
        if done >= set(needed):
            for variant in CONVERSIONS:
                if variant.startswith(f"{kind}-"):
                    shutil.rmtree(folder / variant, ignore_errors=True)
            log.info("pruned the %s artefacts of %s", kind, model)


def run_scale(opts: ScaleOptions) -> list[dict]:
    """All models' results (each also in OUT/<model>.json) and the workload they were measured on."""
    from fastscore.bench.workload import build_workload

    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workload_file = out_dir / "workload.json"
    if not workload_file.is_file():  # one workload for every model and every rerun: the rates stay comparable
        workload = build_workload(opts.data_dir, opts.items_per_env, seed=opts.seed)
        workload_file.write_text(workload.to_json(), encoding="utf-8")
    if not {"convert", "score", "greedy"} <= set(opts.skip):  # a run that only prints the tables measured nothing
        (out_dir / "options.json").write_text(json.dumps(
            {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}, indent=2), encoding="utf-8")
    steps = step_names()
    out = []
    with tempfile.TemporaryDirectory(prefix="fastscore-scale-") as tmp, \
            tqdm(total=len(steps) * len(opts.models), desc="bench scale", unit="step", disable=None) as bar:
        for model in opts.models:
            def on_step(step: str, model: str = model) -> None:
                bar.set_postfix_str(f"{model} {step}")
                bar.update(1)

            out.append(run_model(model, opts, workload_file, Path(tmp), on_step))
    return out
