"""The study's own decoding steps against a reference that counts reading each row's KV cells (x86 with AVX-512).

    python -m fastscore.bench.lab.decode_reference RUN_DIR SCRATCH [--threads 2]

RUN_DIR's greedy stage runs again in SCRATCH (bench/lab/decode_levers.py's recording: each decoder step's rows, the
cells its rows attend and its seconds, per call's environment and kind). Each step without joining contexts is set
against a reference: its rows' arithmetic outside attention (the model's non-embedding matmuls and the lm_head row)
at one thread's sgemm rate (each lane decodes on one thread), plus reading its rows' K and V cells once, at the plain
read rates `bench/lab/kv_read.py` measures on this core for the model's shape at the steps' mean cells. Steps that
join contexts also prefill them, which the reference does not count: they are printed apart. The reference counts the
cells a row needs; llama.cpp attends them rounded up to 64. It is a reference, not a bound: the read rate is one
loop's on 4 KB pages (docs/performance.md, "A decoding step's attention against reading its KV cache").
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path

import click

KV_ROWS = 32  # rows per step at which kv_read measures the read rates (the study's calls hold at most 32 live)


def step_reference(rows: int, cells: int, row_flops: float, sgemm_flops: float, cell_bytes: float,
                   k_rate: float, v_rate: float) -> float:
    """Seconds of a step of `rows` rows attending `cells` cells in all: the rows' arithmetic at `sgemm_flops` FLOP/s
    plus `cells` cells of K and of V (`cell_bytes` each) read at `k_rate` and `v_rate` bytes/s."""
    return rows * row_flops / sgemm_flops + cells * cell_bytes * (1.0 / k_rate + 1.0 / v_rate)


def measure(run_dir: Path, scratch: Path, threads: int, sgemm_n: int = 2048) -> dict:
    """RUN_DIR's greedy stage run again in SCRATCH and its plain steps set against the reference: the rates measured
    ("sgemm_gflops", "k_rate", "v_rate" in bytes/s, "cells", "mean_cells", "row_flops", "cell_bytes"), per
    (environment, kind of call) the plain steps ("plain": steps, rows, cells, measured, reference and arithmetic
    seconds) and the decoder's seconds split ("split": time_split)."""
    from fastscore.bench.lab import kv_read
    from fastscore.bench.lab.decode_levers import record
    from fastscore.bench.roofline import lm_head_flops, non_embedding_params, shape_from_gguf
    from fastscore.bench.run import spawn
    from fastscore.selection import ModelSelection

    calls = record(run_dir, scratch, threads)
    settings = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    shape = shape_from_gguf(ModelSelection.resolve(settings["model"], "llamacpp", settings["quant"]).artefact().path)
    with tempfile.TemporaryDirectory(prefix="fastscore-decode-reference-") as tmp:
        sgemm = spawn({"task": "sgemm", "n": sgemm_n, "repeats": 5, "threads": 1}, Path(tmp), "sgemm")
    plain = [(c["env"], c["kind"], r, n, s) for c in calls
             for r, j, n, s in zip(c["step_rows"], c["step_joins"], c["step_cells"], c["step_seconds"], strict=True)
             if not j]
    if not plain or any(n is None for *_, n, _ in plain):
        raise click.ClickException("no plain decoder steps with their cells recorded: the run's decoder keeps no "
                                   "positions (a KV-stream llama.cpp decoder does)")
    mean_cells = sum(n for *_, n, _ in plain) / sum(r for _, _, r, _, _ in plain)
    cells = max(64, round(mean_cells / 64) * 64)
    seconds = kv_read.timed_modes(KV_ROWS, shape.n_layer, max(1024, cells), cells, shape.n_kv_head, shape.head_dim,
                                  shape.n_head, 3)
    cell_bytes = shape.n_layer * shape.n_kv_head * shape.head_dim * 4.0
    read_bytes = KV_ROWS * cells * cell_bytes
    k_rate, v_rate = read_bytes / seconds[0], read_bytes / seconds[3]
    row_flops = 2.0 * non_embedding_params(shape) + lm_head_flops(shape)
    flops = sgemm["gflops"] * 1e9
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for env, kind, rows, n, s in plain:
        groups[env, kind].append((rows, n, s))
    steps = {}
    for key, group in sorted(groups.items()):
        rows = sum(r for r, _, _ in group)
        steps[key] = {"steps": len(group), "rows": rows, "cells": sum(c for _, c, _ in group),
                      "measured": sum(s for _, _, s in group),
                      "reference": sum(step_reference(r, c, row_flops, flops, cell_bytes, k_rate, v_rate)
                                       for r, c, _ in group),
                      "arithmetic": step_reference(rows, 0, row_flops, flops, cell_bytes, k_rate, v_rate)}
    return {"sgemm_gflops": sgemm["gflops"], "k_rate": k_rate, "v_rate": v_rate, "cells": cells,
            "mean_cells": mean_cells, "row_flops": row_flops, "cell_bytes": cell_bytes, "plain": steps,
            "split": time_split(calls)}


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True, help="The run's threads (one per lane).")
@click.option("--sgemm-n", type=int, default=2048, show_default=True)
def main(run_dir: Path, scratch: Path, threads: int, sgemm_n: int) -> None:
    click.echo(render(measure(run_dir, scratch, threads, sgemm_n)))


