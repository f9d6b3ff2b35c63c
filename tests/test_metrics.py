"""Study metrics on crafted numbers: known means and signs, identities, bootstrap behaviour, JSON safety."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fastscore.errors import DataError
from fastscore.study.analysis.metrics import (
    CONDITIONS,
    ScoreRow,
    bootstrap_ci,
    bootstrap_means,
    candidate_probabilities,
    corrective_gain,
    ratio_ci,
    read_score_rows,
    resample_indices,
    summarize,
)


def row(item: str, cond: str, lp: float, env: str = "tools", n_tokens: int = 2, **extra) -> ScoreRow:
    fields = dict(cand_lp=(lp, -5.0), cand_n_tokens=(n_tokens, 3), p_repeat=0.5, p_repeat_norm=0.5)
    fields.update(extra)
    return ScoreRow(item_id=item, env=env, condition=cond, lp=lp, n_tokens=n_tokens, **fields)


def rows_from(lps: dict[str, list[float]], env: str = "tools", n_tokens: int = 2) -> list[ScoreRow]:
    """lps[cond][i] is item i's lp under cond (NaN = the item lacks that condition)."""
    return [row(f"i{i}", cond, lp, env, n_tokens) for cond, values in lps.items()
            for i, lp in enumerate(values) if not math.isnan(lp)]


def crafted_study(n: int = 60, seed: int = 3) -> list[ScoreRow]:
    rng = np.random.default_rng(seed)
    before = -20 + rng.normal(size=n)
    lps = {"before": before, "after": before + 3 + rng.normal(size=n), "neutral": before + 2 + rng.normal(size=n),
           "success": before + 2.5 + rng.normal(size=n), "description": before + 0.5 + rng.normal(size=n),
           "dont_repeat": before + 3 + rng.normal(size=n), "clean_retry": before + 4 + rng.normal(size=n)}
    return rows_from({c: list(v) for c, v in lps.items()})


def test_gain_means_sign_odds_and_share_negative_on_known_numbers():
    # G(after) = before - after = [-4, -2, -3, +2]: mean -1.75, per token (2 tokens) -0.875, 3 of 4 negative.
    rows = rows_from({"before": [-10, -10, -10, -10], "after": [-6, -8, -7, -12]})
    after = summarize(rows, seed=0, n_boot=300)["tools"]["conditions"]["after"]
    assert after["gain"]["mean"] == pytest.approx(-1.75)
    assert after["gain"]["n"] == 4
    assert after["gain_per_token"]["mean"] == pytest.approx(-0.875)
    assert after["odds_factor"]["mean"] == pytest.approx(math.exp(0.875))
    # The odds CI is the transformed per-token CI, bounds swapped by the decreasing exp(-x).
    assert after["odds_factor"]["lo"] == pytest.approx(math.exp(-after["gain_per_token"]["hi"]))
    assert after["odds_factor"]["hi"] == pytest.approx(math.exp(-after["gain_per_token"]["lo"]))
    assert after["share_negative"]["mean"] == pytest.approx(0.75)
    assert corrective_gain(np.array([-10.0]), np.array([-6.0]))[0] == -4.0  # more likely after: negative G


def test_per_token_gain_uses_the_conditions_own_token_count():
    rows = [row("a", "before", -10.0, n_tokens=4), row("a", "after", -6.0, n_tokens=2)]
    after = summarize(rows, seed=0, n_boot=50)["tools"]["conditions"]["after"]
    assert after["gain_per_token"]["mean"] == pytest.approx(-2.0)


def test_decomposition_identity_holds_on_a_common_item_set():
    lps = {c: [r.lp for r in crafted_study() if r.condition == c] for c in ("before", "after", "neutral", "success")}
    lps["neutral"][5] = math.nan  # item 5 lacks neutral: excluded from the whole neutral identity
    dec = summarize(rows_from(lps), seed=1, n_boot=400)["tools"]["decomposition"]
    assert dec["surface"]["n"] == dec["gain_after"]["n"] == dec["semantic_vs_neutral"]["n"] == 59
    print("identity residual", dec["surface"]["mean"] + dec["semantic_vs_neutral"]["mean"] - dec["gain_after"]["mean"])
    assert dec["surface"]["mean"] + dec["semantic_vs_neutral"]["mean"] == pytest.approx(dec["gain_after"]["mean"])
    assert dec["surface_share"]["mean"] == pytest.approx(dec["surface"]["mean"] / dec["gain_after"]["mean"])
    assert dec["semantic_vs_success"]["n"] == 60
    assert dec["gain_after_success_set"]["n"] == 60


