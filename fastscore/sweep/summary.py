"""The cross-model summary: every cell's rows pooled over its shards and summarised by the study's own metrics, one
table like the paper's, a plot of G per token by model size, and each variant's sign against its model's exact
reference variant. Writes DIR/summary.md, DIR/summary.json and DIR/sweep_gain_by_size.png."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastscore.conversion import standin
from fastscore.outputs import write_text_atomic
from fastscore.study.data.conditions import REMEDIES
from fastscore.study.analysis.metrics import read_score_rows, summarize
from fastscore.study.report.document import construction_marks
from fastscore.sweep.grid import Cell, Shard
from fastscore.sweep.worker import shard_dir

log = logging.getLogger(__name__)

PLOT_FILE = "sweep_gain_by_size.png"
# Variants whose scores are exact (batch-invariant, f32 arithmetic): the sign check's references, best first.
EXACT_VARIANTS = ("llamacpp:f32", "onnx:fp32", "reference:fp32")


def cell_rows(out_dir: Path, shards: Sequence[Shard]) -> list:
    rows = []
    for shard in sorted(shards, key=lambda s: s.index):
        path = shard_dir(out_dir, shard) / "scores.jsonl"
        if path.is_file():
            rows += read_score_rows(path)
    return rows


def summarise_cells(out_dir: Path, shards_by_cell: dict[Cell, list[Shard]], skipped: dict[tuple[str, str], str],
                    all_cells: Sequence[Cell], seed: int, n_boot: int) -> dict[str, Any]:
    cells_out = []
    for cell in all_cells:
        entry: dict[str, Any] = {**asdict(cell), "variant": cell.variant, "key": cell.key,
                                 "standin": standin.is_standin(cell.model)}
        reason = skipped.get((cell.model, cell.variant))
        if reason is not None:
            cells_out.append({**entry, "status": "skipped", "reason": reason})
            continue
        shards = shards_by_cell.get(cell, [])
        rows = cell_rows(out_dir, shards)
        entry.update(n_shards=len(shards), n_items=len({r.item_id for r in rows}))
        if not rows:
            why = "no usable item" + ("" if cell.failures == "seeded" else
                                      ": no attempt of the model's was a usable failure (reasons in the shards' "
                                      "skipped.jsonl)")
            cells_out.append({**entry, "status": "empty", "reason": why})
            continue
        summary = summarize(rows, seed=seed, n_boot=n_boot)[cell.env]
        cells_out.append({**entry, "status": "done", "summary": mark_by_construction(summary, cell.failures)})
    return {"cells": cells_out, "sign_check": sign_check(cells_out)}


def mark_by_construction(summary: dict[str, Any], failures: str) -> dict[str, Any]:
    """The summary with every value that holds by construction (the study report's own table: the ban's zeros; under
    the model's failures, its greedy outcomes before the record, which are its failed attempt) moved out of the
    estimates into the condition's `not_applicable`, with the reason: summary.json must not store them as measured."""
    marks = construction_marks(failures)
    conditions = {cond: dict(entry) for cond, entry in summary.get("conditions", {}).items()}
    for (cond, key), why in marks.items():
        entry = conditions.get(cond)
        if entry is not None and key in entry:
            del entry[key]
            entry["not_applicable"] = {**entry.get("not_applicable", {}), key: why}
    return {**summary, "conditions": conditions}


def _est(summary: dict[str, Any], *path: str) -> dict[str, Any] | None:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, dict) and "mean" in node else None


def _g(cell: dict[str, Any]) -> dict[str, Any] | None:
    return _est(cell.get("summary", {}), "conditions", "after", "gain_per_token")


