"""report.md and the plots, from summaries of crafted score rows."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from fastscore.study.analysis.metrics import CONDITIONS, ScoreRow, candidate_probabilities, summarize
from fastscore.study.report.plots import PLOT_FILES, write_plots
from fastscore.study.report.document import write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
META = {
    "weights": "SmolLM2-135M-Instruct: crafted rows for a test, no weights were run",
    "model": "smollm2-135m-instruct", "backend": "llamacpp", "quant": "q4_1", "seed": 11, "limit": 25,
    "failure_source": "synthetic", "n_boot": 200, "date": "2026-08-30", "command": "fastscore study --limit 25",
    "stage_seconds": {"build items": 1.25, "score": 412.5, "greedy": 73.0},
    "skipped": {"tools": {"no ground truth": 4, "schema unsupported": 2}, "mbpp": {"no failing variant": 1}},
}


def study_rows(shift: float, n: int = 25, seed: int = 0, clean_retry: float = 1.2) -> list[ScoreRow]:
    """Every condition for two envs; `shift` is how much the failure record raises the failed action's lp."""
    rng = np.random.default_rng(seed)
    offsets = {"before": 0.0, "after": shift, "success": 0.8 * shift, "neutral": 0.7 * shift,
               "description": 0.2 * shift, "dont_repeat": shift, "clean_retry": clean_retry * shift}
    rows = []
    for env in ("tools", "mbpp"):
        for i in range(n):
            base = -15.0 + rng.normal()
            for cond in CONDITIONS:
                lp = -math.inf if cond == "ban" else base + offsets[cond] + 0.5 * rng.normal()
                cand = (lp, -14.0, -16.0)
                p, p_norm = candidate_probabilities(cand, (6, 5, 7))
                rows.append(ScoreRow(f"{env}-{i}", env, cond, lp, 6, cand, (6, 5, 7), p, p_norm,
                                     greedy="g", greedy_repeat=bool(rng.random() < 0.3), greedy_success=False,
                                     banned_mass=0.2 if cond == "ban" else None))
    return rows


@pytest.fixture(scope="module")
def backfire(tmp_path_factory):
    rows = study_rows(shift=3.0)
    summary = summarize(rows, seed=11, n_boot=200)
    out = tmp_path_factory.mktemp("study-out")
    plots = write_plots(rows, summary, out)
    return rows, summary, out, plots, write_report(summary, out, META)


def test_plots_are_valid_pngs(backfire):
    _, _, out, plots, _ = backfire
    assert [p.name for p in plots] == list(PLOT_FILES)
    for path in plots:
        data = path.read_bytes()
        print(path.name, len(data), "bytes")
        assert data[:8] == PNG_SIGNATURE and len(data) > 5000


def test_report_has_every_table_and_the_run_record(backfire):
    _, summary, out, _, report = backfire
    text = report.read_text()
    assert report == out / "report.md"
    assert META["weights"] in text
    run_values = ("llamacpp", "q4_1", "synthetic", "2026-08-30", "`fastscore study --limit 25`",
                  "| item limit per env | 25 |")
    for value in run_values:
        assert value in text
    for stage, seconds in (("build items", "1.2"), ("score", "412.5"), ("greedy", "73.0"), ("**total**", "**486.8**")):
        assert f"| {stage} | {seconds} |" in text
    assert "| tools | no ground truth | 4 |" in text and "| mbpp | no failing variant | 1 |" in text
    assert "| tools | 25 | 6 |" in text  # items, skipped
    for env in ("tools", "mbpp"):
        section = text.split(f"## Results: {env}")[1].split("## Results:")[0]
        for heading in ("### Reading", "### Conditions", "### Decomposition", "### Remedies"):
            assert heading in section
        for cond in CONDITIONS:
            if cond != "clean_retry":  # seeded rows: clean_retry is not applicable (see below)
                assert f"\n| {cond} |" in section
        gain = summary[env]["conditions"]["after"]["gain"]
        assert f"{gain['mean']:.3f} [{gain['lo']:.3f}, {gain['hi']:.3f}] ({gain['n']})" in section
    for name in PLOT_FILES:
        assert f"]({name})" in text
    table_lines = [line for line in text.splitlines() if line.startswith("|")]
    assert not [line for line in table_lines if re.search(r"\b(nan|inf)\b", line, re.IGNORECASE)]


