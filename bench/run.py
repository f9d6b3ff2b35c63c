"""`fastscore bench throughput`: every configuration measured in one run, on the same requests, each in a fresh process.

Order: convert whatever is missing (never timed), build the workload once, measure the sgemm limit, score with
every backend configuration, then end to end (fastscore's best llama.cpp type and the exact types vs the transformers
reference, one request per call, and the transformers peer reusing each context's KV) and greedy decoding on the
exact default type (llama.cpp f32; the best type when f32 is not measured). Figures are derived in fastscore.bench.figures.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from fastscore.errors import BenchmarkError, UnknownQuantError
from fastscore.study.data.envs import ENVS
from fastscore.variants import VARIANTS

log = logging.getLogger(__name__)

DEFAULT_CONFIGS: tuple[tuple[str, str], ...] = tuple((v.backend, v.quant) for v in VARIANTS if v.in_bench)
# The batch-invariant configurations (fastscore's defaults are exact): their end-to-end time is what the
# transformers peers are compared with.
EXACT_CONFIGS: tuple[tuple[str, str], ...] = tuple((v.backend, v.quant) for v in VARIANTS
                                                  if v.full_precision and v.in_bench)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclass(frozen=True)
class BenchOptions:
    model: str
    data_dir: Path
    items_per_env: int = 3
    envs: tuple[str, ...] = ENVS
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    repeats: int = 3
    backends: tuple[str, ...] = ("llamacpp", "onnx")
    quants: tuple[str, ...] | None = None  # None: every type of each chosen backend
    skip_reference: bool = False
    best: str | None = None  # llama.cpp type for end to end / greedy; None: the fastest measured
    pp_tokens: int = 512
    per_request_repeats: int = 1
    per_request_limit: int | None = None  # time only the first N requests alone (None: all)
    reference_repeats: int = 1
    greedy_batches: tuple[int, ...] = (1, 8, 32)
    new_tokens: int = 32
    greedy_repeats: int = 1  # the one-at-a-time runs re-prefill every context: the slowest figure to repeat
    sgemm_n: int = 2048
    seed: int = 0
    conditions: tuple[str, ...] | None = None  # None: every study condition
    requests: Path | None = None  # a user's scoring file instead of the study's items

    def configs(self) -> list[tuple[str, str]]:
        chosen = [(b, q) for b, q in DEFAULT_CONFIGS if b in self.backends and (self.quants is None or q in self.quants)]
        if self.quants is not None:
            known = {q for _, q in DEFAULT_CONFIGS}
            unknown = [q for q in self.quants if q not in known]
            if unknown:
                raise UnknownQuantError(f"unknown bench types {unknown}; known: {', '.join(sorted(known))}")
        if not chosen:
            raise UnknownQuantError(f"no configuration matches backends={self.backends} quants={self.quants}")
        return chosen


# One cache shared by all contexts, with flash attention (the only attention path there that skips the other
# contexts' masked cells): greedy decoding's layout before one KV stream per context became the default.
UNIFIED_DECODE = {"decode_kv": "unified", "decode_flash_attn": "on"}


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({name: str(threads) for name in THREAD_VARIABLES})
    env["TQDM_DISABLE"] = "1"  # workers print nothing but errors; the parent shows progress
    return env


def start_worker(spec: dict, scratch: Path, label: str) -> subprocess.Popen:
    """Start `python -m fastscore.bench.worker` on `spec` (stderr to LABEL.stderr in scratch, so several workers can
    run at once without filling a pipe); finish_worker collects its figures."""
    spec_path = scratch / f"{label}.spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    with open(scratch / f"{label}.stderr", "w", encoding="utf-8") as err:
        return subprocess.Popen([sys.executable, "-m", "fastscore.bench.worker", str(spec_path),
                                 str(scratch / f"{label}.out.json")],
                                env=thread_env(spec["threads"]), stdout=subprocess.DEVNULL, stderr=err)


def finish_worker(proc: subprocess.Popen, scratch: Path, label: str) -> dict:
    """Wait for a started worker and return its figures (with max_rss_bytes); BenchmarkError if it failed."""
    returncode = proc.wait()
    out_path = scratch / f"{label}.out.json"
    result = json.loads(out_path.read_text(encoding="utf-8")) if out_path.is_file() else None
    if returncode != 0 or result is None or "error" in result:
        stderr = (scratch / f"{label}.stderr").read_text(encoding="utf-8", errors="replace")
        why = result["error"] if result and "error" in result else "\n".join(stderr.strip().splitlines()[-12:])
        raise BenchmarkError(f"benchmark worker {label!r} failed (exit {returncode}): {why}")
    return result


def spawn(spec: dict, scratch: Path, label: str) -> dict:
    """Run one configuration in `python -m fastscore.bench.worker` and return its figures (with max_rss_bytes)."""
    started = time.perf_counter()
    proc = start_worker(spec, scratch, label)
    try:
        result = finish_worker(proc, scratch, label)
    finally:
        if proc.poll() is None:  # interrupted while waiting: do not leave the worker running
            proc.kill()
            proc.wait()
    log.info("%s: %.1f s wall", label, time.perf_counter() - started)
    return result


def _resolve_all(model: str, configs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], object]:
    """Convert every artefact up front so no worker's time or memory includes a conversion."""
    from fastscore.selection import ModelSelection

    out = {}
    for backend, quant in tqdm(configs, desc="artefacts", unit="variant", disable=None):
        out[(backend, quant)] = ModelSelection.resolve(model, backend, quant).artefact(progress=True)
    return out


