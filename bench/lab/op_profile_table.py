"""The op profile's printed tables and JSON line (fastscore.bench.lab.op_profile measures)."""

from __future__ import annotations

from pathlib import Path


def _phase(title: str, f: dict, sgemm: float) -> list[str]:
    from fastscore.bench.table import _f, _grid

    g, a = f["gap"], f["attention"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    parts = [
        "",
        f"{title}: unprofiled {_f(f['plain_seconds'], 3)} s (llama_decode {_f(f['plain_decode_seconds'], 3)} s); "
        f"profiled {_f(f['profiled_seconds'], 3)} s (llama_decode {_f(f['profiled_decode_seconds'], 3)} s, graph "
        f"nodes {_f(f['node_seconds'], 3)} s); roofline {_f(g['roofline_seconds'], 3)} s = "
        f"{_f(g['fraction_of_roofline'], 2)} of the unprofiled time",
        f"attention: {_f(a['micro_batches'])} micro-batches, {_f(a['mean_cells_per_token'])} cells attended per token "
        f"on average; {_f(a['computed_flops'] / 1e9)} GFLOP computed vs {_f(a['needed_flops'] / 1e9)} needed (own "
        f"context only): {pct(a['masked_fraction'])} of it on masked cells",
    ]
    rows = [[k["kind"], _f(k["nodes"], 1), _f(k["seconds"], 3), pct(k["share"]),
             _f(k["flops"] / 1e9, 1) if k["flops"] else "", _f(k["gflops"]) if k["gflops"] else "",
             _f(k["fraction_of_sgemm"], 2) if k["fraction_of_sgemm"] else ""] for k in f["kinds"]]
    parts.append(_grid(["kind (per run)", "nodes", "seconds", "share", "GFLOP", "GFLOP/s", "/sgemm"], rows))
    parts.append("")
    rows = [[r["group"], _f(r["seconds"], 3), _f(r["roofline_seconds"], 3), _f(r["excess_seconds"], 3),
             _f(r["recompute_seconds"], 3), pct(r["of_gap"]), pct(r["of_gap_to_target"])] for r in f["gap_groups"]]
    parts.append(_grid(["where the time above the roofline goes", "seconds", "at roofline", "excess", "of which "
                        "recompute", "of gap", f"of gap to {g['target_fraction']}"], rows))
    parts.append(f"gap: {_f(g['gap_seconds'], 3)} s above the roofline; {_f(g['gap_to_target_seconds'], 3)} s must go "
                 f"to reach {g['target_fraction']} of it (sgemm {_f(sgemm)} GFLOP/s)")
    return parts


def render(result: dict) -> str:
    from fastscore.bench.table import _f, _grid, build_line

    o, m, w, d = result["options"], result["machine"], result["workload"], result["decoding"]
    sgemm = result["sgemm"]["gflops"]
    weights = Path(result.get("weights_file") or result["gguf"])
    computed_from = "" if weights == Path(result["gguf"]) else f", computed from {weights.name}"
    parts = [
        f"op profile — {result['date_utc']} — {o['model']} llama.cpp {o['quant']} ({Path(result['gguf']).name}"
        f"{computed_from}), "
        f"threads {o['threads']}, repeats {o['repeats']}, options {dict(o['backend_options']) or 'defaults'}",
        f"load average at start {m['load_average_at_start']}, at end {m['load_average_at_end']} on {m['cpu_count']} "
        f"CPUs, nice {m['nice']}",
        *([f"llama.cpp: {build_line(result['llamacpp_build'])}"] if result.get("llamacpp_build") else []),
        f"sgemm limit: {_f(sgemm)} GFLOP/s (float32 {result['sgemm']['n']}² numpy matmul)",
        f"workload: {w['items']} items ({', '.join(o['envs'])}), {w['contexts']} contexts, {w['requests']} requests, "
        f"{_f(w['requested_tokens'])} requested tokens, {_f(w['trie_minimal_tokens'])} in the trie (mean position "
        f"{_f(w['mean_trie_position'])}), {_f(result['scoring']['computed_tokens'])} computed, "
        f"{_f(w['scored_tokens'])} scored",
        f"decoding: {d['contexts']} contexts (mean {_f(d['mean_context_tokens'])} tokens), {d['new_tokens']} steps, "
        f"{_f(result['decode_steps']['tokens_per_s'])} tok/s unprofiled",
    ]
    parts += _phase("shared scoring (score_tokens, every request in one call)", result["scoring"], sgemm)
    parts += _phase(f"decode steps ({d['contexts']} contexts x {d['new_tokens']} steps)", result["decode_steps"], sgemm)
    if result.get("layouts"):
        rows = [[", ".join(f"{k}={v}" for k, v in lay["changed"].items()) or "first (as above)",
                 _f(lay["computed_tokens"]), _f(lay["scoring_seconds"], 3), _f(lay["unique_tokens_per_s"]),
                 _f(lay["scoring_speedup"], 3), _f(lay["step_seconds"], 3), _f(lay["step_tokens_per_s"]),
                 _f(lay["step_speedup"], 3), _f(lay["max_abs_logprob_diff_vs_first"], 2)]
                for lay in result["layouts"]]
        parts += ["", "layouts side by side (unprofiled, alternating run by run; medians):",
                  _grid(["layout", "computed", "scoring s", "unique tok/s", "speedup", "steps s", "step tok/s",
                         "speedup", "max |d logprob|"], rows)]
    parts += ["", "excess = seconds - the kind's needed FLOPs at the sgemm rate (recompute: FLOPs computed beyond the "
                  "needed ones, at that rate); node times come from the profiled run (each node its own graph), "
                  "the measured and llama_decode times from the unprofiled one"]
    return "\n".join(parts)
