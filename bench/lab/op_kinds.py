"""Per-op profile maths (pure): which kind of work each llama.cpp graph node is, per-kind totals, and how much of
the gap between a measured time and the FLOP roofline each kind explains.

A node is classified from what ggml says about it: its op (`ggml_op_desc`: MUL_MAT, SOFT_MAX, RMS_NORM, SWIGLU...),
its own name (llama.cpp names graph tensors `kq-3`, `Qcur-3`, `attn_norm-3`...) and its sources' names (a weight
matmul's first source is the model tensor, e.g. `blk.3.attn_q.weight`; the lm_head's is `output.weight`, or
`token_embd.weight` when tied). Only matmuls are given FLOPs (2 x the shared dimension x the output's elements):
the roofline counts nothing else, so every other kind's time is excess over it by definition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fastscore.bench.roofline import WEIGHTS, ModelShape, attention_cell_flops, layer_weight_params, lm_head_flops

KIND_OF_WEIGHT = {w: f"matmul {w}" for w in WEIGHTS}  # roofline's weight name -> the kind of its matmul nodes
# llama.cpp's layer tensor names (blk.N.<name>.weight) -> the kind of the matmul reading them
WEIGHT_KINDS = {gguf: KIND_OF_WEIGHT[w] for gguf, w in (("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"),
                                                         ("attn_output", "o"), ("ffn_gate", "gate"),
                                                         ("ffn_up", "up"), ("ffn_down", "down"))}
KINDS = (*WEIGHT_KINDS.values(), "lm_head", "attn KQ", "attn softmax", "attn KQV", "matmul other", "norm", "rope",
         "kv write", "get_rows", "add/mul", "activation", "copy", "view", "other")
ATTENTION_KINDS = ("attn KQ", "attn softmax", "attn KQV")
VIEW_OPS = frozenset({"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})  # no work: ggml skips them
_ACTIVATIONS = frozenset({"SILU", "GELU", "GELU_ERF", "GELU_QUICK", "RELU", "SWIGLU", "SWIGLU_OAI", "GEGLU",
                          "GEGLU_ERF", "GEGLU_QUICK", "REGLU"})
_ELEMENTWISE = frozenset({"ADD", "ADD1", "ADD_ID", "SUB", "MUL", "DIV", "SCALE", "ACC"})
_WEIGHT = re.compile(r"^blk\.\d+\.(\w+)\.weight$")
_LM_HEAD = ("output.weight", "token_embd.weight")


def classify(op: str, name: str, sources: Sequence[str]) -> str:
    """The kind of one graph node (one of KINDS) from its op description, its name and its sources' names."""
    src0 = sources[0] if sources else ""
    if op == "MUL_MAT":
        weight = _WEIGHT.match(src0)
        if weight and weight.group(1) in WEIGHT_KINDS:
            return WEIGHT_KINDS[weight.group(1)]
        if src0 in _LM_HEAD:
            return "lm_head"
        if name.startswith("kqv"):  # before "kq": the value product's name starts with it too
            return "attn KQV"
        if name.startswith("kq"):
            return "attn KQ"
        return "matmul other"
    if op == "SOFT_MAX":
        return "attn softmax"
    if op in ("RMS_NORM", "NORM", "L2_NORM", "GROUP_NORM"):
        return "norm"
    if op == "MUL" and any(s.endswith("norm.weight") for s in sources):  # the norm's gain
        return "norm"
    if op == "ROPE":
        return "rope"
    if op == "SET_ROWS" or (op == "CPY" and any(s.startswith("cache_") for s in (name, *sources))):
        return "kv write"
    if op == "GET_ROWS":
        return "get_rows"
    if op in _ELEMENTWISE:
        return "add/mul"
    if op in _ACTIVATIONS:
        return "activation"
    if op in ("CPY", "CONT", "DUP"):
        return "copy"
    if op in VIEW_OPS:
        return "view"
    return "other"


def matmul_flops(op: str, ne: Sequence[int], src0_ne0: int) -> float:
    """FLOPs of one node: a MUL_MAT multiplies over src0's first dimension for every output element; 0 otherwise."""
    return 2.0 * src0_ne0 * float(np.prod(ne)) if op == "MUL_MAT" else 0.0


