"""The op profile's figures from its worker's raw runs (fastscore.bench.lab.op_profile): per-kind seconds and rates
against the sgemm limit, attention's computed and needed FLOPs, the gap to the roofline per kind, what each kind is
made of, and the compared layouts side by side. Pure: no llama.cpp."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from fastscore.bench.lab.op_kinds import (
    GAP_GROUPS,
    KINDS,
    aggregate,
    gap_breakdown,
    group_rows,
    mean_totals,
    needed_flops,
)


def _phase_rows(runs: Sequence[dict], phase: str) -> list[dict]:
    return [r for run in runs for r in run["nodes"] if r["phase"] == phase]


def mean_kind_totals(runs: Sequence[dict], phase: str) -> dict[str, dict]:
    """Per-kind node count, seconds and FLOPs of one phase, averaged over the runs."""
    return {kind: v for (kind,), v in mean_totals(_phase_rows(runs, phase), len(runs)).items()}


def kind_table(totals: dict[str, dict], sgemm_gflops: float) -> list[dict]:
    rows = aggregate(list(totals), [t["seconds"] for t in totals.values()], [t["flops"] for t in totals.values()])
    return [{**r.to_dict(), "nodes": totals[r.kind]["nodes"],
             "fraction_of_sgemm": r.gflops / sgemm_gflops if r.gflops else None} for r in rows]


def attention_figures(totals: dict[str, dict], needed: dict[str, float], kq_shapes: Sequence[Sequence[int]]) -> dict:
    """Attention FLOPs computed (every attended cell, masked or not) vs needed (own context only), and the cells per
    micro-batch (layer 0's KQ: [n_kv, n_tokens, n_head, n_stream])."""
    computed = sum(totals[k]["flops"] for k in ("attn KQ", "attn KQV") if k in totals)
    need = needed["attn KQ"] + needed["attn KQV"]
    tokens = sum(s[1] * s[3] for s in kq_shapes)
    return {"computed_flops": computed, "needed_flops": need,
            "masked_fraction": 1.0 - need / computed if computed else None,
            "micro_batches": len(kq_shapes),
            "mean_cells_per_token": sum(s[0] * s[1] * s[3] for s in kq_shapes) / tokens if tokens else None,
            "micro_batch_shapes": [list(s) for s in kq_shapes]}


def phase_figures(plain: Sequence[dict], profiled: Sequence[dict], phase: str, seconds_key: str, decode_key: str,
                  needed: dict[str, float], sgemm_gflops: float) -> dict:
    totals = mean_kind_totals(profiled, phase)
    measured = statistics.median(r[seconds_key] for r in plain)
    decode = statistics.median(r[decode_key] for r in plain)
    gap = gap_breakdown(measured, decode, totals, needed, sgemm_gflops)
    return {
        "plain_seconds": measured, "plain_decode_seconds": decode,
        "plain_runs": [r[seconds_key] for r in plain],
        "profiled_seconds": statistics.median(r[seconds_key] for r in profiled),
        "profiled_decode_seconds": statistics.median(r[decode_key] for r in profiled),
        "node_seconds": gap["node_seconds"],
        "kinds": kind_table(totals, sgemm_gflops),
        "attention": attention_figures(totals, needed, profiled[-1]["first_layer_kq"]),
        "gap": gap, "gap_groups": group_rows(gap["rows"], GAP_GROUPS),
        "ops": _op_rows(profiled, phase),
    }


def _op_rows(runs: Sequence[dict], phase: str) -> list[dict]:
    """Per (kind, ggml op) seconds and node counts, averaged over the runs: what each kind is made of."""
    means = mean_totals(_phase_rows(runs, phase), len(runs), by=("kind", "op"))
    order = {k: i for i, k in enumerate(KINDS)}
    return [{"kind": v["kind"], "op": v["op"], "nodes": v["nodes"], "seconds": v["seconds"]}
            for v in sorted(means.values(), key=lambda v: (order[v["kind"]], -v["seconds"]))]


def figures(raw: dict, shape) -> dict:
    sgemm = raw["sgemm"]["gflops"]
    sf, df = raw["scoring_facts"], raw["decoding_facts"]
    scoring_needed = needed_flops(shape, sf["trie_minimal_tokens"], sf["attended_cells"], sf["scored_tokens"])
    step_needed = needed_flops(shape, df["step_tokens"], df["attended_cells"], df["step_tokens"])
    p, q = raw["plain"], raw["profiled"]
    scoring = phase_figures(p["scoring"], q["scoring"], "scoring", "seconds", "decode_seconds", scoring_needed, sgemm)
    scoring["computed_tokens"] = p["scoring"][0]["computed_tokens"]
    scoring["llama_decode_calls"] = p["scoring"][0]["decode_calls"]
    step = phase_figures(p["decoding"], q["decoding"], "step", "step_seconds", "step_decode_seconds", step_needed,
                         sgemm)
    step["tokens_per_s"] = df["step_tokens"] / step["plain_seconds"]
    step["llama_decode_calls"] = p["decoding"][0]["step_calls"]
    out = {"scoring": scoring, "decode_steps": step}
    if raw.get("layouts"):
        out["layouts"] = layout_figures(raw["layouts"], raw["layouts"][0]["options"], df["step_tokens"],
                                        sf["trie_minimal_tokens"])
    return out


def layout_figures(layouts: Sequence[dict], base: dict, step_tokens: int, unique_tokens: int) -> list[dict]:
    """Per compared layout: the options that differ from the first, median scoring and decode-step seconds, their
    ratios to the first layout's (> 1: faster), and the largest log-prob difference from it."""
    first_score = statistics.median(r["seconds"] for r in layouts[0]["scoring"])
    first_step = statistics.median(r["step_seconds"] for r in layouts[0]["decoding"])
    rows = []
    for lay in layouts:
        score = statistics.median(r["seconds"] for r in lay["scoring"])
        step = statistics.median(r["step_seconds"] for r in lay["decoding"])
        rows.append({"changed": {k: v for k, v in lay["options"].items() if base.get(k) != v},
                     "weights_file": lay.get("weights_file"),
                     "scoring_seconds": score, "scoring_runs": [r["seconds"] for r in lay["scoring"]],
                     "unique_tokens_per_s": unique_tokens / score,
                     "computed_tokens": lay["scoring"][0]["computed_tokens"],
                     "step_seconds": step, "step_runs": [r["step_seconds"] for r in lay["decoding"]],
                     "step_tokens_per_s": step_tokens / step,
                     "scoring_speedup": first_score / score, "step_speedup": first_step / step,
                     "max_abs_logprob_diff_vs_first": lay["max_abs_logprob_diff_vs_first"]})
    return rows
