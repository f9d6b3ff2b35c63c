"""The failure's prior (fastscore.study.analysis.prior, report.prior): the source gap raw and at equal prior, bins of
the prior, small-n cells, and the section in the report of a run over both failure sources. Crafted inputs, pure numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastscore.study.analysis.metrics import ScoreRow, candidate_probabilities
from fastscore.study.analysis.prior import (
    MODEL, NOT_APPLICABLE, POOLED, SEEDED, PriorItems, fit, prior_items, prior_of_run, prior_summary, tercile_edges,
)
from fastscore.study.report.prior import HEADING, SUMMARY_KEY, prior_reading, prior_section

A, B, C = -0.2, 0.5, 0.3  # G/token = A + B * prior + C * on_policy, exactly


def _items(source: str, priors, env: str = "tools", offset: float = 0.0) -> PriorItems:
    prior = np.asarray(priors, dtype=float)
    return PriorItems(source, (env,) * prior.size, prior, A + B * prior + offset)


def _exact(envs=("tools",)):
    seeded = [_items(SEEDED, np.linspace(-3.0, -0.5, 10), env) for env in envs]
    model = [_items(MODEL, np.linspace(-1.5, 0.0, 8), env, offset=C) for env in envs]

    def join(parts):
        return PriorItems(parts[0].source, sum((p.envs for p in parts), ()), np.concatenate([p.prior for p in parts]),
                          np.concatenate([p.gain_per_token for p in parts]))
    return join(seeded), join(model)


def test_the_fit_recovers_the_source_offset_and_the_slope_of_exact_data():
    seeded, model = _exact()
    coef = fit(np.r_[seeded.prior, model.prior], np.r_[np.zeros(10), np.ones(8)],
               np.r_[seeded.gain_per_token, model.gain_per_token])
    assert coef == pytest.approx([A, B, C], abs=1e-12)
    # a prior that separates the sources exactly (constant within each) is collinear with the source: no fit
    assert fit(np.r_[np.full(3, -2.0), np.full(3, -0.1)], np.r_[np.zeros(3), np.ones(3)], np.arange(6.0)) is None


def test_the_adjusted_gap_is_the_offset_while_the_raw_gap_also_holds_the_prior_difference():
    seeded, model = _exact()
    gap = prior_summary(seeded, model, n_boot=300, seed=0)["scopes"]["tools"]["gap"]
    raw_by_hand = C + B * (np.linspace(-1.5, 0.0, 8).mean() - np.linspace(-3.0, -0.5, 10).mean())  # 0.3 + 0.5*1.0
    assert gap["raw"]["mean"] == pytest.approx(raw_by_hand) == pytest.approx(0.8)
    assert gap["raw"]["lo"] < raw_by_hand < gap["raw"]["hi"]  # resampling moves the priors, so the raw gap varies
    adjusted = gap["adjusted_for_prior"]
    # every resample is exact data too, so every resample recovers C: the interval collapses onto it
    assert (adjusted["mean"], adjusted["lo"], adjusted["hi"]) == pytest.approx((C, C, C), abs=1e-9)
    assert adjusted["n"] == 18 and gap["prior_slope"]["mean"] == pytest.approx(B)
    assert gap["share_remaining"]["mean"] == pytest.approx(C / 0.8)
    assert gap["overlap"] == {"prior_from": -1.5, "prior_to": -0.5, "items_inside": {SEEDED: 4, MODEL: 5}}
    assert gap["singular_resamples"] == 0


def test_bins_are_the_pooled_terciles_and_a_thin_cell_says_not_applicable_with_its_n():
    seeded = _items(SEEDED, [-3.0, -2.5, -2.0, -1.2, -1.1])
    model = _items(MODEL, [-1.0, -0.3, -0.2, -0.1], offset=C)
    edges = tercile_edges(np.r_[seeded.prior, model.prior])
    # 9 sorted priors: the 1/3 quantile sits 2/3 of the way from -2.0 to -1.2, the 2/3 one 1/3 from -1.0 to -0.3
    assert edges == pytest.approx((-2.0 + 0.8 * 2 / 3, -1.0 + 0.7 / 3))
    scope = prior_summary(seeded, model, n_boot=200, seed=0)["scopes"]["tools"]
    low, middle, high = scope["bins"]
    assert low["gain_per_token"][SEEDED]["n"] == 3 and low["gain_per_token"][MODEL] == {NOT_APPLICABLE:
                                                                                          "not applicable (n = 0)"}
    assert middle["gain_per_token"][SEEDED]["n"] == 2
    assert middle["gain_per_token"][MODEL] == {NOT_APPLICABLE: "not applicable (n = 1)"}
    assert middle["gap"] == {NOT_APPLICABLE: "not applicable (n = 1 on-policy, 2 seeded)"}
    assert high["gain_per_token"][MODEL]["n"] == 3 and NOT_APPLICABLE in high["gain_per_token"][SEEDED]
    assert middle["gain_per_token"][SEEDED]["mean"] == pytest.approx(A + B * -1.15)
    assert scope["gap"]["overlap"]["prior_from"] is None  # seeded ends at -1.1, on-policy starts at -1.0
    text = prior_section(prior_summary(seeded, model, n_boot=200, seed=0))
    assert "nan" not in text.lower() and "not applicable (n = 1)" in text
    assert "the sources' priors do not overlap at all" in text


def test_one_item_of_a_source_gives_reasons_not_numbers():
    seeded, model = _items(SEEDED, [-2.0, -1.0, -1.5]), _items(MODEL, [-0.1], offset=C)
    out = prior_summary(seeded, model, n_boot=100, seed=0)
    gap = out["scopes"]["tools"]["gap"]
    reason = "not applicable (n = 1 on-policy, 3 seeded)"
    assert all(gap[k] == {NOT_APPLICABLE: reason} for k in ("raw", "adjusted_for_prior", "prior_slope",
                                                            "share_remaining"))
    assert prior_reading(out["scopes"]).endswith(f"cannot be adjusted for prior here: {reason}.")


def test_scopes_are_the_envs_both_sources_share_plus_their_pool_and_the_resamples_follow_the_seed():
    seeded, model = _exact(envs=("tools", "mbpp"))
    only_seeded = _items(SEEDED, [-2.0, -1.0], env="mbpp")
    out = prior_summary(seeded, model, n_boot=200, seed=3)
    assert list(out["scopes"]) == ["tools", "mbpp", POOLED]
    assert out["scopes"][POOLED]["n"] == {SEEDED: 20, MODEL: 16}
    assert out["scopes"][POOLED]["gap"]["adjusted_for_prior"]["mean"] == pytest.approx(C)
    assert prior_summary(seeded, model, n_boot=200, seed=3) == out
    other = prior_summary(seeded, model, n_boot=200, seed=4)["scopes"]["tools"]["gap"]["raw"]
    assert other["lo"] != out["scopes"]["tools"]["gap"]["raw"]["lo"]
    # an environment with one source only is no scope: it would compare environments, not sources
    lone = prior_summary(only_seeded, _items(MODEL, [-0.5, -0.2], env="tools"), n_boot=50, seed=0)
    assert lone["scopes"] == {} and "note" in lone and prior_section(lone) is None


def _rows(env: str, item: str, before: float, after: float, n: int) -> list[ScoreRow]:
    rows = []
    for cond, lp in (("before", before), ("after", after)):
        cand, lengths = (lp, lp - 1.0, lp - 2.0, lp - 3.0), (n, n, n, n)
        rows.append(ScoreRow(item, env, cond, lp, n, cand, lengths, *candidate_probabilities(cand, lengths)))
    return rows


def test_items_come_from_score_rows_with_the_study_s_sign_of_g():
    rows = _rows("tools", "t0", before=-12.0, after=-6.0, n=4) + _rows("mbpp", "m0", before=-2.0, after=-3.0, n=2)
    items = prior_items(rows, SEEDED)
    assert items.envs == ("tools", "mbpp")
    assert items.prior.tolist() == [-3.0, -1.0]
    # G = lp(before) - lp(after): the record raised the first item (backfired, G < 0) and lowered the second
    assert items.gain_per_token.tolist() == [-1.5, 0.5]


def test_the_report_of_a_run_over_both_sources_has_the_section_and_summary_json_its_key(tmp_path):
    from test_report import study_rows

    from fastscore.study.analysis.metrics import summarize
    from fastscore.study.runner import StudyConfig
    from fastscore.study.sources import StudyOutcome
    from fastscore.study.sources import combine_sources
    from fastscore.study.stages.store import SCORES_FILE

    rng = np.random.default_rng(5)
    for source, (lo, hi, offset) in {SEEDED: (-3.0, -0.6, 0.0), MODEL: (-1.2, -0.05, 0.9)}.items():
        (tmp_path / source).mkdir()
        rows = []
        for env in ("tools", "mbpp"):
            for i, prior in enumerate(np.linspace(lo, hi, 8)):
                n = int(rng.integers(3, 9))
                gain = A + B * prior + offset + 0.05 * rng.normal()  # per token
                rows += _rows(env, f"{env}-{i}", before=prior * n, after=prior * n - gain * n, n=n)
        (tmp_path / source / SCORES_FILE).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    summary = summarize(study_rows(shift=3.0, n=4), seed=0, n_boot=50)
    outcomes = {s: StudyOutcome(tmp_path / s, {"tools": 8, "mbpp": 8}, 0, 0, summary, {"score": 1.0}, 1.0, ())
                for s in (SEEDED, MODEL)}
    combine_sources(StudyConfig(quant="f32", out_dir=tmp_path, n_boot=300), outcomes, 2.0)
    stored = json.loads((tmp_path / "summary.json").read_text())
    assert set(stored) == {SEEDED, MODEL, SUMMARY_KEY}
    pooled = stored[SUMMARY_KEY]["scopes"][POOLED]
    assert pooled["n"] == {SEEDED: 16, MODEL: 16} and stored[SUMMARY_KEY]["bootstrap"]["n_boot"] == 300
    assert abs(pooled["gap"]["adjusted_for_prior"]["mean"] - 0.9) < 0.1  # the offset built in, up to the noise
    assert stored[SUMMARY_KEY] == prior_of_run(tmp_path, n_boot=300, seed=0)  # re-read from the stored rows
    report = (tmp_path / "report.md").read_text()
    assert HEADING in report and report.index("## Failure mix") < report.index(HEADING)
    assert "| pooled | 16 + 16 |" in report
    assert "**Reading** (pooled over environments, 16 on-policy and 16 seeded items)" in report
    assert "the gap **survives** adjustment for prior" in report
    # a run without the on-policy source has no section
    (tmp_path / "one").mkdir()
    combine_sources(StudyConfig(quant="f32", out_dir=tmp_path / "one"), {SEEDED: outcomes[SEEDED]}, 1.0)
    assert HEADING not in (tmp_path / "one" / "report.md").read_text()


def test_the_scoring_stage_s_log_probs_give_the_same_items_as_the_score_rows(tmp_path):
    from fastscore.study.analysis.prior import rows_from_logprobs

    rows = _rows("tools", "t0", before=-12.0, after=-6.0, n=4) + _rows("mbpp", "m0", before=-2.0, after=-3.0, n=2)
    records = {}
    for row in rows:
        rec = records.setdefault(row.item_id, {"item_id": row.item_id, "env": row.env, "conditions": {}})
        rec["conditions"][row.condition] = {"cand_lp": list(row.cand_lp), "cand_n_tokens": list(row.cand_n_tokens),
                                            "p": [row.p_repeat, 0.1, 0.1, 0.1],
                                            "p_norm": [row.p_repeat_norm, 0.1, 0.1, 0.1]}
    path = tmp_path / "logprobs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records.values()) + '{"item_id": "cut')  # killed mid-line
    from_logprobs, from_rows = prior_items(rows_from_logprobs(path), SEEDED), prior_items(rows, SEEDED)
    assert from_logprobs.envs == from_rows.envs
    assert from_logprobs.prior.tolist() == from_rows.prior.tolist() == [-3.0, -1.0]
    assert from_logprobs.gain_per_token.tolist() == from_rows.gain_per_token.tolist()


def test_pooled_the_fit_gives_each_environment_its_intercept_so_a_source_mix_differing_by_env_is_no_gap():
    # mbpp's G/token sits D lower at every prior, and 8 of the 10 on-policy items are mbpp against 2 of 10 seeded:
    # without an intercept per environment that difference of environments would pass for one of sources.
    D = -1.0
    def env_items(source, priors_by_env, offset):
        envs = tuple(e for e, ps in priors_by_env.items() for _ in ps)
        prior = np.concatenate([np.asarray(ps, dtype=float) for ps in priors_by_env.values()])
        gain = A + B * prior + offset + D * (np.asarray(envs) == "mbpp")
        return PriorItems(source, envs, prior, gain)
    seeded = env_items(SEEDED, {"tools": np.linspace(-3, -0.5, 8), "mbpp": [-2.0, -1.0]}, 0.0)
    model = env_items(MODEL, {"tools": [-0.8, -0.2], "mbpp": np.linspace(-1.5, 0.0, 8)}, C)
    pooled = prior_summary(seeded, model, n_boot=200, seed=0)["scopes"][POOLED]["gap"]
    assert pooled["adjusted_for_prior"]["mean"] == pytest.approx(C)
    assert pooled["adjusted_for_prior"]["lo"] == pytest.approx(C) and pooled["prior_slope"]["mean"] == pytest.approx(B)
    coef = fit(np.r_[seeded.prior, model.prior], np.r_[np.zeros(10), np.ones(10)],
               np.r_[seeded.gain_per_token, model.gain_per_token])  # one intercept for both environments
    assert abs(coef[2] - C) > 0.3


def test_the_reading_warns_when_few_items_lie_where_both_sources_priors_meet():
    seeded = _items(SEEDED, np.r_[np.linspace(-3.0, -1.2, 9), -0.6])
    model = _items(MODEL, np.r_[-0.9, np.linspace(-0.5, 0.0, 9)], offset=C)
    reading = prior_reading(prior_summary(seeded, model, n_boot=200, seed=0)["scopes"])
    assert "only 1 on-policy and 1 seeded items lie in the prior range both cover" in reading
    assert "the gap **survives** adjustment for prior" in reading
