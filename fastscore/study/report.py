"""report.md from a summary (fastscore.study.metrics.summarize) and the run's metadata; every sentence is computed."""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastscore.study.conditions import CONDITIONS, GAIN_UNDEFINED, REFERENCE, REMEDIES, SAME_AS_REFERENCE
from fastscore.study.envs import env_class
from fastscore.study.items import Skipped
from fastscore.study.plots import PLOT_FILES, PLOT_TITLES

log = logging.getLogger(__name__)

REPORT_NAME = "report.md"
NOT_RECORDED = "not recorded"
CONDITION_COLUMNS = (
    ("gain", "G total (nats)"),
    ("gain_per_token", "G / token (nats)"),
    ("odds_factor", "odds factor exp(-G/token)"),
    ("share_negative", "share G < 0"),
    ("p_repeat", "P(repeat)"),
    ("p_repeat_norm", "P(repeat), per-token norm."),
    ("greedy_repeat", "greedy repro"),
    ("greedy_success", "greedy success"),
    ("banned_mass", "banned mass"),
)
RUN_PARAMETERS = (
    ("model", "model"),
    ("backend", "backend"),
    ("quant", "quant"),
    ("seed", "seed"),
    ("limit", "item limit per env"),
    ("failure_source", "failure source"),
    ("n_boot", "bootstrap resamples"),
    ("date", "date"),
    ("command", "command line"),
)


def write_report(summary: dict[str, Any], out_dir: Path, meta: dict[str, Any]) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [
        "# fastscore study: the corrective gain of a failure record",
        _conventions(),
        "## Weights\n\n" + str(meta.get("weights", NOT_RECORDED)),
        *([f"**{meta['sandbox_note']}.**"] if meta.get("sandbox_note") else []),
        _run_parameters(meta),
        _stage_timings(meta.get("stage_seconds") or {}),
        _items(summary, meta.get("skipped") or {}),
    ]
    for env, env_summary in summary.items():
        parts.append(_env_section(env, env_summary))
    parts.append(_plots(out_dir))
    path = out_dir / REPORT_NAME
    path.write_text("\n\n".join(parts).rstrip() + "\n", encoding="utf-8")
    log.info("wrote %s", path)
    return path


def _conventions() -> str:
    return (
        "Corrective gain G(c) = lp(before) - lp(c): the log-probability (natural log, summed over the action's "
        "tokens) of re-emitting the action that just failed, without the failure record minus with condition c. "
        "**Positive G: the record made the failed action less likely (corrected); negative G: more likely "
        "(backfired).** G / token divides by the failed action's token count under c; the odds factor "
        "exp(-mean G/token) multiplies each token's odds (above 1: repeat more likely). Cells read "
        "`mean [95% CI] (n)`, with percentile-bootstrap CIs over items; the same resamples serve every condition "
        "of an environment, so paired quantities stay paired. Items lacking a condition are excluded pairwise and "
        "n counts the items used. ⚠ marks a ratio whose denominator's CI includes 0 (the ratio is unstable)."
    )


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _run_parameters(meta: dict[str, Any]) -> str:
    rows = []
    for key, label in RUN_PARAMETERS:
        value = meta.get(key)
        text = NOT_RECORDED if value is None else (f"`{value}`" if key == "command" else str(value))
        rows.append([label, text])
    return "## Run parameters\n\n" + _table(["parameter", "value"], rows)


def _stage_timings(stage_seconds: dict[str, float]) -> str:
    if not stage_seconds:
        return "## Stage timings\n\nNo stage timings were recorded."
    rows = [[stage, f"{seconds:.1f}"] for stage, seconds in stage_seconds.items()]
    rows.append(["**total**", f"**{sum(stage_seconds.values()):.1f}**"])
    return "## Stage timings\n\n" + _table(["stage", "seconds"], rows)


def _items(summary: dict[str, Any], skipped: dict[str, dict[str, int]]) -> str:
    conds = [c for c in CONDITIONS if any(c in s.get("conditions_present", {}) for s in summary.values())]
    rows = []
    for env in list(summary) + [e for e in skipped if e not in summary]:
        present = summary.get(env, {}).get("conditions_present", {})
        n_skipped = sum((skipped.get(env) or {}).values())
        rows.append([env, str(summary.get(env, {}).get("n_items", 0)), str(n_skipped)]
                    + [str(present.get(c, 0)) for c in conds])
    text = "## Items\n\nItems scored per environment, items skipped, and items scored under each condition.\n\n"
    text += _table(["env", "items", "skipped"] + conds, rows)
    reasons = [[env, reason, str(count)] for env, by in skipped.items() for reason, count in (by or {}).items()]
    if reasons:
        text += "\n\nSkipped source records by reason:\n\n" + _table(["env", "reason", "count"], reasons)
    else:
        text += "\n\nNo source record was skipped."
    return text


def _num(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.2e}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.3f}"


def _cell(entry: dict[str, Any] | None, reason: str | None = None) -> str:
    if entry is None:
        return f"n/a ({reason})" if reason else "n/a"
    ci = "[n/a]" if entry.get("lo") is None else f"[{_num(entry['lo'])}, {_num(entry['hi'])}]"
    flag = " ⚠" if entry.get("unstable") else ""
    return f"{_num(entry['mean'])} {ci} ({entry['n']}){flag}"


