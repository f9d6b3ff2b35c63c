"""One benchmark configuration in a fresh process, so its peak RSS (ru_maxrss) is its own.

    python -m fastscore.bench.worker SPEC.json OUT.json

SPEC: {"task": "sgemm" | "backend" | "rates" | "e2e" | "greedy" | "convert" | "MODULE:FUNCTION", "model", "backend",
"quant", "threads", "repeats", "workload": path, "backend_options" (optional: fields of the backend's options record), ...task options}.
A "MODULE:FUNCTION" task (an investigation of fastscore.bench.lab) is that function called on the spec: the worker
names no investigation, so the product's import graph holds none.
The parent sets the BLAS/OpenMP thread variables in this process's environment before numpy loads. OUT gets the task's figures plus "max_rss_bytes" (this process or any subprocess it
waited for, e.g. llama.cpp's converter) and "cpu_seconds" (user + system, both).
"""

from __future__ import annotations

import importlib
import json
import logging
import resource
import sys
from pathlib import Path


def run_spec(spec: dict) -> dict:
    task = spec["task"]
    if task == "convert":
        from fastscore.conversion.pipeline import convert

        kind, _, quant = spec["variant"].partition("-")
        results = convert(spec["model"], gguf=[quant] if kind == "gguf" else [],
                          onnx=[quant] if kind == "onnx" else [], progress=False, force=spec.get("force", False))
        check = results[-1].check
        return {"variant": spec["variant"], "status": results[-1].status, "path": str(results[-1].path),
                "check": check.line() if check else None, "check_passed": check.passed if check else None}
    if task == "sgemm":
        from fastscore.bench.roofline import measure_sgemm

        return measure_sgemm(spec.get("n", 2048), spec["repeats"])
    if ":" in task:  # a lab measurement (random-token contexts, or backends of its own): no workload here
        module, _, function = task.partition(":")
        return getattr(importlib.import_module(module), function)(spec)

    from fastscore.bench import measure
    from fastscore.bench.workload import Workload
    from fastscore.backends.options import options_for
    from fastscore.selection import ModelSelection

    workload = Workload.from_json(Path(spec["workload"]).read_text(encoding="utf-8"))
    options = options_for(spec["backend"], spec["backend_options"]) if spec.get("backend_options") else None
    selection = ModelSelection.resolve(spec["model"], spec["backend"], spec["quant"], threads=spec["threads"],
                                       backend_options=options)
    with selection.open() as scorer:
        if task == "backend":
            return measure.measure_backend(scorer, workload, spec["repeats"], spec.get("pp_tokens", 512),
                                           spec.get("per_request_repeats", 1), spec.get("per_request_limit"))
        if task == "rates":
            return measure.measure_rates(scorer, workload, spec["repeats"], spec.get("pp_tokens", 512))
        if task == "e2e":
            return measure.measure_end_to_end(scorer, workload, spec["repeats"], spec["mode"])
        if task == "greedy":
            return measure.measure_greedy(scorer, workload, spec["batch_sizes"], spec["new_tokens"], spec["repeats"],
                                          spec.get("sequential", True))
    raise ValueError(f"unknown benchmark task {task!r}")


def max_rss_bytes() -> int:
    # Linux reports ru_maxrss in KiB (macOS in bytes).
    scale = 1 if sys.platform == "darwin" else 1024
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return int(max(own.ru_maxrss, children.ru_maxrss) * scale)


def cpu_seconds() -> float:
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m fastscore.bench.worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    from fastscore.errors import FastscoreError

    try:
        result = run_spec(spec)
        if spec.get("backend") == "llamacpp":
            from fastscore.bench.llamacpp_build import llamacpp_build

            result["llamacpp_build"] = llamacpp_build()  # which build (e.g. with a BLAS backend) made these figures
    except FastscoreError as exc:  # handed to the parent, which re-raises it as a typed BenchmarkError
        Path(argv[1]).write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), encoding="utf-8")
        return 1
    result["max_rss_bytes"] = max_rss_bytes()
    result["cpu_seconds"] = cpu_seconds()
    Path(argv[1]).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
