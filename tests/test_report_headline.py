"""The terminal headline: every number with its stored interval and n; greedy reproduction before the record is
"not applicable" under the model's own failures (the failed action is that greedy completion), a number otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastscore.study.report.document import headline
from fastscore.study.sources import StudyOutcome


def _est(mean, lo, hi, n=20):
    return {"mean": mean, "lo": lo, "hi": hi, "n": n}


SUMMARY = {"tools": {"n_items": 20, "conditions": {
    "before": {"p_repeat": _est(0.06, 0.04, 0.09), "greedy_repeat": _est(1.0, 0.839, 1.0)},
    "after": {"gain": _est(-3.2, -4.1, -2.3), "gain_per_token": _est(-0.41, -0.52, -0.3),
              "share_negative": _est(0.9, 0.699, 0.972), "delta_gain": _est(-1.5, -2.25, -0.75, 19),
              "p_repeat": _est(0.54, 0.45, 0.62), "greedy_repeat": _est(0.15, 0.052, 0.36)},
}}}
GREEDY_BEFORE = "1.000 [0.839, 1.000] (20)"


def _outcome(summary=SUMMARY, by_source=None):
    return StudyOutcome(Path("out"), {"tools": 20}, 0, 0, summary, {"score": 12.0}, 12.0, (), by_source=by_source)


def test_every_number_has_its_interval_and_n():
    line = headline(_outcome(), "seeded")[0]
    for text in ("tools: 20 items", "G(after) = -3.200 [-4.100, -2.300] (20) nats",
                 "-0.410 [-0.520, -0.300] (20) nats/token", "share G<0 = 0.900 [0.699, 0.972] (20) (Wilson)",
                 "ΔG = G(failed) - G(correct) = -1.500 [-2.250, -0.750] (19) nats",
                 "P(repeat) 0.060 [0.040, 0.090] (20) -> 0.540 [0.450, 0.620] (20)",
                 f"greedy repro (Wilson) {GREEDY_BEFORE} -> 0.150 [0.052, 0.360] (20)"):
        assert text in line
    assert "not applicable" not in line


def test_greedy_reproduction_before_is_not_applicable_under_the_model_s_own_failures():
    line = headline(_outcome(), "model")[0]
    assert ("greedy repro (Wilson) not applicable (the model's own attempt: by construction) "
            "-> 0.150 [0.052, 0.360] (20)") in line
    assert GREEDY_BEFORE not in line
    assert "P(repeat) 0.060 [0.040, 0.090] (20) ->" in line  # P(repeat) before is measured, not constructed


def test_both_sources_each_say_what_holds_by_construction():
    lines = headline(_outcome(by_source={"seeded": _outcome(), "model": _outcome()}))
    seeded = next(x for x in lines if x.startswith("[seeded] tools"))
    model = next(x for x in lines if x.startswith("[model] tools"))
    assert GREEDY_BEFORE in seeded and "not applicable" not in seeded
    assert GREEDY_BEFORE not in model and "not applicable (the model's own attempt" in model


def test_a_single_source_outcome_needs_its_failure_source():
    with pytest.raises(TypeError, match="failure source"):
        headline(_outcome())


def test_the_pooled_estimate_has_its_own_line_with_intervals_and_n():
    pooled = {"envs": ["tools", "mbpp"], "n_items": 40, "gain_per_token": _est(-1.19, -1.32, -1.07, 40),
              "delta_gain_per_token": _est(-0.46, -0.63, -0.32, 40), "share_negative": _est(1.0, 0.912, 1.0, 40)}
    lines = headline(_outcome({**SUMMARY, "pooled": pooled}), "seeded")
    assert lines[1] == ("pooled (tools + mbpp): 40 items; G(after) = -1.190 [-1.320, -1.070] (40) nats/token; "
                        "differential copy ΔG = -0.460 [-0.630, -0.320] (40) nats/token; share G<0 = 1.000 [0.912, 1.000] (40) (Wilson)")
    assert not any(line.startswith("pooled") for line in headline(_outcome(), "seeded"))


def test_a_percent_interval_never_prints_minus_zero():
    from fastscore.study.report.markdown import ci_pct

    assert ci_pct({"lo": -0.001, "hi": 0.03}) == "0, 3%"
    assert ci_pct({"lo": -0.35, "hi": -0.06}) == "-35, -6%"
    assert ci_pct({"lo": None}) == "n/a"
