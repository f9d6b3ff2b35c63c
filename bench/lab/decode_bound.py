"""What bounds batched greedy decoding (issue #12): decode tok/s on fixed-length random contexts next to the same
backend's prefill, with the bytes every step must read.

A decode step feeds one token per context, so each weight matrix is multiplied by `streams` rows where prefill
feeds 512, and each token's attention reads back its whole KV stream. The byte model of one step: every weight
tensor of the GGUF except the token embedding (its rows are gathered, not read whole), the lm_head included (for
tied embeddings that is the embedding tensor), plus streams x mean cells x KV bytes per cell (n_layer x n_head_kv x
(key + value head size) x the KV type's bytes). Cells are counted twice: those holding tokens, and those llama.cpp
attends over (a stream's attended range is padded to 256 cells). The implied GB/s is those bytes over the time
spent inside the decoder's steps; activations and the logits rows written are not counted.

Every decode runs the product's path: the backend's own decoder (llama.cpp: one KV stream per context, exact f32)
driven by fastscore.decode.greedy_decode with no stop token, so each context generates exactly `steps` tokens (the
first from the prefill's logits, then `steps - 1` decoder steps); a pass-through wrapper only times it.

The cores question: llama.cpp's threads spin-wait at every op barrier, so T single-threaded processes might decode
more than one process with T threads. The same cell is decoded by one process x T threads and by T concurrent
processes x 1 thread, each decoding the whole cell, started together after their prefill (aggregate tok/s = all
processes' decode tokens over the span from the first decode start to the last decode end).

    python -m fastscore.bench.lab.decode_bound [--lengths 16,256] [--streams 32,64,128] [--steps 16] [--threads 2]
"""

from __future__ import annotations

import datetime
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fastscore.backends.base import Decoder
from fastscore.backends.options import KV_CACHE_TYPES
from fastscore.errors import BenchmarkError, RequestError


@dataclass(frozen=True)
class DecodeBoundOptions:
    model: str
    quant: str = "f32"
    lengths: tuple[int, ...] = (16, 256)
    streams: tuple[int, ...] = (32, 64, 128)
    steps: int = 16
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    repeats: int = 1
    pp_tokens: int = 512
    kv_type: str = "f32"
    compact_weights: bool = True  # the f32 default from its compact file where the build decodes it (llamacpp/0004)
    cores_cell: tuple[int, int] | None = (256, 32)  # (length, streams); None or threads < 2: not measured
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 2:
            raise RequestError(f"steps must be >= 2: the first token comes from the prefill (got {self.steps})")
        if min(self.lengths, default=0) < 1 or min(self.streams, default=0) < 1:
            raise RequestError(f"lengths and streams must be non-empty and positive "
                               f"(got {self.lengths}, {self.streams})")
        if self.repeats < 1 or self.pp_tokens < 2:
            raise RequestError(f"repeats must be >= 1 and pp_tokens >= 2 (got {self.repeats}, {self.pp_tokens})")


# ---------------------------------------------------------------- the byte model


def weight_traffic(gguf_path: Path) -> dict:
    """Bytes of weights one decode step reads, from the GGUF's tensor sizes: every tensor but the token embedding,
    plus the lm_head (`output.weight`, or the embedding itself when the model ties them)."""
    from fastscore.deps import require

    reader = require("gguf", "tokenizer").GGUFReader(str(gguf_path))
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    embedding = sizes.get("token_embd.weight", 0)
    tied = "output.weight" not in sizes
    lm_head = embedding if tied else sizes["output.weight"]
    total = sum(sizes.values())
    return {"tensor_bytes_total": total, "embedding_bytes": embedding, "lm_head_bytes": lm_head, "tied": tied,
            "weights_bytes_per_step": total - embedding + (lm_head if tied else 0)}


def attended_cells(length: int, steps: int) -> tuple[float, float]:
    """Mean cells a decode-step token attends over (its own included), holding tokens and as llama.cpp pads them:
    the steps feed positions length .. length + steps - 2."""
    from fastscore.backends.llamacpp_streams import padded

    cells = [p + 1 for p in range(length, length + steps - 1)]
    return float(np.mean(cells)), float(np.mean([padded(c) for c in cells]))


# ---------------------------------------------------------------- inside the worker