@dataclass(frozen=True)
class KindTotals:
    kind: str
    nodes: int
    seconds: float
    flops: float
    share: float  # of all node seconds
    gflops: float | None  # matmul kinds only

    def to_dict(self) -> dict:
        return {"kind": self.kind, "nodes": self.nodes, "seconds": self.seconds, "flops": self.flops,
                "share": self.share, "gflops": self.gflops}


def aggregate(kinds: Sequence[str], seconds: Sequence[float], flops: Sequence[float]) -> list[KindTotals]:
    """Per-kind node count, seconds, FLOPs, share of all node time and GFLOP/s, in KINDS order (absent kinds left
    out)."""
    kinds_a = np.asarray(kinds, dtype=object)
    sec, fl = np.asarray(seconds, dtype=np.float64), np.asarray(flops, dtype=np.float64)
    if not (len(kinds_a) == len(sec) == len(fl)):
        raise ValueError("kinds, seconds and flops must have one entry per node")
    unknown = set(kinds_a.tolist()) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown node kinds {sorted(unknown)}")
    total = float(sec.sum())
    out = []
    for kind in KINDS:
        mask = kinds_a == kind
        if not mask.any():
            continue
        s, f = float(sec[mask].sum()), float(fl[mask].sum())
        out.append(KindTotals(kind, int(mask.sum()), s, f, s / total if total > 0 else 0.0,
                              f / s / 1e9 if f > 0 and s > 0 else None))
    return out


def mean_totals(rows: Iterable[Mapping], n_runs: int, by: Sequence[str] = ("kind",)) -> dict[tuple, dict]:
    """Rows (dicts with the `by` fields, nodes, seconds, flops) of `n_runs` runs summed per distinct value of the
    `by` fields, then divided by n_runs: the mean per run, keyed by those values in order of first appearance."""
    if n_runs < 1:
        raise ValueError(f"n_runs must be >= 1 (got {n_runs})")
    sums: dict[tuple, dict] = {}
    for r in rows:
        key = tuple(r[f] for f in by)
        acc = sums.setdefault(key, {**dict(zip(by, key)), "nodes": 0, "seconds": 0.0, "flops": 0.0})
        acc["nodes"] += int(r["nodes"])
        acc["seconds"] += float(r["seconds"])
        acc["flops"] += float(r["flops"])
    # sum, then divide once: the mean of each kind's total, not a sum of rounded shares
    return {key: {**acc, "nodes": acc["nodes"] / n_runs, "seconds": acc["seconds"] / n_runs,
                  "flops": acc["flops"] / n_runs} for key, acc in sums.items()}


def needed_flops(shape: ModelShape, n_tokens: int, attended: float, lm_head_rows: int) -> dict[str, float]:
    """FLOPs the roofline (fastscore.bench.roofline) grants each kind for computing `n_tokens` tokens once, which
    attend over `attended` cells in all (the sum of position + 1), with `lm_head_rows` logits rows: 2 x the weight's
    params per token in every layer for each weight kind, half the attention FLOPs for each of the two attention
    products (KQ and KQV cost the same), the lm_head's FLOPs per row; nothing for the other kinds."""
    out = {KIND_OF_WEIGHT[w]: 2.0 * shape.n_layer * params * n_tokens
           for w, params in layer_weight_params(shape).items()}
    attention = 0.5 * attention_cell_flops(shape) * float(attended)
    out.update({"attn KQ": attention, "attn KQV": attention,
                "lm_head": float(lm_head_flops(shape)) * lm_head_rows})
    return out