def sign_check(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each non-exact variant's G per token (after) against the same model/env/failures on its exact reference."""
    done = {(c["model"], c["env"], c["failures"], c["variant"]): c for c in cells if c["status"] == "done"}
    out = []
    for (model, env, failures, variant), cell in done.items():
        if variant in EXACT_VARIANTS:
            continue
        ref_variant = next((v for v in EXACT_VARIANTS if (model, env, failures, v) in done), None)
        check: dict[str, Any] = {"model": model, "env": env, "failures": failures, "variant": variant,
                                 "reference": ref_variant}
        g, ref = _g(cell), _g(done[(model, env, failures, ref_variant)]) if ref_variant else None
        if ref is None or g is None:
            check["verdict"] = "not applicable: no exact variant of this model in the sweep" if ref_variant is None \
                else "not applicable: G per token undefined"
        else:
            check.update(g_per_token=g, reference_g_per_token=ref, verdict=_sign_verdict(g, ref))
        out.append(check)
    return out


def _spans_zero(est: dict[str, Any]) -> bool:
    return est.get("lo") is None or est["lo"] <= 0 <= est["hi"]


def _sign_verdict(g: dict[str, Any], ref: dict[str, Any]) -> str:
    """A flip counts only where both signs are resolved: a CI that includes 0 leaves the sign open."""
    if _spans_zero(ref) or _spans_zero(g):
        which = "the reference's" if _spans_zero(ref) else "this variant's"
        return f"undetermined: {which} 95% CI includes 0"
    return "sign kept" if (g["mean"] < 0) == (ref["mean"] < 0) else "SIGN FLIPPED"


def model_label(model: str) -> str:
    """Registry names as they are (a stand-in marked as one); a local folder by its name (summary.json keeps the
    full path)."""
    return Path(model).name if "/" in model else standin.label(model)


def _fmt(est: dict[str, Any] | None, pct: bool = False) -> str:
    """mean [95% CI] (n=N), as the study report gives them; ⚠ marks a ratio whose denominator's CI includes 0."""
    if est is None:
        return "n/a"
    f = (lambda x: f"{x:.0%}") if pct else (lambda x: f"{x:.3f}")
    ci = "[n/a]" if est.get("lo") is None else f"[{f(est['lo'])}, {f(est['hi'])}]"
    return f"{f(est['mean'])} {ci} (n={est['n']})" + (" ⚠" if est.get("unstable") else "")


def _arrow(s: dict[str, Any], metric: str, pct: bool) -> str:
    """before → after, each with its interval and n; a before value that holds by construction (see
    mark_by_construction) reads 'not applicable' with the reason: an interval around it would read as a measurement."""
    before, after = _est(s, "conditions", "before", metric), _est(s, "conditions", "after", metric)
    fixed = s.get("conditions", {}).get("before", {}).get("not_applicable", {}).get(metric)
    if after is None or (before is None and not fixed):
        return "n/a"
    shown = f"not applicable ({fixed})" if fixed else _fmt(before, pct)
    return f"{shown} → {_fmt(after, pct)}"


def table_markdown(result: dict[str, Any]) -> str:
    header = ["model", "variant", "env", "failures", "n", "G/token (after)", "share G<0 (Wilson)",
              "P(repeat) before → after", "greedy repro before → after (Wilson)", "surface share (ratio)",
              *[f"{r} removes (ratio)" for r in REMEDIES]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in result["cells"]:
        head = [model_label(c["model"]), c["variant"], c["env"], c["failures"]]
        if c["status"] != "done":
            why = "see Skipped below" if c["status"] == "skipped" else c["reason"]
            lines.append("| " + " | ".join(head + [str(c.get("n_items", 0)), f"{c['status']}: {why}"]
                                           + [""] * (len(header) - 6)) + " |")
            continue
        s = c["summary"]
        remedies = []
        for r in REMEDIES:
            est = _est(s, "remedies", r, "share_removed")
            reason = s.get("remedies", {}).get(r, {}).get("not_applicable", {}).get("share_removed")
            remedies.append(_fmt(est, pct=True) if est else f"not applicable ({reason})" if reason else "n/a")
        lines.append("| " + " | ".join(head + [
            str(s["n_items"]), _fmt(_g(c)), _fmt(_est(s, "conditions", "after", "share_negative"), pct=True),
            _arrow(s, "p_repeat", False), _arrow(s, "greedy_repeat", True),
            _fmt(_est(s, "decomposition", "surface_share"), pct=True), *remedies]) + " |")
    return "\n".join(lines)


def sign_markdown(checks: Sequence[dict[str, Any]]) -> str:
    if not checks:
        return "No non-exact variant in this sweep: nothing to check against an exact reference."
    lines = ["| model | env | failures | variant | G/token | reference | reference G/token | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {model_label(c['model'])} | {c['env']} | {c['failures']} | {c['variant']} | {_fmt(c.get('g_per_token'))} "
                     f"| {c['reference'] or 'none'} | {_fmt(c.get('reference_g_per_token'))} | {c['verdict']} |")
    return "\n".join(lines)


def write_summary(out_dir: Path, result: dict[str, Any], meta: dict[str, Any],
                  params: dict[str, int | None]) -> list[Path]:
    out_dir = Path(out_dir)
    plot = write_size_plot(out_dir / PLOT_FILE, result, params)
    skipped = [c for c in result["cells"] if c["status"] == "skipped"]
    intro = (f"Command: `{meta['command']}`. Seed {meta['seed']}; items per cell: {meta['limit']}; shards of "
             f"{meta['shard_size']} items; ran {meta['ran_on']}. Each cell's rows are pooled over its shards and "
             "summarised by the study's own metrics. Each value reads mean [95% CI] (n=items): shares of items "
             "(share G<0, greedy reproduction) carry a Wilson score interval, means and ratios of means (G, "
             "P(repeat), surface share, share removed) a percentile bootstrap over items; ⚠ marks a ratio whose "
             "denominator's CI includes 0. A value that holds by construction reads 'not applicable'. "
             "G is the corrective gain "
             "of the `after` condition against `before`; P(repeat) is the failed action's probability within the "
             "fixed candidate set. Under `model` failures a cell's items are the examined sources the model failed.")
    if meta.get("versions"):
        found = meta["versions"]
        intro += (f" Versions (driver): fastscore {found['fastscore_version']}, Python {found['python']}, "
                  + ", ".join(f"{k} {v}" for k, v in found["libraries"].items() if v)
                  + "; each shard's `config.json` records its worker's versions and weights.")
    standins = sorted({c["model"] for c in result["cells"] if c.get("standin")})
    warning = (f"**Stand-ins:** {', '.join(map(standin.label, standins))} are random-weight models with the real "
               "checkpoints' configs (`--allow-stand-ins`): their rows measure time only; their G means nothing."
               ) if standins else ""
    text = "\n\n".join(filter(None, [
        "# fastscore sweep",
        warning,
        intro,
        "## Results\n\n" + table_markdown(result),
        ("## Skipped\n\n" + "\n".join(f"- {c['model']} ({c['variant']}): {c['reason']}"
                                       for c in {(c['model'], c['variant']): c for c in skipped}.values()))
        if skipped else "",
        "## Sign of each variant against the model's exact reference\n\n" + sign_markdown(result["sign_check"]),
        f"## G per token by model size\n\n![G per token by model size]({plot.name})" if plot else "",
    ])) + "\n"
    write_text_atomic(out_dir / "summary.md", text)
    write_text_atomic(out_dir / "summary.json", json.dumps({**result, "meta": meta}, indent=2, sort_keys=True) + "\n")
    return [out_dir / "summary.md", out_dir / "summary.json"] + ([plot] if plot else [])


def write_size_plot(path: Path, result: dict[str, Any], params: dict[str, int | None]) -> Path | None:
    points: dict[str, list[tuple[int, dict]]] = {}
    for c in result["cells"]:
        g = _g(c) if c["status"] == "done" else None
        if g is not None and params.get(c["model"]):
            points.setdefault(f"{c['env']} · {c['failures']} · {c['variant']}", []).append((params[c["model"]], g))
    from fastscore.deps import has_extra

    if not points or not has_extra("study"):  # no matplotlib: announced when the sweep started
        return None
    from fastscore.study.report.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in sorted(points.items()):
        pts.sort(key=lambda p: p[0])
        xs = [p for p, _ in pts]
        ys = [g["mean"] for _, g in pts]
        err = [[g["mean"] - g["lo"] if g.get("lo") is not None else 0 for _, g in pts],
               [g["hi"] - g["mean"] if g.get("hi") is not None else 0 for _, g in pts]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("G per token, after (nats; 95% CI)")
    ax.set_title("Corrective gain by model size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
