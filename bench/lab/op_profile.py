"""Where llama.cpp's time goes, op by op (issue #12): a per-node profile of shared scoring of the workload of
`fastscore bench throughput` and of batched greedy decoding steps, set against the FLOP roofline.

One worker process (BLAS/OpenMP threads set as in `fastscore bench throughput`) measures the sgemm limit, then runs
the same work twice on the same GGUF and options, from the weights file the product computes from (on f32 the
compact file, unless `--backend-option compact_weights=false`): on a plain backend, timed only around llama_decode
(the unprofiled figures), and on a backend whose contexts carry ggml's scheduler eval callback, which times every
graph node (fastscore.bench.lab.op_capture: a subclass of the product's backend whose llama.cpp calls go through a
wrapper that sets the callback; the backend itself has no profiling code). The work is the product's paths:
`score_tokens` on every request of the workload in one call (trie groups, `max_group_tokens`, the default layout),
and greedy decoding of `decode_contexts` workload contexts through the backend's decoder (one KV stream per context
by default), `new_tokens` argmax steps.

Nodes are classified and summed per kind (fastscore.bench.lab.op_kinds); the gap between the measured time and the
roofline (the FLOPs the work needs at the sgemm rate: each distinct prefix once, attention over each token's own
context, one lm_head row per scored token) is split into each kind's excess, plus llama.cpp's host time inside
llama_decode and fastscore's Python outside it.

    python -m fastscore.bench.lab.op_profile [--limit 1] [--env tools] [--threads 2] [--repeats 3] [--json-out F]
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fastscore.bench.lab.op_figures import figures
from fastscore.errors import RequestError


@dataclass(frozen=True)
class OpProfileOptions:
    model: str
    data_dir: Path
    quant: str = "f32"
    items_per_env: int = 1
    envs: tuple[str, ...] = ("tools",)
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    repeats: int = 3
    decode_contexts: int = 32
    new_tokens: int = 8
    sgemm_n: int = 2048
    seed: int = 0
    conditions: tuple[str, ...] | None = None  # None: every study condition (as fastscore bench throughput)
    backend_options: tuple[tuple[str, object], ...] = ()  # llama.cpp option fields, e.g. (("n_ubatch", 256),)
    # Other layouts timed unprofiled against backend_options, alternating run by run in the same worker: each a tuple
    # of option fields set on top of backend_options.
    compare: tuple[tuple[tuple[str, object], ...], ...] = ()

    def __post_init__(self) -> None:
        if min(self.repeats, self.decode_contexts, self.new_tokens, self.items_per_env) < 1:
            raise RequestError(f"repeats, decode_contexts, new_tokens and items_per_env must be >= 1 (got {self})")


# ---------------------------------------------------------------- inside the worker


def _phase(timer, name: str) -> None:
    if timer is not None:
        timer.phase = name


def _score_once(backend, lib, timer, requests) -> dict:
    lib.reset()
    backend.stats.reset()
    if timer is not None:
        timer.reset()
    _phase(timer, "scoring")
    started = time.perf_counter()
    backend.score_tokens(requests)
    seconds = time.perf_counter() - started
    if timer is not None:
        timer.check()
    return {"seconds": seconds, "decode_seconds": lib.decode_seconds, "decode_calls": lib.decode_calls,
            "computed_tokens": backend.stats.computed_tokens,
            "nodes": timer.rows() if timer is not None else None,
            "first_layer_kq": timer.first_layer_kq.get("scoring", []) if timer is not None else None}


def _decode_once(backend, lib, timer, contexts, new_tokens: int) -> dict:
    if timer is not None:
        timer.reset()
    with backend.decoder(new_tokens) as decoder:
        lib.reset()
        _phase(timer, "prefill")
        started = time.perf_counter()
        logits = decoder.start(contexts)
        prefill_s, prefill_decode_s = time.perf_counter() - started, lib.decode_seconds
        lib.reset()
        _phase(timer, "step")
        active = list(range(len(contexts)))
        started = time.perf_counter()
        for _ in range(new_tokens):
            logits = decoder.step(active, [int(t) for t in np.argmax(logits, axis=-1)])
        step_s = time.perf_counter() - started
    if timer is not None:
        timer.check()
    return {"prefill_seconds": prefill_s, "prefill_decode_seconds": prefill_decode_s, "step_seconds": step_s,
            "step_decode_seconds": lib.decode_seconds, "step_calls": lib.decode_calls,
            "nodes": timer.rows() if timer is not None else None,
            "first_layer_kq": timer.first_layer_kq.get("step", []) if timer is not None else None}


def measure_layout(path: Path, threads: int, options, requests, contexts, new_tokens: int, repeats: int,
                   profiled: bool, compact: Path | None = None) -> dict:
    """Scoring and decoding `repeats` times each (after a warm-up) on a fresh backend, profiled or not."""
    from fastscore.backends.llamacpp import llama_module
    from fastscore.bench.lab.op_capture import NodeTimer, TimedLlama, observed_backend

    timer = NodeTimer() if profiled else None
    lib = TimedLlama(llama_module(), eval_callback=timer.callback if timer else None)
    with observed_backend(path, threads, options, lib, compact) as backend:
        _phase(timer, "warm-up")
        backend.score_tokens(requests[:4])
        _decode_once(backend, lib, timer, contexts[:2], 2)
        scoring = [_score_once(backend, lib, timer, requests) for _ in range(repeats)]
        decoding = [_decode_once(backend, lib, timer, contexts, new_tokens) for _ in range(repeats)]
    return {"scoring": scoring, "decoding": decoding}


# The worker's task: this function by its module's name (not __name__, which is __main__ under `python -m`).
WORKER_TASK = "fastscore.bench.lab.op_profile:run_worker_spec"


def run_worker_spec(spec: dict) -> dict:
    """The `op_profile` task of fastscore.bench.worker."""
    from fastscore.backends.options import options_for
    from fastscore.bench.measure import token_requests
    from fastscore.bench.roofline import measure_sgemm
    from fastscore.bench.workload import Workload, context_ids
    from fastscore.engine.trie import distinct_prefix_positions
    from fastscore.selection import ModelSelection

    sgemm = measure_sgemm(spec.get("sgemm_n", 2048), max(5, spec["repeats"]))
    workload = Workload.from_json(Path(spec["workload"]).read_text(encoding="utf-8"))
    options = options_for("llamacpp", spec.get("backend_options") or {})
    selection = ModelSelection.resolve(spec["model"], "llamacpp", spec["quant"], threads=spec["threads"],
                                       backend_options=options)
    with selection.open() as scorer:
        requests = token_requests(scorer, workload)
        distinct = [context_ids(scorer, s) for s in workload.sets]
        path, weights = scorer.backend.path, scorer.backend.weights_file
    # Every layout gets the artefact's compact file, as the product's backend does; each uses it where its own
    # options ask for it (compact_weights), so a compared layout may compute from another file than the first.
    compact = selection.artefact().compact_path
    contexts = [distinct[i % len(distinct)] for i in range(spec["decode_contexts"])]
    trie = distinct_prefix_positions([r.tokens for r in requests])
    steps = np.array([len(c) + k for c in contexts for k in range(spec["new_tokens"])], dtype=np.float64)
    out = {"sgemm": sgemm, "gguf": str(path), "weights_file": str(weights),
           "scoring_facts": {"requests": len(requests), "requested_tokens": int(sum(len(r.tokens) for r in requests)),
                             "trie_minimal_tokens": int(trie.size), "attended_cells": float((trie + 1.0).sum()),
                             "mean_trie_position": float(trie.mean()),
                             "scored_tokens": int(sum(r.n_scored for r in requests))},
           "decoding_facts": {"contexts": len(contexts), "new_tokens": spec["new_tokens"],
                              "step_tokens": int(steps.size), "attended_cells": float((steps + 1.0).sum()),
                              "mean_context_tokens": float(np.mean([len(c) for c in contexts]))}}
    for label, profiled in (("plain", False), ("profiled", True)):
        out[label] = measure_layout(path, spec["threads"], options, requests, contexts, spec["new_tokens"],
                                    spec["repeats"], profiled, compact)
    if spec.get("compare"):
        layouts = [options] + [options_for("llamacpp", {**(spec.get("backend_options") or {}), **extra})
                               for extra in spec["compare"]]
        out["layouts"] = compare_layouts(path, spec["threads"], layouts, requests, contexts, spec["new_tokens"],
                                         spec["repeats"], compact)
    return out


def compare_layouts(path: Path, threads: int, layouts: Sequence, requests, contexts, new_tokens: int,
                    repeats: int, compact: Path | None = None) -> list[dict]:
    """Unprofiled scoring and decoding on one backend per layout (options record), the layouts alternating within
    each repeat so drift of the machine's speed hits them alike; each layout's log-probs against the first's."""
    from fastscore.backends.llamacpp import llama_module
    from fastscore.bench.lab.op_capture import TimedLlama, observed_backend

    libs = [TimedLlama(llama_module()) for _ in layouts]
    with contextlib.ExitStack() as opened:  # a backend that fails to open still closes those opened before it
        backends = [opened.enter_context(observed_backend(path, threads, o, lib, compact))
                    for o, lib in zip(layouts, libs)]
        logprobs = []
        for backend, lib in zip(backends, libs):  # warm-up, and the log-probs compared
            logprobs.append(np.concatenate([s.logprobs for s in backend.score_tokens(requests)]))
            _decode_once(backend, lib, None, contexts[:2], 2)
        runs: list[dict] = [{"scoring": [], "decoding": []} for _ in layouts]
        for _ in range(repeats):
            for backend, lib, run in zip(backends, libs, runs):
                run["scoring"].append(_score_once(backend, lib, None, requests))
                run["decoding"].append(_decode_once(backend, lib, None, contexts, new_tokens))
    return [{"options": asdict(o), "weights_file": str(backend.weights_file), **run,
             "max_abs_logprob_diff_vs_first": float(np.max(np.abs(lp - logprobs[0])))}
            for o, backend, run, lp in zip(layouts, backends, runs, logprobs)]