def test_remedy_share_is_one_for_zero_gain_and_zero_for_a_copy_of_after():
    before = [-10.0, -11.0, -9.0, -12.0, -10.5]
    after = [-7.0, -9.0, -5.0, -11.0, -6.0]
    rows = rows_from({"before": before, "after": after, "description": before, "dont_repeat": after})
    remedies = summarize(rows, seed=0, n_boot=300)["tools"]["remedies"]
    gone, kept = remedies["description"]["share_removed"], remedies["dont_repeat"]["share_removed"]
    # Shared resamples keep numerator and denominator paired, so even the CIs are exact here.
    assert (gone["mean"], gone["lo"], gone["hi"]) == pytest.approx((1.0, 1.0, 1.0))
    assert (kept["mean"], kept["lo"], kept["hi"]) == pytest.approx((0.0, 0.0, 0.0))
    assert gone["unstable"] is False and gone["n"] == 5
    assert "clean_retry" in remedies and "share_removed" in remedies["clean_retry"]["not_applicable"]


def test_bootstrap_ci_contains_mean_is_seeded_and_narrows_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.normal(1.0, 2.0, 20), rng.normal(1.0, 2.0, 2000)
    est_small = bootstrap_ci(small, resample_indices(20, 1000, 7))
    est_large = bootstrap_ci(large, resample_indices(2000, 1000, 7))
    assert est_small.lo < est_small.mean < est_small.hi
    assert est_large.lo < est_large.mean < est_large.hi
    print("CI widths", est_small.hi - est_small.lo, est_large.hi - est_large.lo)
    assert est_large.hi - est_large.lo < (est_small.hi - est_small.lo) / 3
    assert bootstrap_ci(small, resample_indices(20, 1000, 7)) == est_small
    assert bootstrap_ci(small, resample_indices(20, 1000, 8)) != est_small


def test_summary_is_deterministic_per_seed():
    rows = crafted_study()
    assert summarize(rows, seed=5, n_boot=300) == summarize(rows, seed=5, n_boot=300)
    a = summarize(rows, seed=5, n_boot=300)["tools"]["conditions"]["after"]["gain"]
    b = summarize(rows, seed=6, n_boot=300)["tools"]["conditions"]["after"]["gain"]
    assert a["mean"] == b["mean"] and (a["lo"], a["hi"]) != (b["lo"], b["hi"])


def test_bootstrap_means_skip_missing_items_like_a_loop_would():
    values = np.array([1.0, np.nan, 3.0, 10.0, np.nan])
    idx = resample_indices(5, 50, 0)
    expected = []
    for resample in idx:
        picked = [values[i] for i in resample if not np.isnan(values[i])]
        expected.append(np.mean(picked) if picked else np.nan)
    np.testing.assert_allclose(bootstrap_means(values, idx), expected)
    assert bootstrap_ci(values, idx).n == 3


def test_ratio_with_denominator_near_zero_is_a_number_flagged_unstable():
    idx = resample_indices(40, 500, 0)
    den = np.tile([-1.0, 1.05], 20)  # mean 0.025, CI straddles 0
    num = np.tile([0.5, 0.4], 20)
    shaky = ratio_ci(num, den, idx)
    assert math.isfinite(shaky.mean) and shaky.unstable is True
    assert shaky.mean == pytest.approx(0.45 / 0.025)
    steady = ratio_ci(num, den + 5.0, idx)
    assert steady.unstable is False


