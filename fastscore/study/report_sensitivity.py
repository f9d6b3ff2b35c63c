"""The report's "Sensitivity" section: the harness-realism checks as changes on the headline
(fastscore.study.sensitivity).

A check that applies to no item shows "not applicable" with the reason in its cells, never a number.
"""

from __future__ import annotations

from typing import Any

from fastscore.study.sensitivity import CHECKS, NOT_APPLICABLE

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


def _reading(group: str, check: str, entry: dict[str, Any]) -> str | None:
    if NOT_APPLICABLE in entry:
        return None
    change = entry["gain_per_token"]["change"]
    if change.get("lo") is None:
        return None
    if change["lo"] > 0 or change["hi"] < 0:
        verdict = f"moves G/token by {_est(change)}: the headline depends on it"
    else:
        verdict = f"leaves G/token where it was (change {_est(change)}, the CI includes 0)"
    return f"- {group}, {NAMES[check]}: {verdict}."


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
        "ΔG/token = G/token(failed) − G/token(correct), the copy control.",
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
    readings = [r for r in readings if r]
    if readings:
        lines += ["", "Reading:", *readings]
    return "\n".join(lines)