def gap_breakdown(measured_seconds: float, decode_seconds: float, totals: Mapping[str, Mapping],
                  needed: Mapping[str, float], sgemm_gflops: float, target_fraction: float = 0.8) -> dict:
    """Where the time above the roofline goes.

    roofline = sum(needed) / sgemm rate. Each kind's excess = its node seconds - its needed FLOPs at the sgemm
    rate, for matmuls split into `recompute` (FLOPs computed beyond those needed, at the sgemm rate) and `rate` (the
    rest: running below the sgemm rate). Two rows are outside the graph's nodes: `llama.cpp host` = time inside
    llama_decode (`decode_seconds`) minus all node seconds (batch splitting, the KQ mask, graph build, logits copy;
    negative if the nodes ran slower when profiled than the whole graph did unprofiled), and `fastscore Python` =
    measured - decode_seconds (planning, log-softmax, gathering). The excesses add up to measured - roofline;
    `of_gap` divides by that gap, `of_gap_to_target` by the seconds that must go for the roofline fraction to reach
    target_fraction (> 1: removing that part alone would suffice)."""
    rate = sgemm_gflops * 1e9
    roofline = float(sum(needed.values())) / rate
    gap, to_target = measured_seconds - roofline, measured_seconds - roofline / target_fraction

    def fractions(excess: float) -> dict:
        return {"of_gap": excess / gap if gap > 0 else None,
                "of_gap_to_target": excess / to_target if to_target > 0 else None}

    node_seconds = float(sum(float(t["seconds"]) for t in totals.values()))
    rows = []
    for kind in KINDS:
        if kind not in totals and kind not in needed:
            continue
        seconds = float(totals[kind]["seconds"]) if kind in totals else 0.0
        computed = float(totals[kind]["flops"]) if kind in totals else 0.0
        need = float(needed.get(kind, 0.0))
        excess = seconds - need / rate
        recompute = max(computed - need, 0.0) / rate
        rows.append({"kind": kind, "seconds": seconds, "needed_flops": need, "computed_flops": computed,
                     "roofline_seconds": need / rate, "excess_seconds": excess, "recompute_seconds": recompute,
                     "rate_seconds": excess - recompute, **fractions(excess)})
    for kind, seconds in (("llama.cpp host", decode_seconds - node_seconds),
                          ("fastscore Python", measured_seconds - decode_seconds)):
        rows.append({"kind": kind, "seconds": seconds, "needed_flops": 0.0, "computed_flops": 0.0,
                     "roofline_seconds": 0.0, "excess_seconds": seconds, "recompute_seconds": 0.0,
                     "rate_seconds": seconds, **fractions(seconds)})
    return {"measured_seconds": measured_seconds, "decode_seconds": decode_seconds, "roofline_seconds": roofline,
            "fraction_of_roofline": roofline / measured_seconds if measured_seconds > 0 else None,
            "gap_seconds": gap, "target_fraction": target_fraction, "gap_to_target_seconds": to_target,
            "node_seconds": node_seconds, "rows": rows}


def group_rows(rows: Sequence[Mapping], groups: Mapping[str, Sequence[str]]) -> list[dict]:
    """Gap rows summed into named groups of kinds (e.g. all weight matmuls), each kind in at most one group;
    kinds in no group are left out."""
    out = []
    for label, members in groups.items():
        chosen = [r for r in rows if r["kind"] in members]
        summed = {key: sum(float(r[key]) for r in chosen) for key in
                  ("seconds", "roofline_seconds", "excess_seconds", "recompute_seconds", "rate_seconds")}
        fractions = {key: (sum(r[key] for r in chosen) if all(r[key] is not None for r in chosen) else None)
                     for key in ("of_gap", "of_gap_to_target")}
        out.append({"group": label, "kinds": [r["kind"] for r in chosen], **summed, **fractions})
    return out


GAP_GROUPS = {
    "weight matmuls (q k v o gate up down)": tuple(WEIGHT_KINDS.values()),
    "lm_head": ("lm_head",),
    "attention (KQ, softmax, KQV)": ATTENTION_KINDS,
    "norms": ("norm",),
    "RoPE": ("rope",),
    "KV cache writes": ("kv write",),
    "GET_ROWS": ("get_rows",),
    "adds/muls, activation": ("add/mul", "activation"),
    "copies, other ops": ("copy", "matmul other", "view", "other"),
    "llama.cpp host (inside llama_decode, outside the nodes)": ("llama.cpp host",),
    "fastscore Python (outside llama_decode)": ("fastscore Python",),
}