def test_missing_conditions_leave_no_nan_and_n_says_so():
    lps = {"before": [-10, -10, math.nan, -10], "after": [-6, math.nan, -7, -9], "success": [-9, -9, -9, -9]}
    rows = rows_from(lps) + rows_from({"before": [-5.0]}, env="mbpp")
    summary = summarize(rows, seed=0, n_boot=200)
    json.dumps(summary, allow_nan=False)
    tools = summary["tools"]
    assert tools["n_items"] == 4
    assert tools["conditions"]["after"]["gain"]["n"] == 2  # items 0 and 3 have both before and after
    assert tools["conditions"]["after"]["p_repeat"]["n"] == 3
    assert "neutral" not in tools["conditions"]
    assert "surface" in tools["decomposition"]["not_applicable"]
    mbpp = summary["mbpp"]
    assert list(mbpp["conditions"]) == ["before"]
    assert "gain" in mbpp["conditions"]["before"]["not_applicable"]
    assert set(mbpp["remedies"]["description"]["not_applicable"]) == {"gain", "gain_after", "share_removed"}


def test_ban_reports_repeat_greedy_and_banned_mass_but_no_gain():
    rows = rows_from({"before": [-10.0, -12.0], "after": [-6.0, -8.0]})
    for item, greedy_repeat in (("i0", False), ("i1", False)):
        cand = (-math.inf, -3.0)
        p, p_norm = candidate_probabilities(cand, (2, 3))
        rows.append(ScoreRow(item, "tools", "ban", -math.inf, 2, cand, (2, 3), p, p_norm, greedy="x = 1",
                             greedy_repeat=greedy_repeat, greedy_success=item == "i1", banned_mass=0.25))
    summary = summarize(rows, seed=0, n_boot=200)
    json.dumps(summary, allow_nan=False)
    ban = summary["tools"]["conditions"]["ban"]
    assert ban["p_repeat"]["mean"] == 0.0 and ban["p_repeat_norm"]["mean"] == 0.0
    assert ban["greedy_repeat"]["mean"] == 0.0 and ban["greedy_success"]["mean"] == 0.5
    assert ban["banned_mass"]["mean"] == pytest.approx(0.25)
    assert {"gain", "gain_per_token", "odds_factor", "share_negative"} <= set(ban["not_applicable"])
    assert "gain" not in ban
    assert "share_removed" in summary["tools"]["remedies"]["ban"]["not_applicable"]


def test_candidate_probabilities_by_sum_and_per_token():
    cand_lp = (math.log(0.2), math.log(0.6), math.log(0.2))
    p, p_norm = candidate_probabilities(cand_lp, (1, 1, 1))
    assert p == pytest.approx(0.2) and p_norm == pytest.approx(0.2)
    p, p_norm = candidate_probabilities((-4.0, -3.0), (4, 1))  # per token: -1 vs -3
    assert p == pytest.approx(1 / (1 + math.e)) and p_norm == pytest.approx(1 / (1 + math.exp(-2)))


def test_score_rows_round_trip_through_jsonl_with_infinity_as_null(tmp_path):
    rows = [row("a", "before", -3.5, greedy="f()", greedy_repeat=True, greedy_success=False),
            ScoreRow("a", "mbpp", "ban", -math.inf, 3, (-math.inf, -2.0), (3, 4), 0.0, 0.0, banned_mass=0.4)]
    path = tmp_path / "scores.jsonl"
    path.write_text("".join(json.dumps(r.to_dict(), allow_nan=False) + "\n" for r in rows))
    assert "Infinity" not in path.read_text() and "NaN" not in path.read_text()
    assert read_score_rows(path) == rows
    path.write_text(path.read_text() + '{"item_id": "b"}\n')
    with pytest.raises(DataError, match=":3:"):
        read_score_rows(path)


@pytest.mark.parametrize("bad", [
    dict(condition="later"), dict(env="web"), dict(lp=float("nan")), dict(lp=-math.inf), dict(n_tokens=0),
    dict(p_repeat=1.5), dict(cand_n_tokens=(1,)),
])
def test_malformed_rows_are_rejected(bad):
    fields = dict(item_id="a", env="tools", condition="after", lp=-1.0, n_tokens=2, cand_lp=(-1.0, -2.0),
                  cand_n_tokens=(2, 2), p_repeat=0.7, p_repeat_norm=0.6)
    fields.update(bad)
    with pytest.raises(DataError):
        ScoreRow(**fields)


def test_duplicate_rows_are_rejected():
    with pytest.raises(DataError, match="duplicate"):
        summarize([row("a", "before", -1.0), row("a", "before", -2.0)], n_boot=10)