def test_reading_follows_the_sign_of_the_data(backfire, tmp_path):
    _, _, _, _, report = backfire
    assert "G(after)" in report.read_text() and "is negative" in report.read_text()
    assert "made the repeat more likely" in report.read_text()
    corrected = summarize(study_rows(shift=-3.0), seed=0, n_boot=200)
    text = write_report(corrected, tmp_path, {}).read_text()
    assert "is positive" in text and "made the repeat less likely" in text
    assert "there is no inversion to remove" in text


def test_clean_retry_under_seeded_failures_is_not_applicable_and_absent_from_the_reading_and_plots(tmp_path):
    # As in a seeded run: clean_retry shows `before`'s messages and has no sampled retries.
    rows = study_rows(shift=3.0, clean_retry=0.0)
    summary = summarize(rows, seed=0, n_boot=200)
    text = write_report(summary, tmp_path, {}).read_text()
    reading = next(line for line in text.splitlines() if line.startswith("- Share of the inversion removed"))
    assert "clean_retry" not in reading and reading.endswith("the largest is description.")
    remedy_row = next(line for line in text.split("### Remedies")[1].splitlines() if line.startswith("| clean_retry"))
    assert "not applicable under seeded failures" in remedy_row
    assert "clean_retry" not in summary["tools"]["conditions"]


def test_the_reading_states_the_differential_copy_and_the_failure_specific_contrast_with_cis(backfire):
    _, summary, _, _, report = backfire
    delta = summary["tools"]["conditions"]["after"]["delta_gain"]
    section = report.read_text().split("## Results: tools")[1]
    line = next(x for x in section.splitlines() if "differential copy ΔG" in x)
    assert f"{delta['mean']:.3f} nats [{delta['lo']:.3f}, {delta['hi']:.3f}]" in line
    assert "### Copy control" in section and "### Failure kinds" in section
    # "Failure-specific" names only the contrast that isolates the label: after vs success on the same action.
    fs = summary["tools"]["label"]["label_effect"]["after-success"]["shown"]["per_call"]
    answer = next(x for x in section.splitlines() if x.startswith("- Does a failure record make the failed action"))
    assert f"{fs['mean']:.3f} [{fs['lo']:.3f}, {fs['hi']:.3f}] ({fs['n']})" in answer
    resolved = fs["lo"] > 0 or fs["hi"] < 0
    assert ("the data cannot answer at this n" in answer) == (not resolved)
    assert "### Label contrasts: the failure label, separated from copying" in section


def test_report_and_plots_survive_missing_conditions_and_meta(tmp_path):
    rows = [r for r in study_rows(shift=2.0, n=6) if r.condition in ("before", "after") and r.env == "tools"]
    summary = summarize(rows, seed=0, n_boot=100)
    plots = write_plots(rows, summary, tmp_path)
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in plots)
    text = write_report(summary, tmp_path, {}).read_text()
    assert "| model | not recorded |" in text and "No stage timings were recorded." in text
    assert "### Decomposition" in text and "n/a (no items with" in text


def test_unstable_ratio_is_flagged_in_the_report(tmp_path):
    rng = np.random.default_rng(4)
    rows = []
    for i in range(30):
        base = -12.0 + rng.normal()
        # G(after) straddles 0 (half the items each way), so every ratio over it is unstable.
        lps = {"before": base, "after": base + (1.0 if i % 2 else -1.02), "neutral": base + 0.5, "description": base}
        for cond, lp in lps.items():
            rows.append(ScoreRow(f"t{i}", "tools", cond, lp, 4, (lp, -13.0), (4, 4), 0.5, 0.5))
    summary = summarize(rows, seed=0, n_boot=300)
    assert summary["tools"]["decomposition"]["surface_share"]["unstable"] is True
    text = write_report(summary, tmp_path, {}).read_text()
    lines = text.splitlines()
    surface = [line for line in lines if line.startswith("| surface share")]
    assert len(surface) == 1 and surface[0].split(" | ")[1].endswith(" ⚠")
    remedy_rows = [line for line in lines if line.startswith("| description") and " ⚠" in line]
    assert len(remedy_rows) == 1  # the remedy table's row; the condition table's row holds no ratio
    assert "sign is not resolved" in text


