"""Derived benchmark figures (pure): throughputs, ratios against the targets, roofline fractions, memory.

Every figure is computed from what the workers measured; a target is reported as its ratio and whether it was met,
never adjusted.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from fastscore.bench.roofline import (
    ModelShape,
    flops_per_token,
    gflops,
    lm_head_flops,
    non_embedding_params,
    ratio,
    workload_flops,
)
from fastscore.variants import VARIANTS

TARGETS = {
    "end_to_end_speedup": 10.0,  # fastscore (best llama.cpp type) vs the transformers reference, each request alone
    "unique_vs_prefill": 0.9,  # unique-token throughput of shared scoring / raw prefill of the same backend
    "prefill_fraction_of_sgemm": 0.75,  # for the fp32 / f16 configurations
    "greedy_batched_speedup_32": 8.0,  # 32 contexts in one batch vs one at a time
    # Issue 12: exact scoring at >= 0.8 of the workload's FLOP roofline; exact fastscore end to end >= 5x the
    # transformers peer that reuses each context's KV; batched greedy decoding (32+ contexts) >= 0.8 of the same
    # backend's prefill tokens/s.
    "exact_fraction_of_roofline": 0.8,
    "exact_speedup_vs_prefix_kv": 5.0,
    "greedy_vs_prefill": 0.8,
}
ROOFLINE_CONFIGS = ("llamacpp:f32", "llamacpp:f16", "onnx:fp32")
# Batch-invariant: what fastscore scores with by default.
EXACT_CONFIGS = tuple(v.label for v in VARIANTS if v.full_precision and v.in_bench)
GREEDY_TARGET_MIN_CONTEXTS = 32


def best_llamacpp_type(backends: dict[str, dict]) -> str | None:
    """The llama.cpp type with the highest unique-token throughput in shared scoring."""
    speeds = {key.split(":", 1)[1]: m["trie_minimal_tokens"] / m["shared"]["seconds"]
              for key, m in backends.items() if key.startswith("llamacpp:")}
    return max(speeds, key=speeds.get) if speeds else None


def max_abs_diff(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"result lists differ in length ({x.shape} vs {y.shape})")
    return float(np.max(np.abs(x - y)))


def target(value: float | None, goal: float) -> dict[str, Any]:
    return {"value": value, "target": goal, "met": None if value is None else bool(value >= goal)}


def backend_figures(m: dict, shape: ModelShape, sgemm_gflops: float) -> dict[str, Any]:
    shared, alone, pp = m["shared"], m["per_request"], m["prefill"]
    computed = shared["stats"]["computed_tokens"] or m["trie_minimal_tokens"]
    shared_flops = workload_flops(shape, computed, m["mean_trie_position"], m["scored_tokens"])
    alone_flops = workload_flops(shape, alone["stats"]["computed_tokens"] or alone["requested_tokens"],
                                 alone["mean_position"], alone["stats"]["scored_tokens"])
    pp_flops = workload_flops(shape, pp["tokens"], pp["mean_position"], lm_head_rows=1)
    roofline_flops = workload_flops(shape, m["trie_minimal_tokens"], m["mean_trie_position"], m["scored_tokens"])
    unique_tps = m["trie_minimal_tokens"] / shared["seconds"]
    prefill_tps = pp["tokens"] / pp["seconds"]
    return {
        "requested_tokens": m["requested_tokens"],
        "computed_tokens": shared["stats"]["computed_tokens"],
        "trie_minimal_tokens": m["trie_minimal_tokens"],
        "scored_tokens": m["scored_tokens"],
        "forward_calls": shared["stats"]["forward_calls"],
        "shared_seconds": shared["seconds"],
        "unique_tokens_per_s": unique_tps,
        "requested_tokens_per_s": m["requested_tokens"] / shared["seconds"],
        "prefill_tokens": pp["tokens"],
        "prefill_seconds": pp["seconds"],
        "prefill_tokens_per_s": prefill_tps,
        "unique_vs_prefill": ratio(unique_tps, prefill_tps),
        # The same comparison in FLOP/s: scoring pays the lm_head on every scored row and attends over longer
        # contexts than pp, which the token ratio above does not account for.
        "shared_vs_prefill_gflops": ratio(gflops(shared_flops, shared["seconds"]), gflops(pp_flops, pp["seconds"])),
        "per_request_requests": alone["requests"],
        "per_request_seconds": alone["seconds"],
        "per_request_computed_tokens": alone["stats"]["computed_tokens"],
        "per_request_requested_tokens_per_s": alone["requested_tokens"] / alone["seconds"],
        # Time per requested token alone vs shared (equal to the wall-time ratio when every request ran alone).
        "sharing_speedup": ratio(m["requested_tokens"] / shared["seconds"], alone["requested_tokens"] / alone["seconds"]),
        "shared_vs_per_request_max_abs_diff": m["shared_vs_per_request_max_abs_diff"],
        "prefill_gflops": gflops(pp_flops, pp["seconds"]),
        "prefill_fraction_of_sgemm": ratio(gflops(pp_flops, pp["seconds"]), sgemm_gflops),
        "shared_gflops": gflops(shared_flops, shared["seconds"]),
        "shared_fraction_of_sgemm": ratio(gflops(shared_flops, shared["seconds"]), sgemm_gflops),
        "per_request_gflops": gflops(alone_flops, alone["seconds"]),
        # The workload's roofline: the trie-minimal tokens (each distinct prefix once) plus an lm_head row per
        # scored token, at the sgemm rate; the fraction is that time over the measured time.
        "roofline_seconds": roofline_flops / (sgemm_gflops * 1e9),
        "shared_fraction_of_roofline": ratio(roofline_flops / (sgemm_gflops * 1e9), shared["seconds"]),
        "max_rss_mb": m["max_rss_bytes"] / 2**20,
        "llamacpp_build": m.get("llamacpp_build"),
    }


def roofline_figures(shape: ModelShape, backends: dict[str, dict], pp_tokens: int) -> dict[str, Any]:
    mean_trie = float(np.mean([m["mean_trie_position"] for m in backends.values()])) if backends else 0.0
    pp_mean = (pp_tokens - 1) / 2.0
    return {
        "shape": shape.to_dict(),
        "non_embedding_matmul_params": non_embedding_params(shape),
        "lm_head_params": shape.d_model * shape.n_vocab,
        "lm_head_flops_per_row": lm_head_flops(shape),
        "flops_per_token_prefill_without_lm_head": flops_per_token(shape, pp_mean, with_lm_head=False),
        "flops_per_token_prefill_with_lm_head": flops_per_token(shape, pp_mean, with_lm_head=True),
        "flops_per_token_workload_without_lm_head": flops_per_token(shape, mean_trie, with_lm_head=False),
        "flops_per_token_workload_with_lm_head": flops_per_token(shape, mean_trie, with_lm_head=True),
        "mean_position_prefill": pp_mean,
        "mean_position_workload_trie": mean_trie,
        "how": "FLOPs/token = 2 x non-embedding matmul params (q,k,v,o + gated MLP, all layers) + attention "
               "4 x n_layer x n_head x head_dim x (t+1) at the mean 0-based position t; lm_head = 2 x d_model x "
               "n_vocab per logits row. Which applies: prefill (pp) keeps one logits row, so 'without lm_head' "
               "(plus one row); shared scoring runs the lm_head only on scored rows (counted as such); "
               f"dimensions from {shape.source}.",
    }


def summarize(*, options: dict, workload, sgemm: dict, backends: dict[str, dict], end_to_end: dict[str, dict],
              greedy: dict | None, best: str | None, shape: ModelShape,
              greedy_type: str | None = None) -> dict[str, Any]:
    limit = sgemm["gflops"]
    per_backend = {key: backend_figures(m, shape, limit) for key, m in backends.items()}
    digests = {m["digest"] for m in backends.values()}
    out: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "load_average_1_5_15_at_end": list(os.getloadavg()),
                    "load_average_at_start": options.get("load_average_at_start")},
        "threads": options["threads"],
        "options": options,
        "workload": {"items": workload.n_items, "contexts": len(workload.sets), "requests": workload.n_requests,
                     "envs": list(workload.envs), "same_requests_on_every_backend": len(digests) <= 1},
        "sgemm": {"n": sgemm["n"], "gflops": limit, "gflops_best": sgemm["gflops_best"],
                  "max_rss_mb": sgemm["max_rss_bytes"] / 2**20},
        "roofline": roofline_figures(shape, backends, options["pp_tokens"]),
        "backends": per_backend,
        "best_llamacpp_type": best,
    }
    out["end_to_end"] = _end_to_end(end_to_end, best)
    greedy_type = greedy_type or best
    prefill = per_backend.get(f"llamacpp:{greedy_type}", {}).get("prefill_tokens_per_s")
    out["greedy"] = _greedy(greedy, greedy_type, prefill)
    out["memory_mb"] = {**{f"backend {k}": v["max_rss_mb"] for k, v in per_backend.items()},
                        **{f"e2e {k}": m["max_rss_bytes"] / 2**20 for k, m in end_to_end.items()},
                        **({f"greedy llamacpp:{greedy_type}": greedy["max_rss_bytes"] / 2**20} if greedy else {})}
    out["bounds"] = _bounds(out)
    out["targets"] = _targets(out)
    return out


def _bounds(out: dict[str, Any]) -> dict[str, Any]:
    """What caps the targets on this machine, from the same run: an engine cannot score faster than its own raw
    prefill runs, and no engine beats the roofline, so the peer's time over the roofline time caps the speedup."""
    roofline = next((b["roofline_seconds"] for b in out["backends"].values()), None)
    peer = out["end_to_end"].get("reference:fp32:prefix_kv")
    return {
        "prefill_fraction_of_sgemm": {k: out["backends"][k]["prefill_fraction_of_sgemm"]
                                      for k in EXACT_CONFIGS if k in out["backends"]},
        "roofline_seconds": roofline,
        "max_speedup_vs_prefix_kv_at_roofline": ratio(peer["seconds"], roofline) if peer and roofline else None,
    }