def test_full_summary_covers_every_condition_and_is_json_safe():
    rows = crafted_study()
    summary = summarize(rows, seed=0, n_boot=200)
    text = json.dumps(summary, allow_nan=False)
    # clean_retry rows without sampled retries (seeded failures) hold only by-construction numbers: left out.
    assert set(summary["tools"]["conditions"]) == set(CONDITIONS) - {"ban", "clean_retry"}
    assert "not applicable under seeded failures" in \
        summary["tools"]["remedies"]["clean_retry"]["not_applicable"]["share_removed"]
    after = summary["tools"]["conditions"]["after"]["gain"]
    assert after["hi"] < 0  # crafted: the record raises lp by ~3 nats, so G(after) < 0
    assert "NaN" not in text and "Infinity" not in text


def test_wilson_intervals_match_hand_values_and_replace_the_bootstrap_for_shares():
    from fastscore.study.analysis.stats import wilson_interval

    # Hand values (z = 1.95996): 20/20 -> [0.8389, 1]; 2/20 -> [0.0279, 0.3010]; 0/20 -> [0, 0.1611].
    assert wilson_interval(20, 20) == pytest.approx((0.83887, 1.0), abs=1e-5)
    assert wilson_interval(2, 20) == pytest.approx((0.02787, 0.30103), abs=1e-5)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.16113), abs=1e-5)
    rows = rows_from({"before": [-10.0] * 20, "after": [-6.0] * 20})
    share = summarize(rows, seed=0, n_boot=100)["tools"]["conditions"]["after"]["share_negative"]
    assert (share["mean"], share["n"]) == (1.0, 20)
    assert share["lo"] == pytest.approx(0.83887, abs=1e-5) and share["hi"] == 1.0


def test_copy_control_differential_gain_and_token_split_from_stored_candidate_lps():
    # One item, hand-checked. Failed action: 3 tokens, the middle one is the edit; correct action: 3 tokens.
    # before: failed tokens [-2, -6, -1] (sum -9), correct -4; after: failed [-1, -2, -0.5] (sum -3.5), correct -2.
    def scored(cond, failed_tokens, correct_lp):
        lp = sum(failed_tokens)
        cand = (lp, correct_lp)
        p, p_norm = candidate_probabilities(cand, (3, 3))
        return ScoreRow("a", "tools", cond, lp, 3, cand, (3, 3), p, p_norm, failure_kind="wrong_type",
                        token_lp=failed_tokens, token_edited=(False, True, False))

    rows = [scored("before", (-2.0, -6.0, -1.0), -4.0), scored("after", (-1.0, -2.0, -0.5), -2.0)]
    after = summarize(rows, seed=0, n_boot=50)["tools"]["conditions"]["after"]
    assert after["gain"]["mean"] == pytest.approx(-5.5)  # -9 - (-3.5)
    assert after["gain_correct"]["mean"] == pytest.approx(-2.0)  # -4 - (-2)
    assert after["delta_gain"]["mean"] == pytest.approx(-3.5)
    assert after["delta_gain_per_token"]["mean"] == pytest.approx(-5.5 / 3 + 2.0 / 3)
    assert after["gain_per_token_edited"]["mean"] == pytest.approx(-4.0)  # -6 - (-2)
    assert after["gain_per_token_shared"]["mean"] == pytest.approx(-0.75)  # mean(-1, -0.5)


def test_headline_per_kind_without_name_typos_and_pooled_over_envs():
    rows = []
    for env in ("tools", "mbpp"):
        for i, (kind, after) in enumerate((("unknown_function", -2.0), ("wrong_type", -8.0), ("wrong_type", -9.0))):
            for cond, lp in (("before", -10.0), ("after", after)):
                rows.append(row(f"{env}{i}", cond, lp, env=env, failure_kind=kind))
    summary = summarize(rows, seed=0, n_boot=50)
    tools = summary["tools"]
    assert tools["by_kind"]["unknown_function"]["n_items"] == 1
    assert tools["by_kind"]["wrong_type"]["gain"]["mean"] == pytest.approx(-1.5)
    assert tools["without_name_typos"]["n_items"] == 2
    assert tools["without_name_typos"]["gain"]["mean"] == pytest.approx(-1.5)
    assert summary["pooled"]["n_items"] == 6
    assert summary["pooled"]["gain"]["mean"] == pytest.approx((-8 - 2 - 1) * 2 / 6)