# ---------------------------------------------------------------- the parent: running it


def run_op_profile(opts: OpProfileOptions, scratch_dir: Path | None = None) -> dict:
    """Every measurement and figure as one JSON-safe dict (fastscore.bench.lab.op_profile_table.render prints it)."""
    from fastscore.bench.roofline import shape_from_gguf
    from fastscore.bench.run import _resolve_all, spawn
    from fastscore.bench.workload import build_workload

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    workload = build_workload(opts.data_dir, opts.items_per_env, opts.envs, opts.seed, opts.conditions)
    artefact = _resolve_all(opts.model, [("llamacpp", opts.quant)])[("llamacpp", opts.quant)]
    shape = shape_from_gguf(artefact.path)
    with tempfile.TemporaryDirectory(prefix="fastscore-op-profile-", dir=scratch_dir) as tmp:
        scratch = Path(tmp)
        (scratch / "workload.json").write_text(workload.to_json(), encoding="utf-8")
        raw = spawn({"task": WORKER_TASK, "backend": "llamacpp", "model": opts.model, "quant": opts.quant,
                     "threads": opts.threads,
                     "repeats": opts.repeats, "workload": str(scratch / "workload.json"),
                     "decode_contexts": opts.decode_contexts, "new_tokens": opts.new_tokens, "sgemm_n": opts.sgemm_n,
                     "backend_options": dict(opts.backend_options),
                     "compare": [dict(c) for c in opts.compare]}, scratch, "op-profile")
    options = {k: _jsonable(v) for k, v in asdict(opts).items()}
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "options": options, "gguf": raw["gguf"], "weights_file": raw["weights_file"], "shape": shape.to_dict(),
        "sgemm": raw["sgemm"],
        "workload": {"items": workload.n_items, "contexts": len(workload.sets), **raw["scoring_facts"]},
        "decoding": raw["decoding_facts"], **figures(raw, shape),
        "max_rss_mb": raw["max_rss_bytes"] / 2**20, "llamacpp_build": raw.get("llamacpp_build"),
        "machine": {"cpu_count": os.cpu_count(), "load_average_at_start": load_at_start,
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "nice": os.nice(0)},
    }


