"""quant-check outputs: the comparison of every variant with the reference (quant.json), its reading (quant.md),
and two plots (reference G vs variant G per variant; sign agreement by |G_ref| bin)."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastscore.study.quantcheck.stats import (
    MARGIN_EDGES,
    agreement,
    binned_sign_agreement,
    mean_abs_diff,
    mean_shift,
    pearson,
    sign_agreement,
    sign_of_mean_statement,
    spearman,
)
from fastscore.study.analysis.stats import CI_LEVEL, assert_json_safe, resample_indices


ALL = "all"
SCATTER_PLOT = "quant_scatter.png"
BINS_PLOT = "quant_sign_bins.png"


def _or_reason(value: float | None, reason: str) -> Any:
    return value if value is not None else {"not_applicable": reason}


def compare(ref, var, mask: np.ndarray, idx: np.ndarray) -> dict[str, Any]:
    """Every agreement figure of one variant against the reference on the items in `mask`."""
    g_ref, g_var = ref.gain[mask], var.gain[mask]
    pt_ref, pt_var = g_ref / ref.n_tokens[mask], g_var / var.n_tokens[mask]
    out: dict[str, Any] = {
        "n_items": int(mask.sum()),
        "weights": var.weights,
        "mean_gain_ref": float(g_ref.mean()), "mean_gain_variant": float(g_var.mean()),
        "mean_gain_per_token_ref": float(pt_ref.mean()), "mean_gain_per_token_variant": float(pt_var.mean()),
        "sign_of_mean_changed": bool(np.sign(g_ref.mean()) != np.sign(g_var.mean())),
        "sign_of_mean": sign_of_mean_statement(float(g_ref.mean()), float(g_var.mean())),
        "sign_of_mean_per_token": sign_of_mean_statement(float(pt_ref.mean()), float(pt_var.mean()),
                                                         "mean per-token G"),
        "sign_agreement": sign_agreement(g_ref, g_var),
        "sign_agreement_by_margin": binned_sign_agreement(g_ref, g_var),
        "spearman_gain": _or_reason(spearman(g_ref, g_var), "a side is constant"),
        "shift_mean_gain_per_token": mean_shift(pt_ref, pt_var, idx),  # idx drawn for this item group
        "p_repeat_mean_abs_diff": mean_abs_diff(ref.p_repeat[mask], var.p_repeat[mask]),
        "p_repeat_pearson": _or_reason(pearson(ref.p_repeat[mask], var.p_repeat[mask]), "a side is constant"),
        "argmax_agreement": agreement(ref.argmax[mask], var.argmax[mask]),
    }
    if var.kl_sum is not None:
        out["kl_mean_per_action_token"] = float(var.kl_sum[mask].sum() / var.kl_tokens[mask].sum())
        out["kl_action_tokens"] = int(var.kl_tokens[mask].sum())
    else:
        out["not_applicable"] = {"kl_mean_per_action_token": var.kl_note or "no KL rows"}
    return out


def compare_all(items: Sequence, scores: dict, reference: str, config) -> dict[str, Any]:
    envs = [e for e in dict.fromkeys(item.env for item in items)]
    env_of = np.array([item.env for item in items])
    ref = scores[reference]
    groups = {ALL: np.ones(len(items), dtype=bool), **{e: env_of == e for e in envs}}
    comparisons: dict[str, dict[str, Any]] = {}
    for label, var in scores.items():
        if label == reference:
            continue
        comparisons[label] = {}
        for group, mask in groups.items():
            # One resample matrix per group, drawn from a seed fixed by the group's name (crc32: reproducible).
            idx = resample_indices(int(mask.sum()), config.n_boot, [config.seed, zlib.crc32(group.encode())])
            comparisons[label][group] = compare(ref, var, mask, idx)
    summary = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": config.command,
        "model": config.model,
        "reference": {"variant": reference, "weights": ref.weights,
                      "mean_gain": {g: float(ref.gain[m].mean()) for g, m in groups.items()},
                      "mean_gain_per_token": {g: float((ref.gain / ref.n_tokens)[m].mean()) for g, m in groups.items()}},
        "items": {g: int(m.sum()) for g, m in groups.items()},
        "definitions": {
            "G": "lp(failed action | before) - lp(failed action | after), natural log, summed over the action's "
                 "tokens + end-of-turn; per-token G divides by that token count",
            "margin_bins": [[lo, None if np.isinf(hi) else hi] for lo, hi in zip(MARGIN_EDGES[:-1], MARGIN_EDGES[1:])],
            "spearman": "Pearson correlation of average ranks (ties share their mean rank)",
            "shift": f"mean over items of (variant - reference) per-token G, {int(CI_LEVEL * 100)}% percentile "
                     f"bootstrap CI ({config.n_boot} resamples of items)",
            "p_repeat": "P(failed action) over the candidate set under `after` (softmax of summed log-probs)",
            "kl": "mean over action tokens (both conditions) of KL(reference || variant) of the full next-token "
                  "distribution, nats",
        },
        "variants": comparisons,
    }
    assert_json_safe(summary)
    return summary


def write_outputs(summary: dict[str, Any], items: Sequence, scores: dict, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    full = dict(summary)
    full["per_item"] = [row for s in scores.values() for row in s.item_rows(items)]
    assert_json_safe(full)
    paths = [out_dir / "quant.json", out_dir / "quant.md"]
    paths[0].write_text(json.dumps(full, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    plots = write_plots(summary, items, scores, out_dir)
    paths[1].write_text(render_markdown(summary, [p.name for p in plots]), encoding="utf-8")
    return paths + plots


def _num(x: Any, digits: int = 3) -> str:
    return f"{x:+.{digits}f}" if isinstance(x, float) else "n/a"


def _share(x: Any) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, float) else "n/a"


def render_markdown(summary: dict[str, Any], plots: Sequence[str]) -> str:
    lines = [f"# Quantisation check — {summary['model']}", "",
             f"Date: {summary['date_utc']}. Command: `{summary['command']}`.", "",
             f"Reference: {summary['reference']['variant']} ({summary['reference']['weights']}). "
             f"Items: " + ", ".join(f"{g} {n}" for g, n in summary["items"].items()) + ".", "",
             "## Verdict per variant", ""]
    for label, groups in summary["variants"].items():
        verdict = "; ".join(f"{g}: {c['sign_of_mean']}" for g, c in groups.items())
        lines.append(f"- **{label}**: {verdict}.")
    for group in summary["items"]:
        lines += ["", f"## {group}", "",
                  "| variant | mean G ref → var | mean G/token ref → var | Δ G/token [95% CI] | sign agree | "
                  "by margin bin | Spearman G | P(repeat) MAD / r | argmax agree | KL/token |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for label, groups in summary["variants"].items():
            c = groups[group]
            s = c["shift_mean_gain_per_token"]
            bins = ", ".join(f"{_share(b.get('agreement'))} (n={b['n']})" for b in c["sign_agreement_by_margin"])
            kl = c.get("kl_mean_per_action_token")
            lines.append(
                f"| {label} | {_num(c['mean_gain_ref'])} → {_num(c['mean_gain_variant'])} | "
                f"{_num(c['mean_gain_per_token_ref'])} → {_num(c['mean_gain_per_token_variant'])} | "
                f"{_num(s['mean'], 4)} [{_num(s['lo'], 4)}, {_num(s['hi'], 4)}] | {_share(c['sign_agreement'])} | "
                f"{bins} | {_num(c['spearman_gain'])} | {c['p_repeat_mean_abs_diff']:.4f} / "
                f"{_num(c['p_repeat_pearson'])} | {_share(c['argmax_agreement'])} | "
                f"{f'{kl:.2e}' if kl is not None else 'n/a'} |")
    edges = summary["definitions"]["margin_bins"]
    lines += ["", "Margin bins of abs(G_ref) (nats): " + ", ".join(f"[{lo}, {hi if hi is not None else '∞'})" for lo, hi in edges)
              + ".", ""]
    lines += [f"- {k}: {v}" for k, v in summary["definitions"].items() if k != "margin_bins"]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_plots(summary: dict[str, Any], items: Sequence, scores: dict, out_dir: Path) -> list[Path]:
    from fastscore.study.report.plots import pyplot

    plt = pyplot()

    reference = summary["reference"]["variant"]
    labels = list(summary["variants"])
    envs = np.array([item.env for item in items])
    ref_gain = scores[reference].gain
    cols = min(4, max(1, len(labels)))
    rows = -(-len(labels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    lo, hi = float(min(ref_gain.min(), *(scores[l].gain.min() for l in labels))), float(
        max(ref_gain.max(), *(scores[l].gain.max() for l in labels)))
    pad = 0.05 * (hi - lo or 1.0)
    for ax, label in zip(axes.flat, labels):
        for env in dict.fromkeys(envs):
            m = envs == env
            ax.scatter(ref_gain[m], scores[label].gain[m], s=12, alpha=0.7, label=env)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", lw=0.8, label="y = x")
        ax.axhline(0, color="k", lw=0.4)
        ax.axvline(0, color="k", lw=0.4)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("reference G (nats)", fontsize=8)
        ax.set_ylabel("variant G (nats)", fontsize=8)
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    scatter = out_dir / SCATTER_PLOT
    fig.savefig(scatter, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(labels) + 2), 3.4))
    bins = summary["definitions"]["margin_bins"]
    width = 0.8 / len(bins)
    for j, (blo, bhi) in enumerate(bins):
        values = [summary["variants"][l][ALL]["sign_agreement_by_margin"][j].get("agreement", np.nan) for l in labels]
        n = summary["variants"][labels[0]][ALL]["sign_agreement_by_margin"][j]["n"]
        ax.bar(np.arange(len(labels)) + (j - (len(bins) - 1) / 2) * width, values, width,
               label=f"|G_ref| in [{blo}, {bhi if bhi is not None else '∞'}) n={n}")
    ax.set_xticks(np.arange(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.3)  # headroom for the legend above the bars
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("sign agreement with reference")
    ax.legend(fontsize=7, loc="upper center", ncol=len(bins))
    fig.tight_layout()
    bars = out_dir / BINS_PLOT
    fig.savefig(bars, dpi=110)
    plt.close(fig)
    return [scatter, bars]
