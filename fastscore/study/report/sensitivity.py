"""The report's "Sensitivity" section: the harness-realism checks as changes on the headline
(fastscore.study.analysis.sensitivity).

A check that applies to no item shows "not applicable" with the reason in its cells, never a number.
"""

from __future__ import annotations

from typing import Any

from fastscore.study.report.markdown import cell, ci_pct
from fastscore.study.stages.sensitivity import CHECKS, NOT_APPLICABLE

HEADING = "## Sensitivity: harness realism"
NAMES = {"record_role": "error record in the other role", "native_tools": "native tool format"}


def _est(est: dict[str, Any]) -> str:
    if est.get("lo") is None:
        return f"{est['mean']:+.2f} (no CI)"
    return f"{est['mean']:+.2f} [{est['lo']:+.2f}, {est['hi']:+.2f}]"


def _row(group: str, check: str, entry: dict[str, Any]) -> str:
    if NOT_APPLICABLE in entry:
        cell = f"not applicable: {entry[NOT_APPLICABLE]}"
        return f"| {group} | {NAMES[check]} | 0 | {cell} | not applicable | not applicable |"
    g, d = entry["gain_per_token"], entry["delta_gain_per_token"]
    return (f"| {group} | {NAMES[check]} | {entry['n_items']} | {_est(g['default'])} → {_est(g['check'])}; "
            f"change {_est(g['change'])} | {_est(d['default'])} → {_est(d['check'])}; change {_est(d['change'])} | "
            + (", ".join(f"{n}: {r}" for r, n in entry["not_applicable_reasons"].items()) or "none") + " |")


def _counted(reasons: dict[str, int]) -> str:
    return "; ".join(f"{reason} ({n} items)" for reason, n in reasons.items()) or "no item"


def _relative(est: dict[str, Any]) -> str:
    ratio = est.get("relative_change")
    if ratio is None:
        return "not defined as a share (the study's value is 0)"
    if ratio.get("lo") is None or ratio["lo"] <= 0 <= ratio["hi"]:
        size = "no resolved change (the CI includes 0)" if ratio.get("lo") is not None else "no CI"
    else:  # a change of the study's sign shrinks it (below -100%: past 0, the sign flips); the same sign grows it
        size = "its sign flips" if ratio["mean"] < -1 else "its size shrinks" if ratio["mean"] < 0 else "its size grows"
    flag = "; unstable: the study's CI includes 0" if ratio.get("unstable") else ""
    return f"{100 * ratio['mean']:+.0f}% [{ci_pct(ratio)}] of the study's value, {size}{flag}"


def _sign(check: dict[str, Any]) -> str:
    """Whether the study's sign conclusion (G < 0: the record backfires) holds under the check."""
    lo, hi = check.get("lo"), check.get("hi")
    if check["mean"] >= 0:
        verdict = "does not hold"
    elif hi is not None and hi < 0:
        verdict = "holds (its 95% CI excludes 0)"
    else:
        verdict = "is not resolved (its 95% CI includes 0)" if lo is not None else "is not resolved (no CI)"
    return f"the sign conclusion G < 0 {verdict} under the check: G/token = {cell(check)}"


def _reading(group: str, check: str, entry: dict[str, Any]) -> str:
    """In words: the change of the headline G/token (CI, n), as a % of the study's value, and whether G < 0 holds."""
    head = f"- {group}, {NAMES[check]}:"
    if NOT_APPLICABLE in entry:
        return f"{head} not applicable, on every item: {_counted(entry['not_applicable_reasons'])}."
    g, d = entry["gain_per_token"], entry["delta_gain_per_token"]
    text = (f"{head} G/token changes by {cell(g['change'])} nats (study {cell(g['default'])}), "
            f"{_relative(g)}; {_sign(g['check'])}. The copy control ΔG/token changes by {cell(d['change'])}, "
            f"{_relative(d)}.")
    if entry.get("n_not_applicable"):
        text += f" Not applicable on {entry['n_not_applicable']} items: {_counted(entry['not_applicable_reasons'])}."
    return text


def sensitivity_section(summary: dict[str, Any]) -> str | None:
    """The section, or None when the run made no checks."""
    groups = {group: s["sensitivity"] for group, s in summary.items() if isinstance(s, dict) and "sensitivity" in s}
    if not groups:
        return None
    lines = [
        HEADING,
        "",
        "Each check rescored the items' candidate sets with the failure record written another way "
        "(scoring only, in calls of their own: the numbers above are unchanged by it). Values are per-token means "
        "with 95% bootstrap CIs over the items where the check applies, paired per item: the study's value → the "
        "check's value; change = check − study. G/token is the failed action's corrective gain per token; "
        "ΔG/token = G/token(failed) − G/token(correct), the copy control. The study's value and its CI quoted here "
        "come from the check's own paired resamples over the items where it applies, so that CI can differ slightly "
        "from the main table's (and the mean too, where the check does not apply to every item).",
        "",
        *(f"- {NAMES[c]}: {next(iter(groups.values()))[c]['description']}." for c in CHECKS),
        "",
        "| env | check | n | G/token: study → check | ΔG/token: study → check | items not applicable |",
        "|---|---|---:|---|---|---|",
    ]
    readings = []
    for group, checks in groups.items():
        for check in CHECKS:
            if check in checks:
                lines.append(_row(group, check, checks[check]))
                readings.append(_reading(group, check, checks[check]))
    lines += ["", "Reading (cells `mean [95% CI] (n)`; a share's CI in %):", *readings]
    return "\n".join(lines)