def _jsonable(value):
    """Paths as text, (nested) tuples as lists: what json round-trips unchanged."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


def parse_backend_options(pairs: Sequence[str]) -> tuple[tuple[str, object], ...]:
    """`key=value` llama.cpp options (as --backend-option) -> the typed (field, value) pairs given."""
    from fastscore.backends.options import parse_options

    record = parse_options("llamacpp", pairs)
    keys = [p.partition("=")[0].strip().replace("-", "_") for p in pairs]
    return tuple((k, getattr(record, k)) for k in keys)


def cli():
    """The script's command line (a click command; tests invoke it with CliRunner)."""
    import click

    from fastscore.bench.lab.script import comma_list
    from fastscore.exits import friendly
    from fastscore.registry import default_model
    from fastscore.study.data.datafile import default_data_dir

    @click.command()
    @click.option("--model", default=None, help="Registry name or folder (default: the embedded model).")
    @click.option("--quant", default="f32", show_default=True, help="llama.cpp GGUF type.")
    @click.option("--data", default=None, type=click.Path(path_type=Path), help="Study data (default: ../shared/data).")
    @click.option("--limit", default=1, show_default=True, type=click.IntRange(min=1), help="Items per environment.")
    @click.option("--env", "envs", default="tools", show_default=True, help="Comma-separated environments.")
    @click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: all cores).")
    @click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1))
    @click.option("--conditions", default=None, help="Comma-separated study conditions (default: all).")
    @click.option("--decode-contexts", default=32, show_default=True, type=click.IntRange(min=1))
    @click.option("--new-tokens", default=8, show_default=True, type=click.IntRange(min=1))
    @click.option("--sgemm-n", default=2048, show_default=True, type=click.IntRange(min=16))
    @click.option("--backend-option", "backend_options", multiple=True,
                  help="llama.cpp option key=value for both runs (e.g. n_ubatch=256); repeatable.")
    @click.option("--compare", "compare", multiple=True,
                  help="Another layout timed unprofiled against the first, alternating: comma-separated llama.cpp "
                       "options key=value (e.g. n_ubatch=256); repeatable.")
    @click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON line instead of the table.")
    @click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path))
    @friendly
    def command(model, quant, data, limit, envs, threads, repeats, conditions, decode_contexts, new_tokens, sgemm_n,
                backend_options, compare, as_json, json_out):
        """Per-op time of llama.cpp shared scoring and batched decoding steps, against the FLOP roofline."""
        from fastscore.bench.lab.op_profile_table import render
        from fastscore.bench.table import print_and_save

        opts = OpProfileOptions(model=model or default_model(), data_dir=data or default_data_dir(), quant=quant,
                                items_per_env=limit, envs=comma_list(envs), threads=threads or os.cpu_count() or 1,
                                repeats=repeats, decode_contexts=decode_contexts, new_tokens=new_tokens,
                                sgemm_n=sgemm_n, conditions=comma_list(conditions) if conditions else None,
                                backend_options=parse_backend_options(backend_options),
                                compare=tuple(parse_backend_options(comma_list(c)) for c in compare))
        print_and_save(run_op_profile(opts), json_out, render, as_json)

    return command


if __name__ == "__main__":
    cli()()