def render(result: dict) -> str:
    """The two tables of `measure`'s result: plain steps against the reference, the decoder's seconds split."""
    lines = [f"\nsgemm {result['sgemm_gflops']:.1f} GFLOP/s on one thread; plain reads at {result['cells']} cells "
             f"(the steps' mean {result['mean_cells']:.0f}): K {result['k_rate'] / 1e9:.1f} GB/s, "
             f"V {result['v_rate'] / 1e9:.1f} GB/s; {result['row_flops'] / 1e6:.0f} MFLOP a row outside attention; "
             f"{result['cell_bytes'] / 1e3:.1f} KB of K and as much of V a cell\n",
             "| calls | plain steps | rows | cells per row | measured s | reference s: arithmetic + read | "
             "reference / measured |",
             "|---|---|---|---|---|---|---|"]
    measured = reference = 0.0
    for (env, kind), g in sorted(result["plain"].items()):
        measured += g["measured"]
        reference += g["reference"]
        lines.append(f"| {env} {kind} | {g['steps']:,} | {g['rows']:,} | {g['cells'] / g['rows']:.0f} | "
                     f"{g['measured']:.1f} | {g['reference']:.1f}: {g['arithmetic']:.1f} + "
                     f"{g['reference'] - g['arithmetic']:.1f} | {g['reference'] / g['measured']:.2f} |")
    lines += [f"\nAll plain steps: {measured:.1f} s measured, {reference:.1f} s at the reference, "
              f"{reference / measured:.2f}.\n",
              "| calls | decoder seconds | first prefill | steps joining contexts (their prefill included) | "
              "plain steps | the rest (host work between steps) |",
              "|---|---|---|---|---|---|"]
    for (env, kind), (whole, start, joins, steps) in sorted(result["split"].items()):
        lines.append(f"| {env} {kind} | {whole:.1f} | {start:.1f} | {joins:.1f} | {steps:.1f} | "
                     f"{whole - start - joins - steps:.1f} |")
    return "\n".join(lines)


def time_split(calls: list[dict]) -> dict[tuple[str, str], tuple[float, float, float, float]]:
    """{(environment, kind of call): (the decoder's seconds in all, its first prefill, its steps that joined contexts, its
    plain steps)} summed over the recorded calls."""
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for c in calls:
        parts = out[c["env"], c["kind"]]
        parts[0] += c["call_seconds"]
        parts[1] += c["start_seconds"]
        for joined, seconds in zip(c["step_joins"], c["step_seconds"], strict=True):
            parts[2 if joined else 3] += seconds
    return {key: tuple(parts) for key, parts in out.items()}


if __name__ == "__main__":
    main()