def test_clean_retry_share_is_wilson_over_all_samples_and_fixed_cells_are_not_applicable(tmp_path):
    from dataclasses import replace

    from fastscore.study.analysis.stats import wilson_interval

    # On-policy rows: 8 sampled retries per item from the clean context, one repeat among all 25 * 8 = 200 samples.
    # Judged in meaning, 3 of each of the first 5 items' samples repeat (other spellings of the same call).
    # Under the records too (every record is sampled on policy): after, 2 of 8 in meaning on the first 10 items;
    # success, none.
    def sampled(r):
        first = int(r.item_id.split("-")[1])
        if r.condition == "clean_retry":
            return replace(r, sampled_k=8, sampled_repeat=int(r.item_id == "tools-3"),
                           sampled_repeat_semantic=3 * (first < 5))
        if r.condition in ("after", "success"):
            return replace(r, sampled_k=8, sampled_repeat=0,
                           sampled_repeat_semantic=2 * (first < 10) if r.condition == "after" else 0)
        return r

    rows = [sampled(r) for r in study_rows(shift=3.0)]
    summary = summarize(rows, seed=0, n_boot=100)
    share = summary["tools"]["conditions"]["clean_retry"]["sampled_repeat_rate"]
    lo, hi = wilson_interval(1, 200)
    assert (share["mean"], share["lo"], share["hi"], share["n"]) == (1 / 200, lo, hi, 200)
    assert 0.0 < lo < 1 / 200 < hi < 0.03  # a percentile bootstrap over items would give [0, 0.015] or so
    semantic = summary["tools"]["conditions"]["clean_retry"]["sampled_repeat_semantic_rate"]
    lo, hi = wilson_interval(15, 200)
    assert (semantic["mean"], semantic["lo"], semantic["hi"], semantic["n"]) == (15 / 200, lo, hi, 200)
    after = summary["tools"]["conditions"]["after"]["sampled_repeat_semantic_rate"]
    assert (after["mean"], after["n"]) == (20 / 200, 200)
    assert "sampled_repeat_semantic_rate" not in summary["tools"]["conditions"]["neutral"]  # not sampled here
    # Paired per item: the share of after's samples repeating in meaning minus success's (10 of 25 items at 2/8).
    diff = summary["tools"]["label"]["repeat_difference"]["after-success"]["sampled_repeat_semantic_rate"]
    print("after - success, sampled semantic:", diff)
    assert diff["mean"] == pytest.approx(10 * 0.25 / 25) and diff["n"] == 25
    # Clean retry measured like every other record: its semantic share minus after's, paired (5 items at 3/8 vs
    # 10 items at 2/8 over 25 items).
    vs_after = summary["tools"]["clean_retry"]["semantic_minus"]["after"]
    assert vs_after["mean"] == pytest.approx((5 * 3 / 8 - 10 * 2 / 8) / 25) and vs_after["n"] == 25
    assert "ranking" in vs_after and "description" not in summary["tools"]["clean_retry"]["semantic_minus"]
    text = write_report(summary, tmp_path, {**META, "failure_source": "model"}).read_text()
    assert "Judged in meaning, as the greedy repeats are" in text and "0.075" in text
    assert "samples repeating in meaning: clean retry - vs, paired" in text
    ban_row = next(line for line in text.splitlines() if line.startswith("| ban |"))
    assert "not applicable (0 by construction)" in ban_row and "0 [0, 0]" not in ban_row
    assert "Greedy exact reproduction after the record:" in text and "(before it: not applicable" in text


def test_the_cut_rate_of_the_models_attempts_is_reported_per_environment(tmp_path):
    from fastscore.study.stages.onpolicy import CUT_AT_CAP

    summary = summarize([r for r in study_rows(shift=2.0, n=6) if r.env == "tools"], seed=0, n_boot=50)
    skipped = {"tools": {CUT_AT_CAP: 9, "the model's own attempt succeeded": 3, "too few distinct candidates": 4}}
    text = write_report(summary, tmp_path, {"skipped": skipped}).read_text()
    # 6 items + 12 skipped attempts examined (the seeded-candidate reason is not an attempt); 9 cut
    assert "tools: 9 of 18 attempts examined were cut at the token cap (50%, Wilson 95% CI 29-71%)" in text
    assert "Cut rate" not in write_report(summary, tmp_path, {}).read_text()
    # On policy the rate is given even when no attempt was cut.
    text = write_report(summary, tmp_path, {"failure_source": "model"}).read_text()
    assert "tools: 0 of 6 attempts examined were cut at the token cap (0%" in text