def _end_to_end(e2e: dict[str, dict], best: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {k: {"seconds": m["seconds"], "requests": len(m["logprobs"]), "mode": m.get("mode"),
                               "one_request_per_call": m["one_request_per_call"], "weights": m["weights"]}
                           for k, m in e2e.items()}
    ref = e2e.get("reference:fp32")
    peer = e2e.get("reference:fp32:prefix_kv")
    fast = e2e.get(f"llamacpp:{best}") if best else None
    if ref and fast:
        out["speedup_vs_reference"] = ratio(ref["seconds"], fast["seconds"])
        out["max_abs_diff_best_vs_reference"] = max_abs_diff(fast["logprobs"], ref["logprobs"])
    if ref and "llamacpp:f32" in e2e:
        out["max_abs_diff_f32_vs_reference"] = max_abs_diff(e2e["llamacpp:f32"]["logprobs"], ref["logprobs"])
    if ref and peer:
        out["max_abs_diff_prefix_kv_vs_reference"] = max_abs_diff(peer["logprobs"], ref["logprobs"])
    exact = {k: e2e[k] for k in EXACT_CONFIGS if k in e2e}
    if exact:
        fastest = min(exact, key=lambda k: exact[k]["seconds"])
        out["fastest_exact"] = fastest
        for k, m in exact.items():
            if ref:
                out[f"speedup_vs_reference {k}"] = ratio(ref["seconds"], m["seconds"])
                out[f"max_abs_diff_vs_reference {k}"] = max_abs_diff(m["logprobs"], ref["logprobs"])
            if peer:
                out[f"speedup_vs_prefix_kv {k}"] = ratio(peer["seconds"], m["seconds"])
        if peer:
            out["exact_speedup_vs_prefix_kv"] = ratio(peer["seconds"], exact[fastest]["seconds"])
        if ref and peer:
            out["prefix_kv_speedup_vs_reference"] = ratio(ref["seconds"], peer["seconds"])
    out["diff_unit"] = "nats, per request (log-prob summed over the continuation + end-of-turn)"
    return out


def _greedy(greedy: dict | None, quant: str | None, prefill_tokens_per_s: float | None) -> dict[str, Any] | None:
    if greedy is None:
        return None
    out: dict[str, Any] = {"backend": f"llamacpp:{quant}", "prefill_tokens_per_s": prefill_tokens_per_s}
    unified = greedy.get("unified") or {}
    for b, g in greedy.items():
        if not b.isdigit():  # the worker's own figures (max_rss_bytes, cpu_seconds), not a batch size
            continue
        before = unified.get(b, {}).get("batched", {}).get("tokens_per_s")
        out[b] = {"batched_tokens_per_s": g["batched"]["tokens_per_s"],
                  "sequential_tokens_per_s": g["sequential"]["tokens_per_s"],
                  "speedup": ratio(g["batched"]["tokens_per_s"], g["sequential"]["tokens_per_s"]),
                  "batched_vs_prefill": (ratio(g["batched"]["tokens_per_s"], prefill_tokens_per_s)
                                         if prefill_tokens_per_s else None),
                  # The same contexts in one unified cache with flash attention (the layout before KV streams).
                  "unified_tokens_per_s": before,
                  "streams_vs_unified": ratio(g["batched"]["tokens_per_s"], before) if before else None,
                  "new_tokens": g["new_tokens"],
                  "batched_prefill_seconds": g["batched"]["prefill_seconds"],
                  "sequential_prefill_seconds": g["sequential"]["prefill_seconds"]}
    return out


def _targets(out: dict[str, Any]) -> dict[str, Any]:
    t: dict[str, Any] = {
        "end_to_end_speedup": target(out["end_to_end"].get("speedup_vs_reference"), TARGETS["end_to_end_speedup"]),
        "unique_vs_prefill": {k: target(v["unique_vs_prefill"], TARGETS["unique_vs_prefill"])
                              for k, v in out["backends"].items()},
        "prefill_fraction_of_sgemm": {k: target(out["backends"][k]["prefill_fraction_of_sgemm"],
                                                TARGETS["prefill_fraction_of_sgemm"])
                                      for k in ROOFLINE_CONFIGS if k in out["backends"]},
    }
    g32 = (out["greedy"] or {}).get("32")
    t["greedy_batched_speedup_32"] = target(g32["speedup"] if g32 else None, TARGETS["greedy_batched_speedup_32"])
    t["exact_fraction_of_roofline"] = {k: target(out["backends"][k]["shared_fraction_of_roofline"],
                                                 TARGETS["exact_fraction_of_roofline"])
                                       for k in EXACT_CONFIGS if k in out["backends"]}
    t["exact_speedup_vs_prefix_kv"] = target(out["end_to_end"].get("exact_speedup_vs_prefix_kv"),
                                             TARGETS["exact_speedup_vs_prefix_kv"])
    # The best of the batch sizes with 32 or more contexts (the target is about filling the machine).
    big = [v["batched_vs_prefill"] for b, v in (out["greedy"] or {}).items()
           if isinstance(v, dict) and v["batched_vs_prefill"] is not None and int(b) >= GREEDY_TARGET_MIN_CONTEXTS]
    t["greedy_vs_prefill"] = target(max(big) if big else None, TARGETS["greedy_vs_prefill"])
    return t
