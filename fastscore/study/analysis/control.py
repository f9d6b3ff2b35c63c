"""The copy control and the breakdowns of the headline: per failure kind, without name typos, pooled over envs.

Any string shown in the context gets copied: the correct action gains from the failure record too, because it shares
all but the edit with the failed one. The part of the inversion that favours the shown string over the correct one is
the differential copy ΔG = G(failed) - G(correct) (the same under the success and neutral records: copying of the
shown action, not an effect of the failure label, which fastscore.study.analysis.label isolates), and, token by token,
G on the failed action's edit against G on the tokens it shares with the correct action. Every number here comes
from the stored candidate log-probs; no model is run.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from fastscore.study.data.conditions import REFERENCE
from fastscore.study.analysis.label import label_headline
from fastscore.study.analysis.power import power_fields
from fastscore.study.analysis.stats import bootstrap_ci, present_count, resample_indices, wilson_ci
from fastscore.study.analysis.table import EnvTable

# Typos in a function or parameter name printed in the system prompt: the lowest-prior strings, with the largest copy
# boost, and not a failure an agent typically makes; the headline is also reported without them.
NAME_TYPOS = ("unknown_function", "misspelled_parameter")
HEADLINE_CONDITION = "after"


def token_split(table: "EnvTable", cond: str) -> tuple[np.ndarray, np.ndarray]:
    """Per item, mean per-token G of the failed action over the tokens it shares with the correct action, and over
    its edited tokens (NaN where the item has no such token or lacks token scores)."""
    n = len(table.item_ids)
    shared, edited = np.full(n, np.nan), np.full(n, np.nan)
    for i, (ref, under) in enumerate(zip(table.tokens.get(REFERENCE, [None] * n), table.tokens.get(cond, [None] * n))):
        if ref is None or under is None or ref[0].shape != under[0].shape:
            continue
        gain = ref[0] - under[0]
        edit = ref[1]
        if (~edit).any():
            shared[i] = float(gain[~edit].mean())
        if edit.any():
            edited[i] = float(gain[edit].mean())
    return shared, edited


def copy_control(table: "EnvTable", cond: str, idx: np.ndarray) -> dict[str, Any]:
    """G of the correct action next to the failed one's, their difference (total and per token) and the split of the
    failed action's per-token G into shared and edited tokens."""
    out: dict[str, Any] = {}
    g_failed, g_correct = table.gain(cond), table.gain_correct(cond)
    if present_count(g_correct) == 0:
        return out
    per_failed = g_failed / table.column(cond, "n_tokens")
    per_correct = g_correct / table.column(cond, "correct_n")
    out["gain_correct"] = bootstrap_ci(g_correct, idx).to_dict()
    out["gain_correct_per_token"] = bootstrap_ci(per_correct, idx).to_dict()
    delta = g_failed - g_correct
    out["delta_gain"] = {**bootstrap_ci(delta, idx).to_dict(), **power_fields(delta)}
    out["delta_gain_per_token"] = {**bootstrap_ci(per_failed - per_correct, idx).to_dict(),
                                   **power_fields(per_failed - per_correct)}
    out["share_delta_negative"] = wilson_ci(np.where(np.isnan(delta), np.nan, delta < 0)).to_dict()
    shared, edited = token_split(table, cond)
    if present_count(shared):
        out["gain_per_token_shared"] = bootstrap_ci(shared, idx).to_dict()
    if present_count(edited):
        out["gain_per_token_edited"] = bootstrap_ci(edited, idx).to_dict()
    return out


def headline(table: "EnvTable", idx: np.ndarray) -> dict[str, Any]:
    """The headline numbers of `after` on one table: G, G/token, ΔG, share negative, P(repeat) and greedy repro."""
    cond = HEADLINE_CONDITION
    out: dict[str, Any] = {"n_items": len(table.item_ids)}
    if not (table.has(REFERENCE) and table.has(cond)) or present_count(table.gain(cond)) == 0:
        return out
    gain = table.gain(cond)
    out["gain"] = bootstrap_ci(gain, idx).to_dict()
    out["gain_per_token"] = bootstrap_ci(gain / table.column(cond, "n_tokens"), idx).to_dict()
    out["share_negative"] = wilson_ci(np.where(np.isnan(gain), np.nan, gain < 0)).to_dict()
    out.update(copy_control(table, cond, idx))
    label = label_headline(table, idx)
    if label:
        out["label"] = label
    for name, binary in (("p_repeat", False), ("greedy_repeat", True)):
        for which in (REFERENCE, cond):
            values = table.column(which, name)
            if present_count(values):
                out[f"{name}_{which}"] = (wilson_ci(values) if binary else bootstrap_ci(values, idx)).to_dict()
    return out


def _indices(table: "EnvTable", seed: int, n_boot: int, salt: str) -> np.ndarray:
    return resample_indices(len(table.item_ids), n_boot, [seed, zlib.crc32(f"{table.env}:{salt}".encode())])


def by_kind(table: "EnvTable", seed: int, n_boot: int) -> dict[str, Any]:
    """The headline per failure kind (n per kind states the mix the study used)."""
    kinds = np.asarray(table.kinds if table.kinds else [""] * len(table.item_ids))
    out = {}
    for kind in sorted(set(kinds.tolist())):
        sub = table.subset(kinds == kind)
        out[kind or "unrecorded"] = headline(sub, _indices(sub, seed, n_boot, kind))
    return out


def without_name_typos(table: "EnvTable", seed: int, n_boot: int) -> dict[str, Any]:
    kinds = np.asarray(table.kinds if table.kinds else [""] * len(table.item_ids))
    keep = ~np.isin(kinds, NAME_TYPOS)
    if not keep.any():
        return {"n_items": 0, "note": "every item is a name typo"}
    sub = table.subset(keep)
    return {**headline(sub, _indices(sub, seed, n_boot, "no-typos")), "excluded_kinds": list(NAME_TYPOS)}


def pooled(tables: list["EnvTable"], seed: int, n_boot: int) -> dict[str, Any]:
    """The headline over the items of every environment together (items resampled jointly, not stratified)."""
    conds = [c for c in tables[0].columns if all(t.has(c) for t in tables)]
    columns = {c: {name: np.concatenate([t.columns[c][name] for t in tables]) for name in tables[0].columns[c]}
               for c in conds}
    tokens = {c: [tok for t in tables for tok in t.tokens.get(c, [None] * len(t.item_ids))] for c in conds}
    ids = tuple(f"{t.env}:{i}" for t in tables for i in t.item_ids)
    kinds = tuple(k for t in tables for k in (t.kinds or ("",) * len(t.item_ids)))
    table = EnvTable("+".join(t.env for t in tables), ids, columns, tokens, kinds)
    out = headline(table, _indices(table, seed, n_boot, "pooled"))
    out["envs"] = [t.env for t in tables]
    out["method"] = "items of all environments pooled; percentile bootstrap over the pooled items"
    return out
