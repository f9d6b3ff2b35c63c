"""Label contrasts, power and saturation on crafted rows whose expectations are computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastscore.study.analysis.metrics import ScoreRow, summarize
from fastscore.study.analysis.label import tie_verdict
from fastscore.study.analysis.power import (
    min_detectable_effect, n_needed, paired_se, power_multiplier, saturation,
)

# Three items; candidate 0 is the shown (failed) action (2 tokens), 1 the correct one (3 tokens), 2 and 3 the
# alternatives (4 and 5 tokens, never shown).
SHOWN = {"before": [-10.0, -12.0, -8.0], "after": [-6.0, -9.0, -7.0], "success": [-5.0, -8.0, -4.0],
         "neutral": [-6.0, -10.0, -6.0]}
CORRECT = {"before": -5.0, "after": -4.0, "success": -4.5, "neutral": -4.0}
ALTS = {"before": (-20.0, -30.0), "after": (-18.0, -28.0), "success": (-20.0, -30.0), "neutral": (-19.0, -29.0)}
GREEDY = {"after": [False, False, False], "success": [True, True, False], "neutral": [False, True, False],
          "before": [False, False, False]}


def crafted(p_repeat: float = 0.5) -> list[ScoreRow]:
    rows = []
    for cond, lps in SHOWN.items():
        for i, lp in enumerate(lps):
            rows.append(ScoreRow(
                item_id=f"i{i}", env="tools", condition=cond, lp=lp, n_tokens=2,
                cand_lp=(lp, CORRECT[cond], *ALTS[cond]), cand_n_tokens=(2, 3, 4, 5), p_repeat=p_repeat,
                p_repeat_norm=0.5, greedy_repeat=GREEDY[cond][i], greedy_repeat_semantic=GREEDY[cond][i]))
    return rows


def test_label_effect_copying_and_differential_copy_match_hand_values():
    label = summarize(crafted(), seed=0, n_boot=200)["tools"]["label"]
    # failure-specific: lp(shown | after) - lp(shown | success) = [-1, -1, -3]
    fs = label["label_effect"]["after-success"]["shown"]
    assert fs["per_call"]["mean"] == pytest.approx(-5 / 3)
    assert fs["per_token"]["mean"] == pytest.approx(-5 / 6)
    assert fs["per_call"]["n"] == 3
    # after - neutral: [0, -1... ] = [-6+6, -9+10, -7+6] = [0, 1, -1]
    assert label["label_effect"]["after-neutral"]["shown"]["per_call"]["mean"] == pytest.approx(0.0)
    # the correct action under after vs success: -4 - (-4.5) = 0.5 on every item
    assert label["label_effect"]["after-success"]["correct"]["per_call"]["mean"] == pytest.approx(0.5)
    assert label["label_effect"]["after-success"]["correct"]["per_token"]["mean"] == pytest.approx(0.5 / 3)
    # copying: lift of the shown action under neutral = [4, 2, 2]
    assert label["lift"]["neutral"]["shown"]["per_call"]["mean"] == pytest.approx(8 / 3)
    # alternatives: mean lp -25 -> -23 under after (per call +2); per token mean(-5, -6) -> mean(-4.5, -5.6)
    assert label["lift"]["after"]["alternative"]["per_call"]["mean"] == pytest.approx(2.0)
    assert label["lift"]["after"]["alternative"]["per_token"]["mean"] == pytest.approx(-5.05 + 5.5)
    # differential copy under after: lift(shown) [4, 3, 1] - lift(correct) 1 = [3, 2, 0]; it is -ΔG
    dc = label["differential_copy"]["after"]["per_call"]["mean"]
    assert dc == pytest.approx(5 / 3)
    after = summarize(crafted(), seed=0, n_boot=200)["tools"]["conditions"]["after"]
    assert after["delta_gain"]["mean"] == pytest.approx(-dc)


def test_repeat_difference_is_paired_per_item():
    label = summarize(crafted(), seed=0, n_boot=200)["tools"]["label"]
    # greedy repeats after [0, 0, 0] vs success [1, 1, 0]: mean difference -2/3
    diff = label["repeat_difference"]["after-success"]["greedy_repeat_semantic"]
    assert diff["mean"] == pytest.approx(-2 / 3)
    assert diff["n"] == 3


def test_power_fields_are_the_hand_computed_mde_and_n_needed():
    fs = summarize(crafted(), seed=0, n_boot=200)["tools"]["label"]["label_effect"]["after-success"]["shown"]
    # d = [-1, -1, -3]: sd = sqrt(4/3), SE = sd / sqrt(3) = 2/3
    z = 1.959964 + 0.841621
    assert power_multiplier() == pytest.approx(z, abs=1e-5)
    assert fs["per_call"]["mde"] == pytest.approx(z * 2 / 3, rel=1e-5)
    assert math.ceil((z * math.sqrt(4 / 3) / (5 / 3)) ** 2) == 4
    assert fs["per_call"]["n_needed"] == 5  # never below the 5 items a direction needs
    noisy = np.array([1.0, -0.5, 2.0, -1.0, 0.5])  # mean 0.4, sd sqrt(1.425)
    assert n_needed(noisy) == math.ceil((z * math.sqrt(1.425) / 0.4) ** 2) == 70
    d = np.array([-1.0, -1.0, -3.0, np.nan])
    assert paired_se(d) == pytest.approx(2 / 3)
    assert min_detectable_effect(d) == pytest.approx(z * 2 / 3, rel=1e-5)
    # Fewer items cannot give a spread; a zero mean cannot be detected at any n; identical differences give no SE.
    assert paired_se(np.array([1.0])) is None and n_needed(np.array([1.0, -1.0])) is None
    assert n_needed(np.array([0.5, 0.5, 0.5])) is None and min_detectable_effect(np.array([0.5, 0.5])) is None
    # Quadrupling n with the same spread halves the MDE.
    big = np.tile([-1.0, -1.0, -3.0], 4)
    assert min_detectable_effect(big) < min_detectable_effect(d)


def test_saturated_metrics_say_so():
    assert saturation(np.array([1.0, 1.0, np.nan])) == "upper"
    assert saturation(np.array([0.0, 0.0])) == "lower"
    assert saturation(np.array([0.0, 1.0])) is None
    conds = summarize(crafted(p_repeat=1.0), seed=0, n_boot=100)["tools"]["conditions"]
    assert "saturated" in conds["after"]["p_repeat"]
    assert "saturated" in conds["after"]["greedy_repeat"]  # 0/3: at the lower bound
    assert "saturated" not in conds["success"]["greedy_repeat"]  # 2/3
    # A difference between two records at the same bound is no finding either; one at a bound against one off it is.
    repeats = summarize(crafted(p_repeat=1.0), seed=0, n_boot=100)["tools"]["label"]["repeat_difference"]
    assert "saturated" in repeats["after-neutral"]["p_repeat"]
    assert "saturated" not in repeats["after-success"]["greedy_repeat"]


def test_ties_and_tiny_samples_are_never_ranked():
    assert tie_verdict({"lo": -0.1, "hi": 0.2, "n": 9}, "up", "down").startswith("not resolved")
    assert tie_verdict({"lo": 0.1, "hi": 0.2, "n": 9}, "up", "down") == "up"
    assert tie_verdict({"lo": -0.3, "hi": -0.2, "n": 9}, "up", "down") == "down"
    assert tie_verdict({"lo": None, "hi": None, "n": 9}, "up", "down").startswith("not resolved")
    assert tie_verdict({"lo": 0.1, "hi": 0.2, "n": 4}, "up", "down") == "not resolved: fewer than 5 items"


def test_clean_retry_is_exp_lp_before_by_construction_and_compared_pairwise():
    before, after = [math.log(0.2), math.log(0.4)] * 3, [math.log(0.1), math.log(0.1)] * 3
    rows = []
    for cond, lps in (("before", before), ("after", after), ("clean_retry", before)):
        for i, lp in enumerate(lps):
            rows.append(ScoreRow(item_id=f"i{i}", env="tools", condition=cond, lp=lp, n_tokens=2,
                                 cand_lp=(lp, -5.0), cand_n_tokens=(2, 3), p_repeat=0.5, p_repeat_norm=0.5,
                                 sampled_k=8 if cond == "clean_retry" else None,
                                 sampled_repeat=2 if cond == "clean_retry" else None))
    retry = summarize(rows, seed=0, n_boot=200)["tools"]["clean_retry"]
    assert retry["p_sample_repeat"]["mean"] == pytest.approx(0.3)
    assert "by construction" in retry["p_sample_repeat"]["note"]
    assert retry["minus"]["after"]["mean"] == pytest.approx(0.2)  # (0.1 + 0.3) / 2
    assert retry["minus"]["after"]["ranking"] == "clean retry repeats more than after"  # every item +: CI > 0
    # seeded runs have no clean retry rows: no entry
    assert "clean_retry" not in summarize(crafted(), seed=0, n_boot=50)["tools"]


def test_actions_cut_by_the_harness_are_scored_without_the_end_of_turn_they_never_emitted(tmp_path):
    # Item 0's attempt ended its turn; item 1's was cut after the action (action_done): its last scored token, the
    # end-of-turn, is dropped under every condition. Token lps: [action..., end-of-turn].
    tokens = {"before": [(-3.0, -1.0), (-2.0, -4.0)], "after": [(-1.0, -0.5), (-1.0, -0.5)],
              "success": [(-1.5, -0.2), (-2.5, -0.1)]}
    cuts = ["end_of_turn", "action_done"]
    rows = [ScoreRow(item_id=f"i{i}", env="mbpp", condition=cond, lp=sum(t), n_tokens=2, cand_lp=(sum(t), -9.0),
                     cand_n_tokens=(2, 3), p_repeat=0.5, p_repeat_norm=0.5, token_lp=t, action_cut=cuts[i],
                     scored_end_of_turn=True, failure_kind="model")
            for cond, by_item in tokens.items() for i, t in enumerate(by_item)]
    summary = summarize(rows, seed=0, n_boot=100)["mbpp"]
    cut = summary["as_cut"]
    assert cut["n_cut_before_end_of_turn"] == 1 and cut["n_items"] == 2
    # G(after): item 0 as scored (-4) - (-1.5) = -2.5 over 2 tokens; item 1 cut: -2 - (-1) = -1 over 1 token
    assert cut["gain_after"]["mean"] == pytest.approx((-2.5 - 1.0) / 2)
    assert cut["gain_after_per_token"]["mean"] == pytest.approx((-1.25 - 1.0) / 2)
    # after - success: item 0 -1.5 - (-1.7) = 0.2; item 1 cut: -1 - (-2.5) = 1.5
    assert cut["after-success_per_call"]["mean"] == pytest.approx((0.2 + 1.5) / 2)
    # as scored, the end-of-turn counts: item 1 after - success = -1.5 - (-2.6) = 1.1
    fs = summary["label"]["label_effect"]["after-success"]["shown"]["per_call"]["mean"]
    assert fs == pytest.approx((0.2 + 1.1) / 2)
    assert "as_cut" not in summarize(crafted(), seed=0, n_boot=50)["tools"]  # seeded: nothing was cut
    from fastscore.study.report.document import write_report

    text = write_report({"mbpp": summary}, tmp_path, {}).read_text()
    assert "Scored up to the harness's cut: 1 of 2 of the model's attempts did not end their turn" in text


def test_tiny_exact_probabilities_are_values_not_a_saturated_bound():
    rows = [r for r in crafted() if r.condition in ("before", "after")]
    tiny = [ScoreRow(**{**r.__dict__, "lp": r.lp - 40.0, "cand_lp": (r.lp - 40.0, *r.cand_lp[1:])}) for r in rows]
    conds = summarize(tiny, seed=0, n_boot=50)["tools"]["conditions"]
    assert conds["after"]["p_sample_repeat"]["mean"] < 1e-15
    assert "saturated" not in conds["after"]["p_sample_repeat"]


def test_showing_the_action_is_contrasted_with_describing_it():
    rows = crafted() + [ScoreRow(item_id=f"i{i}", env="tools", condition="description", lp=lp, n_tokens=2,
                                 cand_lp=(lp, -5.0, -20.0, -30.0), cand_n_tokens=(2, 3, 4, 5), p_repeat=0.1,
                                 p_repeat_norm=0.1) for i, lp in enumerate([-11.0, -12.0, -10.0])]
    label = summarize(rows, seed=0, n_boot=100)["tools"]["label"]
    # neutral [-6, -10, -6] - description [-11, -12, -10] = [5, 2, 4]
    assert label["label_effect"]["neutral-description"]["shown"]["per_call"]["mean"] == pytest.approx(11 / 3)
    assert "description" not in label["differential_copy"]  # it shows no action to copy


def test_the_failure_vs_success_answer_needs_a_ci_and_enough_items():
    from fastscore.study.report.label import failure_vs_success_answer

    def label(lo, hi, n):
        est = {"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "n": n, "mde": 1.5, "n_needed": 40}
        return {"label_effect": {"after-success": {"shown": {"per_call": est, "per_token": est}}}}

    assert "**yes**" in failure_vs_success_answer(label(0.2, 0.9, 20), "Q")
    assert "**no**" in failure_vs_success_answer(label(-0.9, -0.2, 20), "Q")
    tie = failure_vs_success_answer(label(-0.9, 0.2, 20), "Q")
    assert "cannot answer at this n (the 95% CI includes 0; the smallest effect it would detect" in tie
    assert "would need n = 40" in tie
    assert "cannot answer at this n (fewer than 5 items" in failure_vs_success_answer(label(0.2, 0.9, 3), "Q")
    assert "cannot answer" in failure_vs_success_answer({}, "Q")