class TimedDecoder(Decoder):
    """Pass-through to the backend's decoder: times the prefill and every step; `barrier` (if given) runs between
    the prefill and the first step, so concurrent processes start decoding together."""

    def __init__(self, inner: Decoder, barrier: Callable[[], None] | None = None) -> None:
        self.inner, self.barrier = inner, barrier
        self.prefill_seconds = self.step_seconds = self.decode_seconds = 0.0
        self.step_tokens = self.n_steps = 0
        self.groups: int | None = None
        self.wall_start = self.wall_end = self._decode_from = 0.0

    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        started = time.perf_counter()
        logits = self.inner.start(contexts)
        self.prefill_seconds = time.perf_counter() - started
        self.groups = len(getattr(self.inner, "groups", ())) or None  # StreamDecoder: llama contexts opened
        if self.barrier is not None:
            self.barrier()
        self.wall_start = self.wall_end = time.time()  # wall clock: other processes' spans are compared with it
        self._decode_from = time.perf_counter()
        return logits

    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        started = time.perf_counter()
        logits = self.inner.step(active, tokens)
        done = time.perf_counter()
        self.wall_end = time.time()
        self.step_seconds += done - started
        self.decode_seconds = done - self._decode_from  # up to the last step's end, with the argmax between steps
        self.step_tokens += len(active)
        self.n_steps += 1
        return logits

    def close(self) -> None:
        self.inner.close()


def file_barrier(directory: Path, label: str, parties: int) -> Callable[[], None]:
    """A barrier across processes: round r is passed once `parties` files r.* exist in `directory`.

    No time limit (the machine may freeze a measurement for many minutes): the parent stops every worker when one
    fails, and a worker whose parent is gone stops waiting."""
    state = {"round": 0}
    parent = os.getppid()

    def wait() -> None:
        state["round"] += 1
        (Path(directory) / f"{state['round']}.{label}").touch()
        while len(list(Path(directory).glob(f"{state['round']}.*"))) < parties:
            if os.getppid() != parent:
                raise BenchmarkError(f"{label}: the benchmark process is gone (barrier round {state['round']})")
            time.sleep(0.01)  # a 10 ms later start is nothing next to the decode seconds measured

    return wait


def random_contexts(rng: np.random.Generator, n: int, length: int, n_vocab: int) -> list[list[int]]:
    return [rng.integers(0, n_vocab, size=length).tolist() for _ in range(n)]


def decode_once(scorer, contexts: Sequence[Sequence[int]], steps: int, barrier=None) -> dict:
    from fastscore.decode import greedy_decode

    timer = TimedDecoder(scorer.backend.decoder(steps), barrier)
    # No stop token: a random context may well predict end-of-turn, and every context must run all its steps.
    decoded = greedy_decode(timer, contexts, token_bytes=scorer.tokenizer.token_bytes, stop_ids=(),
                            max_new_tokens=steps)
    return {"generated_tokens": sum(len(d.token_ids) for d in decoded), "step_tokens": timer.step_tokens,
            "steps": timer.n_steps, "prefill_seconds": timer.prefill_seconds, "step_seconds": timer.step_seconds,
            "decode_seconds": timer.decode_seconds, "wall_start": timer.wall_start, "wall_end": timer.wall_end,
            "decoder_groups": timer.groups}


def measure_cells(scorer, cells: Sequence[Sequence[int]], steps: int, repeats: int, pp_tokens: int | None,
                  seed: int, barrier=None) -> dict:
    """Prefill tok/s (one `pp_tokens` random sequence, one logits row, as the bench's pp512; skipped when None),
    then `repeats` greedy decodes of each (length, streams) cell on the same random contexts; warm-up not counted."""
    from fastscore.bench.measure import timed
    from fastscore.records import TokenRequest

    backend = scorer.backend
    rng = np.random.default_rng(seed)
    decode_once(scorer, random_contexts(rng, 2, 8, backend.n_vocab), 2)  # warm-up
    out: dict = {"n_vocab": backend.n_vocab, "cells": []}
    if pp_tokens:
        tokens = tuple(random_contexts(rng, 1, pp_tokens, backend.n_vocab)[0])
        pp = TokenRequest(tokens=tokens, score_from=pp_tokens - 1)
        seconds, runs, _ = timed(lambda: backend.score_tokens([pp]), repeats)
        out["prefill"] = {"tokens": pp_tokens, "seconds": seconds, "runs": runs}
    for length, streams in cells:
        contexts = random_contexts(rng, streams, length, backend.n_vocab)
        runs = [decode_once(scorer, contexts, steps, barrier) for _ in range(repeats)]
        out["cells"].append({"length": length, "streams": streams, "steps": steps, "runs": runs})
    return out


# The worker's task: this function by its module's name (not __name__, which is __main__ under `python -m`).
WORKER_TASK = "fastscore.bench.lab.decode_bound:run_worker_spec"


def run_worker_spec(spec: dict) -> dict:
    """The `decode_bound` task of fastscore.bench.worker."""
    from fastscore.backends.options import options_for
    from fastscore.selection import ModelSelection

    options = options_for("llamacpp", spec["backend_options"]) if spec.get("backend_options") else None
    barrier = file_barrier(Path(spec["barrier"]), spec["label"], spec["parties"]) if spec.get("barrier") else None
    selection = ModelSelection.resolve(spec["model"], "llamacpp", spec["quant"], threads=spec["threads"],
                                       backend_options=options)
    with selection.open() as scorer:
        measured = measure_cells(scorer, spec["cells"], spec["steps"], spec["repeats"], spec.get("pp_tokens"),
                                 spec.get("seed", 0), barrier)
        return {**measured, "weights_file": str(scorer.backend.weights_file)}


