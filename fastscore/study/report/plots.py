"""Figures of the study: per-item gains, P(repeat) before vs after, and the remedies' share of the inversion removed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from fastscore.deps import require
from fastscore.study.data.conditions import GAIN_CONDITIONS, GAIN_UNDEFINED, REFERENCE, REMEDIES, SAME_AS_REFERENCE
from fastscore.study.analysis.metrics import ScoreRow, build_tables

log = logging.getLogger(__name__)

GAIN_PLOT = "gain_by_condition.png"
REPEAT_PLOT = "p_repeat_before_after.png"
REMEDY_PLOT = "remedy_inversion_removed.png"
COPY_PLOT = "copy_control_failed_vs_correct.png"
PLOT_FILES = (GAIN_PLOT, REPEAT_PLOT, REMEDY_PLOT, COPY_PLOT)
PLOT_TITLES = {
    GAIN_PLOT: "Per-item corrective gain G by condition",
    REPEAT_PLOT: "P(repeat) before vs after the failure record",
    REMEDY_PLOT: "Share of the inversion removed by each remedy",
    COPY_PLOT: "Copy control: G per token of the failed vs the correct action, per item (after)",
}
# Remedies drawn: clean_retry's G is 0 by construction (its messages are before's), so it has no bar.
PLOTTED_REMEDIES = tuple(r for r in REMEDIES if r not in SAME_AS_REFERENCE)
_JITTER_SEED = 0  # fixed so the same rows always draw the same figure


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (the `study` extra; no display is ever needed)."""
    matplotlib = require("matplotlib", "study")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(rows: Iterable[ScoreRow], summary: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write the three PNG figures into out_dir and return their paths."""
    plt = pyplot()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = build_tables(rows)
    envs = [env for env in summary if env in tables]  # the pooled entry has no table of its own
    paths = []
    for name, draw in ((GAIN_PLOT, _gain_figure), (REPEAT_PLOT, _repeat_figure), (REMEDY_PLOT, _remedy_figure),
                       (COPY_PLOT, _copy_figure)):
        fig = draw(plt, tables, summary, envs)
        path = out_dir / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        log.info("wrote %s", path)
        paths.append(path)
    return paths


def _axes(plt: Any, n_rows: int, n_cols: int, width: float, height: float) -> tuple[Any, np.ndarray]:
    fig, axes = plt.subplots(n_rows, max(n_cols, 1), figsize=(width * max(n_cols, 1), height * n_rows), squeeze=False)
    return fig, axes


def _gain_figure(plt: Any, tables: dict, summary: dict, envs: list[str]) -> Any:
    fig, axes = _axes(plt, 1, len(envs), 6.5, 4.6)
    rng = np.random.default_rng(_JITTER_SEED)
    for ax, env in zip(axes[0], envs):
        table = tables[env]
        conds = [c for c in GAIN_CONDITIONS if table.has(c)]
        data = [g[~np.isnan(g)] for g in (table.gain(c) for c in conds)]
        kept = [(c, d) for c, d in zip(conds, data) if d.size]
        if kept:
            labels, values = zip(*kept)
            ax.boxplot(values, showfliers=False, widths=0.55)
            # set_xticks, not boxplot(tick_labels=...): that keyword needs matplotlib >= 3.9 (we allow 3.8).
            ax.set_xticks(range(1, len(labels) + 1), labels)
            for i, d in enumerate(values, 1):
                ax.scatter(i + rng.uniform(-0.18, 0.18, d.size), d, s=9, alpha=0.45, color="tab:blue", zorder=3)
            ax.tick_params(axis="x", rotation=30)
        ax.axhline(0.0, color="black", lw=1, ls="--")
        ax.set_title(f"{env} (n={summary[env]['n_items']} items)")
        ax.set_ylabel("G = lp(before) - lp(condition)  [nats]")
        ax.text(0.01, 0.99, "above 0: corrected\nbelow 0: backfired", transform=ax.transAxes, va="top", fontsize=8)
    fig.suptitle(PLOT_TITLES[GAIN_PLOT] + " (box: quartiles, dots: items)")
    return fig


def _repeat_figure(plt: Any, tables: dict, summary: dict, envs: list[str]) -> Any:
    fig, axes = _axes(plt, 2, len(envs), 4.6, 3.8)
    for col, env in enumerate(envs):
        table = tables[env]
        for row, (name, label) in enumerate((("p_repeat", "summed log-prob"), ("p_repeat_norm", "per-token log-prob"))):
            ax = axes[row][col]
            before, after = table.column(REFERENCE, name), table.column("after", name)
            both = ~np.isnan(before) & ~np.isnan(after)
            for b, a in zip(before[both], after[both]):
                color = "tab:red" if a > b else "tab:green"
                ax.plot([0, 1], [b, a], color=color, alpha=0.25, lw=0.8)
            conds = summary[env]["conditions"]
            for x, cond in enumerate((REFERENCE, "after")):
                est = conds.get(cond, {}).get(name)
                if est is not None:
                    err = _yerr(est)
                    ax.errorbar([x], [est["mean"]], yerr=err, fmt="o", color="black", capsize=5, ms=7, zorder=4)
            ax.set_xticks([0, 1], ["before", "after"])
            ax.set_xlim(-0.3, 1.3)
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"{env}: {label} (n={int(both.sum())} paired)", fontsize=10)
            ax.set_ylabel("P(failed action | candidate set)")
    fig.suptitle(PLOT_TITLES[REPEAT_PLOT] + "\nlines: items (red = rose), black: mean with 95% CI")
    return fig


def _yerr(est: dict) -> Any:
    if est.get("lo") is None or est.get("hi") is None:
        return None
    return [[max(est["mean"] - est["lo"], 0.0)], [max(est["hi"] - est["mean"], 0.0)]]


def _remedy_figure(plt: Any, tables: dict, summary: dict, envs: list[str]) -> Any:
    fig, axes = _axes(plt, 1, 1, 7.5, 4.6)
    ax = axes[0][0]
    width = 0.8 / max(len(envs), 1)
    for k, env in enumerate(envs):
        remedies = summary[env]["remedies"]
        for i, remedy in enumerate(PLOTTED_REMEDIES):
            est = remedies.get(remedy, {}).get("share_removed")
            if est is None:
                continue
            x = i + (k - (len(envs) - 1) / 2) * width
            ax.bar([x], [est["mean"]], width=width * 0.92, color=f"C{k}", label=env if i == 0 else None,
                         hatch="//" if est.get("unstable") else None, edgecolor="black", lw=0.6)
            ax.errorbar([x], [est["mean"]], yerr=_yerr(est), fmt="none", color="black", capsize=4)
            # Drawn along the bottom edge (x in data, y in axes units) so the label never sits on a bar.
            ax.text(x, 0.02, f"n={est['n']}", transform=ax.get_xaxis_transform(), ha="center", fontsize=7)
    ax.axhline(0.0, color="black", lw=1)
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    ax.set_xticks(range(len(PLOTTED_REMEDIES)), list(PLOTTED_REMEDIES))
    ax.set_ylabel("1 - mean G(remedy) / mean G(after)")
    notes = [f"{c}: G not defined ({reason}); see P(repeat) in the report" for c, reason in GAIN_UNDEFINED.items()
             if any(c in summary[e]["remedies"] for e in envs)]
    notes.append("1 = inversion removed, 0 = no change, < 0 = worse; hatched = denominator CI includes 0")
    notes.append("clean_retry: no bar (G = 0 by construction); see its sampled retries in the report")
    ax.set_title(PLOT_TITLES[REMEDY_PLOT] + " (95% CI)")
    ax.text(0.0, -0.16, "\n".join(notes), transform=ax.transAxes, va="top", fontsize=7, wrap=True)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="env")
    return fig


def _copy_figure(plt: Any, tables: dict, summary: dict, envs: list[str]) -> Any:
    fig, axes = _axes(plt, 1, len(envs), 4.8, 4.6)
    for ax, env in zip(axes[0], envs):
        table = tables[env]
        if not (table.has(REFERENCE) and table.has("after")):
            ax.set_title(f"{env}: no before/after pair")
            continue
        failed = table.gain("after") / table.column("after", "n_tokens")
        correct = table.gain_correct("after") / table.column("after", "correct_n")
        both = ~np.isnan(failed) & ~np.isnan(correct)
        ax.scatter(correct[both], failed[both], s=16, alpha=0.6, color="tab:red", zorder=3)
        values = np.concatenate([failed[both], correct[both], [0.0]])
        lo, hi = float(values.min()) - 0.1, float(values.max()) + 0.1
        ax.plot([lo, hi], [lo, hi], color="grey", ls=":", lw=1)
        ax.axhline(0.0, color="black", lw=0.8, ls="--")
        ax.axvline(0.0, color="black", lw=0.8, ls="--")
        delta = summary[env]["conditions"].get("after", {}).get("delta_gain_per_token")
        label = "" if delta is None else f"\ndifferential copy ΔG/token {delta['mean']:.2f} [{_ci_text(delta)}]"
        ax.set_title(f"{env} (n={int(both.sum())}){label}", fontsize=10)
        ax.set_xlabel("G(correct action) / token  [nats]")
        ax.set_ylabel("G(failed action) / token  [nats]")
        ax.text(0.01, 0.01, "below the diagonal: the record favoured\nthe failed action more than the correct one",
                transform=ax.transAxes, va="bottom", fontsize=7)
    fig.suptitle(PLOT_TITLES[COPY_PLOT])
    return fig


def _ci_text(est: dict) -> str:
    return "n/a" if est.get("lo") is None else f"{est['lo']:.2f}, {est['hi']:.2f}"
