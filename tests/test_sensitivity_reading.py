"""The Sensitivity section's Reading in words: each check's change of the headline G/token (CI, n), that change as a
share of the study's value, and whether the sign conclusion G < 0 holds; "not applicable" with the counted reason."""

from __future__ import annotations

import math

from fastscore.study.report.sensitivity import sensitivity_section
from fastscore.study.analysis.sensitivity import summarize_sensitivity
from fastscore.study.stages.sensitivity import NO_TOOLS_TEMPLATE, NOT_APPLICABLE


def _est(mean, lo, hi, n=12, **extra):
    return {"mean": mean, "lo": lo, "hi": hi, "n": n, **extra}


def _check(check_gain, n_not_applicable=0):
    gain = {"default": _est(-0.8, -1.0, -0.6), "check": check_gain, "change": _est(0.12, 0.03, 0.2),
            "relative_change": _est(-0.15, -0.25, -0.04, unstable=False)}
    delta = {"default": _est(-0.3, -0.5, -0.1), "check": _est(-0.2, -0.4, 0.0), "change": _est(0.1, -0.05, 0.25),
             "relative_change": _est(-0.333, -0.9, 0.2, unstable=False)}
    reasons = {"a candidate does not parse as a call (syntax_error)": n_not_applicable} if n_not_applicable else {}
    return {"description": "d", "n_items": 12, "n_not_applicable": n_not_applicable,
            "not_applicable_reasons": reasons, "gain_per_token": gain, "delta_gain_per_token": delta}


NATIVE_NA = {"description": "d", "n_items": 0, "n_not_applicable": 20,
             "not_applicable_reasons": {NO_TOOLS_TEMPLATE: 20}, NOT_APPLICABLE: NO_TOOLS_TEMPLATE}


def _reading(check_gain, n_not_applicable=0) -> list[str]:
    summary = {"tools": {"sensitivity": {"record_role": _check(check_gain, n_not_applicable),
                                         "native_tools": NATIVE_NA}}}
    text = sensitivity_section(summary)
    return text.split("\nReading")[1].splitlines()[1:]


def test_the_reading_states_the_change_its_share_of_the_study_and_the_sign():
    role, native = _reading(_est(-0.68, -0.9, -0.45), n_not_applicable=3)
    assert role.startswith("- tools, error record in the other role: G/token changes by 0.120 [0.030, 0.200] (12) "
                           "nats (study -0.800 [-1.000, -0.600] (12)), -15% [-25, -4%] of the study's value, its size "
                           "shrinks; the sign conclusion G < 0 holds (its 95% CI excludes 0) under the check: "
                           "G/token = -0.680 [-0.900, -0.450] (12).")
    assert ("The copy control ΔG/token changes by 0.100 [-0.050, 0.250] (12), -33% [-90, 20%] of the study's value, "
            "no resolved change (the CI includes 0).") in role
    assert role.endswith("Not applicable on 3 items: a candidate does not parse as a call (syntax_error) (3 items).")
    assert native == (f"- tools, native tool format: not applicable, on every item: {NO_TOOLS_TEMPLATE} (20 items).")
    assert "G/token" not in native


def test_the_sign_conclusion_follows_the_check_s_interval():
    unresolved = _reading(_est(-0.1, -0.3, 0.1))[0]
    assert "the sign conclusion G < 0 is not resolved (its 95% CI includes 0) under the check" in unresolved
    flipped = _reading(_est(0.2, 0.05, 0.35))[0]
    assert "the sign conclusion G < 0 does not hold under the check: G/token = 0.200 [0.050, 0.350] (12)" in flipped
    assert "Not applicable on" not in flipped


def _set(lp_failed, n_failed, lp_correct, n_correct):
    return {"cand_lp": [lp_failed, lp_correct, -9.0, -9.0], "cand_n_tokens": [n_failed, n_correct, 3, 3]}


def test_the_share_of_the_study_s_value_is_the_mean_change_over_the_mean_study_value():
    default = {"a": [{"conditions": {"before": _set(-10.0, 4, -6.0, 4), "after": _set(-6.0, 4, -4.0, 4)}}],
               "b": [{"conditions": {"before": _set(-12.0, 6, -8.0, 4), "after": _set(-9.0, 6, -7.0, 4)}}]}
    records = [{"item_id": i, "env": "tools", "checks": {"record_role": {"sets": {"after": after}},
                                                         "native_tools": {NOT_APPLICABLE: NO_TOOLS_TEMPLATE}}}
               for i, after in (("a", _set(-8.0, 4, -5.0, 4)), ("b", _set(-9.0, 6, -7.0, 4)))]
    out = summarize_sensitivity(default, records, ["tools"], seed=0, n_boot=200)["tools"]
    # Study G/tok: a -1, b -0.5 (mean -0.75); change: a +0.5, b 0 (mean +0.25): -1/3 of the study's value.
    relative = out["record_role"]["gain_per_token"]["relative_change"]
    assert math.isclose(relative["mean"], 0.25 / -0.75) and relative["n"] == 2
    assert relative["lo"] <= relative["mean"] <= relative["hi"]
    native = out["native_tools"]
    assert native["not_applicable_reasons"] == {NO_TOOLS_TEMPLATE: 2} and "gain_per_token" not in native
    line = next(x for x in sensitivity_section({"tools": {"sensitivity": out}}).splitlines()
                if x.startswith("- tools, error record"))
    ratio = f"{100 * relative['lo']:.0f}, {100 * relative['hi']:.0f}%"
    assert f"-33% [{ratio}] of the study's value" in line


def test_the_section_says_where_the_study_value_s_ci_comes_from():
    summary = {"tools": {"sensitivity": {"record_role": _check(_est(-0.68, -0.9, -0.45)), "native_tools": NATIVE_NA}}}
    intro = sensitivity_section(summary).split("\nReading")[0]
    assert ("The study's value and its CI quoted here come from the check's own paired resamples over the items "
            "where it applies, so that CI can differ slightly from the main table's") in intro