# ---------------------------------------------------------------- the parent


def cell_figures(cell: dict, prefill_tps: float, weights_bytes: int, cell_bytes: float) -> dict:
    """Median decode tok/s of one cell, its fraction of prefill and the byte model's bytes per step and GB/s."""
    length, streams, steps = cell["length"], cell["streams"], cell["steps"]
    runs = cell["runs"]
    decode_s = statistics.median(r["decode_seconds"] for r in runs)
    step_s = statistics.median(r["step_seconds"] for r in runs)
    tokens = runs[0]["step_tokens"]
    used, padded = attended_cells(length, steps)
    kv_used, kv_padded = streams * used * cell_bytes, streams * padded * cell_bytes
    n_steps = runs[0]["steps"]
    tps = tokens / decode_s
    return {
        "length": length, "streams": streams, "steps": steps, "decode_step_tokens": tokens,
        "generated_tokens": runs[0]["generated_tokens"], "decode_seconds": decode_s, "step_seconds": step_s,
        "tokens_per_s": tps, "fraction_of_prefill": tps / prefill_tps,
        "prefill_seconds": statistics.median(r["prefill_seconds"] for r in runs),
        "mean_cells": used, "mean_cells_padded": padded, "weights_bytes_per_step": weights_bytes,
        "kv_bytes_per_step": kv_used, "kv_bytes_per_step_padded": kv_padded,
        "gb_per_s": (weights_bytes + kv_used) * n_steps / step_s / 1e9,
        "gb_per_s_padded": (weights_bytes + kv_padded) * n_steps / step_s / 1e9,
        "decoder_groups": runs[0]["decoder_groups"],
    }


def cores_figures(single: dict, parallel: list[dict]) -> dict:
    """1 process x T threads vs T processes x 1 thread on the same cell: median tok/s of each repeat."""
    one = [r["step_tokens"] / r["decode_seconds"] for r in single["cells"][0]["runs"]]
    per_repeat = zip(*(p["cells"][0]["runs"] for p in parallel))
    aggregate = [sum(r["step_tokens"] for r in runs)
                 / (max(r["wall_end"] for r in runs) - min(r["wall_start"] for r in runs)) for runs in per_repeat]
    each = [statistics.median(r["step_tokens"] / r["decode_seconds"] for r in p["cells"][0]["runs"]) for p in parallel]
    cell = single["cells"][0]
    one_tps, agg_tps = statistics.median(one), statistics.median(aggregate)
    return {"length": cell["length"], "streams": cell["streams"], "steps": cell["steps"], "processes": len(parallel),
            "one_process_tokens_per_s": one_tps, "processes_aggregate_tokens_per_s": agg_tps,
            "processes_own_tokens_per_s": each, "aggregate_vs_one_process": agg_tps / one_tps}


def _together(specs: list[dict], labels: list[str], scratch: Path) -> list[dict]:
    """Run workers concurrently; the first to fail stops the others (they would wait at the barrier for it)."""
    from fastscore.bench.run import finish_worker, start_worker

    procs = [start_worker(spec, scratch, label) for spec, label in zip(specs, labels)]
    try:
        while True:
            codes = [p.poll() for p in procs]  # every one polled (any() would stop at the first still running)
            if None not in codes or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.2)
        for proc, label in zip(procs, labels):
            if proc.returncode not in (None, 0):
                finish_worker(proc, scratch, label)  # raises the failed worker's error
        return [finish_worker(proc, scratch, label) for proc, label in zip(procs, labels)]
    finally:
        for proc in procs:
            if proc.poll() is None:  # one failed or we were interrupted: stop the others
                proc.kill()
                proc.wait()