def _short_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if reason.startswith("reference condition"):
        return "reference"
    if reason.startswith("not applicable"):
        return "not applicable"
    if reason.startswith("not recorded"):
        return None
    return reason


def _condition_table(conditions: dict[str, Any]) -> str:
    rows = []
    for cond, metrics in conditions.items():
        missing = metrics.get("not_applicable", {})
        rows.append([cond] + [_cell(metrics.get(k), _short_reason(missing.get(k))) for k, _ in CONDITION_COLUMNS])
    return _table(["condition"] + [label for _, label in CONDITION_COLUMNS], rows)


def _decomposition_table(dec: dict[str, Any]) -> str:
    missing = dec.get("not_applicable", {})
    spec = (
        ("gain_after", "G(after)", dec.get("items_neutral_set")),
        ("surface", "surface part: G(neutral)", dec.get("items_neutral_set")),
        ("semantic_vs_neutral", "semantic part: G(after) - G(neutral)", dec.get("items_neutral_set")),
        ("surface_share", "surface share: mean G(neutral) / mean G(after)", dec.get("items_neutral_set")),
        ("gain_after_success_set", "G(after)", dec.get("items_success_set")),
        ("semantic_vs_success", "semantic part: G(after) - G(success)", dec.get("items_success_set")),
    )
    rows = [[label, _cell(dec.get(key), missing.get(key)), who or ""] for key, label, who in spec]
    return _table(["quantity", "mean [95% CI] (n)", "items"], rows)


def _remedy_table(remedies: dict[str, Any], conditions: dict[str, Any]) -> str:
    rows = []
    for remedy, entry in remedies.items():
        missing = entry.get("not_applicable", {})
        cond = conditions.get(remedy, {})
        reason = (lambda k: "not applicable") if remedy in GAIN_UNDEFINED else missing.get
        rows.append([remedy] + [_cell(entry.get(k), reason(k)) for k in ("gain", "gain_after", "share_removed")]
                    + [_cell(cond.get(k)) for k in ("p_repeat", "greedy_repeat", "greedy_success", "banned_mass")])
    header = ["remedy", "G(remedy)", "G(after), same items", "share of inversion removed",
              "P(repeat)", "greedy repro", "greedy success", "banned mass"]
    notes = [f"G is not applicable to `{c}`: {reason}." for c, reason in GAIN_UNDEFINED.items() if c in remedies]
    notes += [f"`{c}`: {why}." for c, why in SAME_AS_REFERENCE.items() if c in remedies]
    notes.append("Share of the inversion removed = 1 - mean G(remedy) / mean G(after) on the items having both: "
                 "1 removes it, 0 leaves it, below 0 makes it worse.")
    return _table(header, rows) + "\n\n" + " ".join(notes)


def _sign_reading(name: str, est: dict[str, Any]) -> str:
    mean, lo, hi = est["mean"], est.get("lo"), est.get("hi")
    resolved = lo is not None and (hi < 0 or lo > 0)
    sign = "negative" if mean < 0 else "positive" if mean > 0 else "zero"
    meaning = {"negative": "the failure record made the repeat more likely (backfired)",
               "positive": "the failure record made the repeat less likely (corrected)",
               "zero": "the failure record left the repeat's probability unchanged"}[sign]
    ci = "its 95% CI excludes 0" if resolved else "but its 95% CI includes 0, so the sign is not resolved"
    return f"mean {name} = {_num(mean)} nats is {sign} ({ci}): {meaning}"


def _reading(summary: dict[str, Any]) -> str:
    conds, dec, rem = summary["conditions"], summary["decomposition"], summary["remedies"]
    after = conds.get("after", {})
    if "gain" not in after:
        return "No reading: G(after) could not be computed (no item has both 'before' and 'after')."
    lines = [_sign_reading("G(after)", after["gain"]) + "."]
    per_token, odds = after.get("gain_per_token"), after.get("odds_factor")
    if per_token and odds:
        direction = "rise" if odds["mean"] > 1 else "fall"
        lines.append(f"Per action token that is {_num(per_token['mean'])} nats: the odds of each failed-action "
                     f"token {direction} by a factor of {_num(odds['mean'])}.")
    if "share_negative" in after:
        lines.append(f"G(after) < 0 on {100 * after['share_negative']['mean']:.0f}% of "
                     f"{after['share_negative']['n']} items.")
    before = conds.get(REFERENCE, {})
    for key, what in (("p_repeat", "P(repeat) over the candidate set"), ("greedy_repeat", "Greedy exact reproduction")):
        if key in before and key in after:
            lines.append(f"{what} goes from {_num(before[key]['mean'])} before the record to "
                         f"{_num(after[key]['mean'])} after it.")
    if "surface_share" in dec:
        share = dec["surface_share"]
        caveat = " (unstable: the CI of mean G(after) includes 0)" if share.get("unstable") else ""
        lines.append(f"The neutral acknowledgement after the same verbatim call alone gives "
                     f"{100 * share['mean']:.0f}% of mean G(after){caveat}: that is the surface part.")
    shares = {r: e["share_removed"] for r, e in rem.items() if r in REMEDIES and "share_removed" in e}
    if shares:
        if after["gain"]["mean"] >= 0:
            lines.append("G(after) is not negative here, so there is no inversion to remove; the remedy shares "
                         "only compare gains.")
        parts = [f"{r} {100 * s['mean']:.0f}%{' (unstable)' if s.get('unstable') else ''}"
                 + (" (by construction)" if r in SAME_AS_REFERENCE else "") for r, s in shares.items()]
        informative = [r for r in shares if r not in SAME_AS_REFERENCE]
        best = ""
        if informative:
            best = f"; of the remedies that change the messages the largest is " \
                   f"{max(informative, key=lambda r: shares[r]['mean'])}"
        lines.append("Share of the inversion removed: " + ", ".join(parts) + best + ".")
    for cond in GAIN_UNDEFINED:
        if "p_repeat" in conds.get(cond, {}):
            lines.append(f"Under `{cond}` G is not defined; P(repeat) is {_num(conds[cond]['p_repeat']['mean'])}.")
    return "\n".join(f"- {line}" for line in lines)


