"""The outputs of the quant check on a run's committed items: per variant and per (source, environment), the sign
agreement of G with the committed G (Wilson CI), the G/token shift (percentile bootstrap CI) and n (quant.json), and
their reading (quant.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastscore.outputs import write_text_atomic

from fastscore.study.analysis.stats import CI_LEVEL, assert_json_safe, resample_indices, wilson_ci
from fastscore.study.quantcheck.stats import MARGIN_EDGES, binned_sign_agreement, mean_shift

ALL = "all"
REFERENCE_NOTE = ("the run's committed rows, scored by its exact backend ({backend} {quant}); for the embedded model "
                  "these are the dequantised fp32 weights of the shipped Q4_1 GGUF, equal to the transformers fp32 "
                  "reference within 1e-4 nats")


def compare_group(items: Sequence, var, mask: np.ndarray, idx: np.ndarray) -> dict[str, Any]:
    """One variant against the committed rows on the items in `mask`."""
    def committed(field: str) -> np.ndarray:
        return np.array([getattr(item, field) for item in items], dtype=float)[mask]

    g_ref, n_tokens, lp_before, lp_after = (committed(f) for f in ("gain", "n_tokens", "lp_before", "lp_after"))
    g_var = var.gain[mask]
    same_sign = (np.sign(g_ref) == np.sign(g_var)).astype(float)
    argmax_ref = np.array([item.argmax_after for item in items])[mask]
    return {
        "n": int(mask.sum()),
        "sign_agreement": wilson_ci(same_sign).to_dict(),
        # An item far from G = 0 keeps its sign under most perturbations: agreement is read against the margins held.
        "sign_agreement_by_margin": binned_sign_agreement(g_ref, g_var),
        "shift_gain_per_token": mean_shift(g_ref / n_tokens, g_var / n_tokens, idx),
        # The gain's shift is the difference of these two: where a type moves G, before or after the record.
        "shift_lp_before_per_token": mean_shift(lp_before / n_tokens, var.lp_before[mask] / n_tokens, idx),
        "shift_lp_after_per_token": mean_shift(lp_after / n_tokens, var.lp_after[mask] / n_tokens, idx),
        # Items where the record makes the failed action less likely (G > 0): a type can keep the mean's sign
        # and still change this count.
        "n_positive_committed": int(np.sum(g_ref > 0)),
        "n_positive_variant": int(np.sum(g_var > 0)),
        "max_abs_gain_diff": float(np.max(np.abs(g_var - g_ref))),
        "mean_gain_committed": float(g_ref.mean()),
        "mean_gain_variant": float(g_var.mean()),
        "argmax_agreement_after": wilson_ci((argmax_ref == var.argmax_after[mask]).astype(float)).to_dict(),
    }


def summarize(items: Sequence, scores: dict, settings: dict[str, Any], config, left_out: Sequence[str] = ()
              ) -> dict[str, Any]:
    """`left_out`: committed items the run recorded an item error for (no rows to compare with)."""
    groups = {ALL: np.ones(len(items), dtype=bool)}
    for group in dict.fromkeys(item.group for item in items):
        groups[group] = np.array([item.group == group for item in items])
    comparisons = {}
    for label, var in scores.items():
        comparisons[label] = {"weights": var.weights, "groups": {}}
        for group, mask in groups.items():
            # Drawn from --seed alone: a group holding every item (one source and environment) gets the same
            # interval as `all`.
            idx = resample_indices(int(mask.sum()), config.n_boot, config.seed)
            comparisons[label]["groups"][group] = compare_group(items, var, mask, idx)
    summary = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": config.command,
        "run": str(config.run_dir),
        "model": config.model or settings["model"],
        "reference": REFERENCE_NOTE.format(backend=settings["backend"], quant=settings["quant"]),
        "items": {"sample": config.sample, "seed": config.seed, **{g: int(m.sum()) for g, m in groups.items()}},
        "left_out_item_errors": list(left_out),
        "definitions": {
            "G": "lp(failed action | before) - lp(failed action | after), natural log, summed over the action's "
                 "scored tokens (end-of-turn included when the run scored it)",
            "sign_agreement": f"share of items whose G has the same sign (-, 0, +) as the committed G, "
                              f"{int(CI_LEVEL * 100)}% Wilson score interval",
            "shift": f"mean over items of (variant - committed) G / n_tokens under `after`, {int(CI_LEVEL * 100)}% "
                     f"percentile bootstrap CI ({config.n_boot} resamples of items)",
            "shift_lp": "the same for lp(failed action | before) and lp(failed action | after): G's shift is "
                        "their difference",
            "n_positive": "items with G > 0 (the record makes the failed action less likely), committed → variant",
            "margin_bins": "items whose sign agrees, of the items in each bin of |committed G| (nats): "
                           + ", ".join(f"[{lo:g}, {hi:g})" for lo, hi in zip(MARGIN_EDGES[:-1], MARGIN_EDGES[1:])),
            "argmax_agreement_after": "share of items whose most probable candidate under `after` is the committed "
                                      "one, Wilson score interval",
        },
        "variants": comparisons,
    }
    assert_json_safe(summary)
    return summary


def per_item_rows(items: Sequence, scores: dict) -> list[dict[str, Any]]:
    rows = []
    for label, var in scores.items():
        for i, item in enumerate(items):
            rows.append({"variant": label, "source": item.source, "env": item.env, "item_id": item.item_id,
                         "lp_before_committed": item.lp_before, "lp_after_committed": item.lp_after,
                         "lp_before": float(var.lp_before[i]), "lp_after": float(var.lp_after[i]),
                         "n_tokens": item.n_tokens, "argmax_after_committed": item.argmax_after,
                         "argmax_after": int(var.argmax_after[i])})
    return rows


def write_outputs(summary: dict[str, Any], items: Sequence, scores: dict, out_dir: Path) -> list[Path]:
    full = {**summary, "per_item": per_item_rows(items, scores)}
    assert_json_safe(full)
    paths = [Path(out_dir) / "quant.json", Path(out_dir) / "quant.md"]
    write_text_atomic(paths[0], json.dumps(full, indent=1, allow_nan=False) + "\n")
    write_text_atomic(paths[1], render_markdown(summary))
    return paths


def _ci(entry: dict[str, Any], digits: int, percent: bool = False) -> str:
    scale, unit = (100.0, "%") if percent else (1.0, "")
    lo, hi = entry["lo"], entry["hi"]
    bounds = "n/a" if lo is None else f"{scale * lo:.{digits}f}{unit}, {scale * hi:.{digits}f}{unit}"
    return f"{scale * entry['mean']:.{digits}f}{unit} [{bounds}]"


def _left_out(summary: dict[str, Any]) -> str:
    left_out = summary.get("left_out_item_errors") or []
    if not left_out:
        return ""
    return (f" Left out: {len(left_out)} committed item(s) the run recorded an item error for, so no rows to "
            f"compare with ({', '.join(left_out[:5])}{', ...' if len(left_out) > 5 else ''}).")


def _bins(bins: Sequence[dict[str, Any]]) -> str:
    return ", ".join(f"{b['n_agree']}/{b['n']}" if b["n"] else "none" for b in bins)


def render_markdown(summary: dict[str, Any]) -> str:
    items = summary["items"]
    how = "every committed item" if items["sample"] is None else f"a seeded sample (seed {items['seed']})"
    lines = [f"# Quantisation check on committed items — {summary['model']}", "",
             f"Date: {summary['date_utc']}. Command: `{summary['command']}`.", "",
             f"Run: `{summary['run']}`, {how}: {items[ALL]} items.{_left_out(summary)}", "",
             f"Reference: {summary['reference']}. No reference is re-scored: each variant scores the committed "
             "items' `before` and `after` requests as the study rendered them, and is compared with the rows.", "",
             "| variant | source/env | n | sign agreement [95% CI] | Δ G/token (variant − committed) [95% CI] | "
             "Δ lp/token under before; under after | sign agrees by abs(G committed) bin | items with G > 0 | "
             "max abs ΔG | mean G committed → variant | argmax agreement under after |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, entry in summary["variants"].items():
        for group, c in entry["groups"].items():
            lines.append(f"| {label} | {group} | {c['n']} | {_ci(c['sign_agreement'], 1, True)} | "
                         f"{_ci(c['shift_gain_per_token'], 4)} | {c['shift_lp_before_per_token']['mean']:+.4f}; "
                         f"{c['shift_lp_after_per_token']['mean']:+.4f} | {_bins(c['sign_agreement_by_margin'])} | "
                         f"{c['n_positive_committed']} → {c['n_positive_variant']} | "
                         f"{c['max_abs_gain_diff']:.3g} | "
                         f"{c['mean_gain_committed']:+.3f} → {c['mean_gain_variant']:+.3f} | "
                         f"{_ci(c['argmax_agreement_after'], 1, True)} |")
    lines += [""] + [f"- {k}: {v}" for k, v in summary["definitions"].items()]
    lines += [""] + [f"- {label} weights: {entry['weights']}" for label, entry in summary["variants"].items()]
    return "\n".join(lines) + "\n"