def run_decode_bound(opts: DecodeBoundOptions, scratch_dir: Path | None = None) -> dict:
    """Every measurement and figure as one JSON-safe dict (render() prints it)."""
    from fastscore.backends.llamacpp_streams import kv_cell_bytes
    from fastscore.bench.roofline import shape_from_gguf
    from fastscore.bench.run import _resolve_all, spawn

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    artefact = _resolve_all(opts.model, [("llamacpp", opts.quant)])[("llamacpp", opts.quant)]
    shape = shape_from_gguf(artefact.path)
    cell_bytes = kv_cell_bytes(shape.n_layer, shape.n_kv_head, shape.head_dim, shape.head_dim, opts.kv_type)
    common = {"task": WORKER_TASK, "backend": "llamacpp", "model": opts.model, "quant": opts.quant, "steps": opts.steps,
              "repeats": opts.repeats, "seed": opts.seed,
              "backend_options": {"kv_type": opts.kv_type, "compact_weights": opts.compact_weights}}
    cells = [[length, streams] for length in opts.lengths for streams in opts.streams]
    cores = None
    with tempfile.TemporaryDirectory(prefix="fastscore-decode-bound-", dir=scratch_dir) as tmp:
        scratch = Path(tmp)
        grid = spawn({**common, "threads": opts.threads, "cells": cells, "pp_tokens": opts.pp_tokens}, scratch, "grid")
        if opts.cores_cell is not None and opts.threads >= 2:
            cell = {**common, "cells": [list(opts.cores_cell)], "pp_tokens": None}
            (scratch / "barrier-one").mkdir()
            single = spawn({**cell, "threads": opts.threads, "barrier": str(scratch / "barrier-one"), "label": "one",
                            "parties": 1}, scratch, "cores-one-process")
            barrier = scratch / "barrier"
            barrier.mkdir()
            labels = [f"cores-process-{i}" for i in range(opts.threads)]
            parallel = _together([{**cell, "threads": 1, "barrier": str(barrier), "label": label,
                                   "parties": opts.threads} for label in labels], labels, scratch)
            cores = {**cores_figures(single, parallel), "threads": opts.threads}
    prefill_tps = grid["prefill"]["tokens"] / grid["prefill"]["seconds"]
    weights_file = Path(grid["weights_file"])  # the f32 file or its compact file, as the worker's backend chose
    traffic = weight_traffic(weights_file)
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(opts).items()},
        "gguf": str(weights_file), "shape": shape.to_dict(), "kv_bytes_per_cell": cell_bytes, **traffic,
        "prefill": {**grid["prefill"], "tokens_per_s": prefill_tps},
        "cells": [cell_figures(c, prefill_tps, traffic["weights_bytes_per_step"], cell_bytes) for c in grid["cells"]],
        "cores": cores, "max_rss_mb": grid["max_rss_bytes"] / 2**20, "llamacpp_build": grid.get("llamacpp_build"),
        "machine": {"cpu_count": os.cpu_count(), "load_average_at_start": load_at_start,
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "nice": os.nice(0)},
    }


def cli():
    """The script's command line (a click command; tests invoke it with CliRunner)."""
    import click

    from fastscore.bench.lab.script import comma_list
    from fastscore.exits import friendly
    from fastscore.registry import default_model

    ints = lambda v: tuple(int(x) for x in comma_list(v))  # noqa: E731

    @click.command()
    @click.option("--model", default=None, help="Registry name or folder (default: the embedded model).")
    @click.option("--quant", default="f32", show_default=True, help="llama.cpp GGUF type.")
    @click.option("--lengths", default="16,256", show_default=True, help="Context lengths (random tokens).")
    @click.option("--streams", default="32,64,128", show_default=True, help="Contexts decoded together.")
    @click.option("--steps", default=16, show_default=True, type=click.IntRange(min=2), help="New tokens per context.")
    @click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: all cores).")
    @click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1))
    @click.option("--pp-tokens", default=512, show_default=True, type=click.IntRange(min=2))
    @click.option("--kv-type", default="f32", show_default=True, type=click.Choice(list(KV_CACHE_TYPES)))
    @click.option("--compact-weights/--f32-weights", default=True, show_default=True,
                  help="The f32 default computed from its compact file (same bits) or from the f32 file.")
    @click.option("--cores-cell", default="256x32", show_default=True,
                  help="LENGTHxSTREAMS decoded by 1 process x T threads and T processes x 1 thread; 'none' skips it.")
    @click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON line instead of the table.")
    @click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path))
    @friendly
    def command(model, quant, lengths, streams, steps, threads, repeats, pp_tokens, kv_type, compact_weights,
                cores_cell, as_json, json_out):
        """Decode tok/s vs prefill on fixed-length random contexts, with the bytes each step reads."""
        cell = None if cores_cell.lower() == "none" else parse_cell(cores_cell)
        opts = DecodeBoundOptions(model=model or default_model(), quant=quant, lengths=ints(lengths),
                                  streams=ints(streams), steps=steps, threads=threads or os.cpu_count() or 1,
                                  repeats=repeats, pp_tokens=pp_tokens, kv_type=kv_type,
                                  compact_weights=compact_weights, cores_cell=cell)
        from fastscore.bench.lab.decode_bound_table import render
        from fastscore.bench.table import print_and_save

        print_and_save(run_decode_bound(opts), json_out, render, as_json)

    return command


def parse_cell(text: str) -> tuple[int, int]:
    """'256x32' -> (256, 32)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise RequestError(f"a decode cell is LENGTHxSTREAMS, e.g. 256x32 (got {text!r})")
    return int(parts[0]), int(parts[1])


if __name__ == "__main__":
    cli()()