def _env_section(env: str, summary: dict[str, Any]) -> str:
    boot = summary.get("bootstrap", {})
    return "\n\n".join([
        f"## Results: {env}",
        f"{summary['n_items']} items; bootstrap: {boot.get('n_boot')} resamples, seed {boot.get('seed')}.",
        "### Reading\n\n" + _reading(summary),
        "### Conditions\n\n" + _condition_table(summary["conditions"]),
        "### Decomposition\n\n" + _decomposition_table(summary["decomposition"]),
        "### Remedies\n\n" + _remedy_table(summary["remedies"], summary["conditions"]),
    ])


def _plots(out_dir: Path) -> str:
    present = [name for name in PLOT_FILES if (out_dir / name).is_file()]
    if not present:
        return "## Plots\n\nNo plot was written."
    return "## Plots\n\n" + "\n\n".join(f"### {PLOT_TITLES[name]}\n\n![{PLOT_TITLES[name]}]({name})"
                                       for name in present)


# ---------------------------------------------------------------- run metadata and the terminal headline


def skipped_counts(skipped: Sequence[Skipped], errors: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{env: {reason: count}} over source records passed over and items that could not be scored."""
    counts: dict[str, dict[str, int]] = {}
    for env, reason in [(s.env, s.reason) for s in skipped] + [(e["env"], e["reason"]) for e in errors]:
        by_reason = counts.setdefault(env, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return counts


def report_meta(config, weights: str, skipped: Sequence[Skipped], errors: Sequence[dict[str, Any]],
                 stage_seconds: dict[str, float], resumed: bool) -> dict[str, Any]:
    return {
        "weights": weights,
        "model": config.model,
        "backend": config.backend,
        "quant": config.quant,
        "seed": config.seed,
        "limit": config.limit,
        "failure_source": config.failures,
        "n_boot": config.n_boot,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(["fastscore", *sys.argv[1:]]) + (" (resumed)" if resumed else ""),
        "stage_seconds": {k: round(v, 1) for k, v in stage_seconds.items()},
        "skipped": skipped_counts(skipped, errors),
        "sandbox_note": next((note for name in config.envs
                              if (note := env_class(name).isolation_note(config.sandbox))), None),
    }


def headline(outcome) -> list[str]:
    """A few lines for the terminal: the main numbers of each environment and the measured time."""
    lines = []
    for env, s in outcome.summary.items():
        conds = s["conditions"]
        after, before = conds.get("after", {}), conds.get("before", {})
        parts = [f"{env}: {s['n_items']} items"]
        if "gain" in after:
            g, t = after["gain"], after["gain_per_token"]
            parts.append(f"G(after) = {g['mean']:.2f} nats [{_ci(g)}], {t['mean']:.3f} nats/token")
            parts.append(f"share G<0 = {after['share_negative']['mean']:.0%}")
        if "p_repeat" in before and "p_repeat" in after:
            parts.append(f"P(repeat) {before['p_repeat']['mean']:.2f} -> {after['p_repeat']['mean']:.2f}")
        if "greedy_repeat" in before and "greedy_repeat" in after:
            parts.append(f"greedy repro {before['greedy_repeat']['mean']:.0%} -> {after['greedy_repeat']['mean']:.0%}")
        lines.append("; ".join(parts))
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in outcome.stage_seconds.items())
    lines.append(f"measured time: {outcome.total_seconds:.0f} s ({stages})")
    if outcome.n_resumed:
        lines.append(f"({outcome.n_resumed} items were already complete from the interrupted run)")
    if outcome.n_item_errors:
        lines.append(f"{outcome.n_item_errors} item(s) could not be scored; reasons in the report")
    return lines


def _ci(est: dict[str, Any]) -> str:
    return "n/a" if est.get("lo") is None else f"{est['lo']:.2f}, {est['hi']:.2f}"