def run_bench(opts: BenchOptions, scratch_dir: Path | None = None) -> dict:
    """All raw measurements and derived figures as one JSON-safe dict (see figures.summarize)."""
    from fastscore.bench.figures import best_llamacpp_type, summarize
    from fastscore.bench.roofline import shape_from_gguf, shape_from_hf_config
    from fastscore.bench.workload import build_workload

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    configs = opts.configs()
    e2e_configs = []
    needed = list(configs)
    if not opts.skip_reference:
        needed.append(("reference", "fp32"))
    # The data is read before any conversion starts: a wrong --data fails in a second, not after minutes.
    if opts.requests is not None:
        from fastscore.bench.workload import workload_from_requests

        workload = workload_from_requests(opts.requests)
    else:
        workload = build_workload(opts.data_dir, opts.items_per_env, opts.envs, opts.seed, opts.conditions)
    artefacts = _resolve_all(opts.model, needed)
    common = {"model": opts.model, "threads": opts.threads, "repeats": opts.repeats}
    with tempfile.TemporaryDirectory(prefix="fastscore-bench-", dir=scratch_dir) as tmp:
        scratch = Path(tmp)
        (scratch / "workload.json").write_text(workload.to_json(), encoding="utf-8")
        common["workload"] = str(scratch / "workload.json")
        steps = 1 + len(configs) + len(EXACT_CONFIGS) + 1 + 2 + 2
        with tqdm(total=steps, desc="bench", unit="run", disable=None) as bar:
            def step(spec: dict, label: str) -> dict:
                bar.set_postfix_str(label)
                result = spawn({**common, **spec}, scratch, label)
                bar.update(1)
                return result

            sgemm = step({"task": "sgemm", "n": opts.sgemm_n, "repeats": max(5, opts.repeats)}, "sgemm")
            backends = {}
            for backend, quant in configs:
                backends[f"{backend}:{quant}"] = step(
                    {"task": "backend", "backend": backend, "quant": quant, "pp_tokens": opts.pp_tokens,
                     "per_request_repeats": opts.per_request_repeats, "per_request_limit": opts.per_request_limit},
                    f"backend-{backend}-{quant}")
            best = opts.best or best_llamacpp_type(backends)
            end_to_end = {}
            # fastscore end to end: the fastest llama.cpp type, then the exact types (the default llama.cpp f32,
            # ONNX fp32) whenever they were measured.
            for backend, quant in [("llamacpp", best), *EXACT_CONFIGS]:
                if quant is not None and (backend, quant) in configs and (backend, quant) not in e2e_configs:
                    e2e_configs.append((backend, quant))
            for backend, quant in e2e_configs:
                end_to_end[f"{backend}:{quant}"] = step(
                    {"task": "e2e", "backend": backend, "quant": quant, "mode": "shared"}, f"e2e-{backend}-{quant}")
            if not opts.skip_reference:
                end_to_end["reference:fp32"] = step(
                    {"task": "e2e", "backend": "reference", "quant": "fp32", "mode": "one_request_per_call",
                     "repeats": opts.reference_repeats}, "e2e-reference")
                end_to_end["reference:fp32:prefix_kv"] = step(
                    {"task": "e2e", "backend": "reference", "quant": "fp32", "mode": "prefix_kv",
                     "repeats": opts.reference_repeats}, "e2e-reference-prefix-kv")
            greedy = None
            # Greedy decoding on the study's default (exact) type when measured, else the fastest.
            greedy_type = "f32" if ("llamacpp", "f32") in configs else best
            if greedy_type is not None:
                greedy_spec = {"task": "greedy", "backend": "llamacpp", "quant": greedy_type,
                               "batch_sizes": list(opts.greedy_batches), "new_tokens": opts.new_tokens,
                               "repeats": opts.greedy_repeats}
                greedy = step(greedy_spec, f"greedy-llamacpp-{greedy_type}")
                # The previous decoding layout on the same contexts, batched only: what the default gained.
                greedy["unified"] = step({**greedy_spec, "sequential": False, "backend_options": UNIFIED_DECODE},
                                         f"greedy-llamacpp-{greedy_type}-unified")
            bar.update(steps - bar.n)
    gguf = next((a.path for (b, _), a in artefacts.items() if b == "llamacpp"), None)
    if gguf is not None:
        shape = shape_from_gguf(gguf)
    else:
        shape = shape_from_hf_config(_hf_config_dir(artefacts))
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    options["load_average_at_start"] = load_at_start  # other work on the machine skews every figure
    return summarize(options=options, workload=workload, sgemm=sgemm, backends=backends, end_to_end=end_to_end,
                     greedy=greedy, best=best, shape=shape, greedy_type=greedy_type)


def _hf_config_dir(artefacts: dict) -> Path:
    for (backend, _), artefact in artefacts.items():
        path = Path(artefact.path)
        if (path / "config.json").is_file():
            return path
    raise BenchmarkError("no artefact carries model dimensions (neither a GGUF nor a config.json)")
