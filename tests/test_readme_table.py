"""The generated paper-vs-study table: verdicts from intervals, n in every cell, and the README marker contract."""

from __future__ import annotations

import json

import pytest

from fastscore.errors import DataError
from fastscore.study.report.readme_table import (
    BEGIN, CLAIMS, END, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, drifted, extract_block, main, replace_block,
    study_table, verdict,
)

G_CLAIM, LABEL_CLAIM = CLAIMS[0], CLAIMS[3]


def env_summary(g_lo: float, g_hi: float, n: int = 20) -> dict:
    return {"n_items": n, "conditions": {
        "before": {"p_repeat": {"mean": 0.05, "lo": 0.01, "hi": 0.1, "n": n},
                   "greedy_repeat": {"mean": 0.0, "lo": 0.0, "hi": 0.16, "n": n, "saturated": "s"}},
        "after": {"gain_per_token": {"mean": (g_lo + g_hi) / 2, "lo": g_lo, "hi": g_hi, "n": n},
                  "p_repeat": {"mean": 0.8, "lo": 0.7, "hi": 0.9, "n": n},
                  "greedy_repeat": {"mean": 0.0, "lo": 0.0, "hi": 0.16, "n": n, "saturated": "s"}}},
        "label": {"label_effect": {"after-success": {"shown": {"per_token": {
            "mean": -0.4, "lo": -0.6, "hi": -0.2, "n": n}}}}}}


SUMMARY = {"seeded": {"tools": env_summary(-1.4, -1.0), "mbpp": env_summary(-1.3, -1.1, 18),
                      "pooled": {"n_items": 38}},
           "model": {"tools": env_summary(-0.3, 0.1, 12)}, "failure_prior": {}}


def test_verdicts_follow_the_interval_and_the_claims_side():
    assert verdict({"mean": -1, "lo": -1.2, "hi": -0.8, "n": 5}, G_CLAIM) == REPRODUCED
    assert verdict({"mean": 1, "lo": 0.8, "hi": 1.2, "n": 5}, G_CLAIM) == NOT_REPRODUCED
    assert verdict({"mean": -1, "lo": -1.2, "hi": 0.1, "n": 5}, G_CLAIM) == NOT_MEASURABLE
    assert verdict({"mean": 1, "lo": 1, "hi": 1, "n": 5, "saturated": "x"}, G_CLAIM) == NOT_MEASURABLE
    assert verdict(None, G_CLAIM) == NOT_MEASURABLE
    assert verdict({"mean": -1, "lo": -1.2, "hi": -0.8, "n": 4}, G_CLAIM) == NOT_MEASURABLE  # too few items
    # "≈ 0" claims: a CI inside the margin reproduces, one that excludes 0 refutes, a wide one cannot tell.
    assert verdict({"mean": 0, "lo": -0.1, "hi": 0.1, "n": 5}, LABEL_CLAIM) == REPRODUCED
    assert verdict({"mean": -0.4, "lo": -0.6, "hi": -0.3, "n": 5}, LABEL_CLAIM) == NOT_REPRODUCED  # outside ±0.25
    assert verdict({"mean": -0.4, "lo": -0.6, "hi": -0.2, "n": 5}, LABEL_CLAIM) == NOT_MEASURABLE  # across the edge
    assert verdict({"mean": -0.03, "lo": -0.04, "hi": -0.02, "n": 5}, LABEL_CLAIM) == REPRODUCED  # small, precise
    assert verdict({"mean": 0, "lo": -0.9, "hi": 0.9, "n": 5}, LABEL_CLAIM) == NOT_MEASURABLE


def test_a_reproduced_direction_says_whether_the_papers_value_lies_inside_the_ci():
    from fastscore.study.report.readme_table import paper_value_inside

    assert G_CLAIM.paper_value == (-1.03, -1.03)
    assert paper_value_inside({"mean": -1.0, "lo": -1.1, "hi": -0.9, "n": 50}, G_CLAIM) is True
    assert paper_value_inside({"mean": -1.3, "lo": -1.4, "hi": -1.2, "n": 50}, G_CLAIM) is False
    assert paper_value_inside({"mean": -1.3, "lo": None, "hi": None, "n": 50}, G_CLAIM) is None
    summary = lambda lo, hi: {"conditions": {"after": {"gain_per_token": {"mean": (lo + hi) / 2, "lo": lo, "hi": hi,  # noqa: E731
                                                                          "n": 50}}}}
    def g_row(summary_by_env):
        return next(line for line in study_table(summary_by_env).splitlines() if line.startswith("| G per action"))
    assert g_row({"tools": summary(-1.1, -0.9)}).endswith("| reproduced (the paper's value lies inside the CI) |")
    assert g_row({"tools": summary(-1.4, -1.2)}).endswith("| reproduced (direction only: the paper's value lies "
                                                          "outside the CI) |")
    assert g_row({"tools": summary(-1.4, -1.2), "mbpp": summary(-1.1, -0.9)}).endswith(
        "| reproduced (the paper's value lies inside the CI in mbpp, outside in tools) |")
    assert g_row({"tools": summary(0.1, 0.2)}).endswith("| not reproduced |")  # no value note without the direction


def test_table_has_n_and_ci_in_every_scope_and_mixed_rows_name_their_scopes():
    text = study_table(SUMMARY)
    g_row = next(line for line in text.splitlines() if line.startswith("| G per action token"))
    assert "seeded tools: -1.200 [-1.400, -1.000] (20)" in g_row
    assert "seeded mbpp: -1.200 [-1.300, -1.100] (18)" in g_row and "model tools: " in g_row
    # the note on the paper's value is about the reproduced scopes: it follows them, not the last group
    assert g_row.endswith("| reproduced: seeded tools, seeded mbpp (the paper's value lies inside the CI in seeded "
                          "tools, outside in seeded mbpp); not measurable: model tools |")
    greedy = next(line for line in text.splitlines() if line.startswith("| greedy reproduction"))
    assert greedy.endswith(f"| {NOT_MEASURABLE} |")  # saturated before and after: no finding
    # the difference says which side is saturated; each side says it is
    assert ("seeded tools: 0 (20; not measurable: both at their bounds on every item), saturated — not measurable "
            "at this n: 0 (20) -> saturated — not measurable at this n: 0 (20)") in greedy
    assert "pooled" not in text and "failure_prior" not in text
    assert study_table(SUMMARY) == text  # deterministic


def test_a_saturated_side_of_a_rise_is_named_and_a_narrow_ci_gets_the_decimals_that_show_its_width():
    from fastscore.study.report.markdown import mean_and_ci

    assert mean_and_ci(0.99993, 0.99978, 1.0) == "0.9999 [0.9998, 1.0000]"
    assert mean_and_ci(0.5, 0.4, 0.6) == "0.500 [0.400, 0.600]"
    assert mean_and_ci(1.0, 1.0, 1.0) == "1.000 [1.000, 1.000]"  # a point interval stays a point
    rise = env_summary(-1.4, -1.0)
    rise["conditions"]["after"]["p_repeat"] = {"mean": 0.99999, "lo": 0.99999, "hi": 1.0, "n": 20, "saturated": "s"}
    row = next(line for line in study_table({"tools": rise}).splitlines() if line.startswith("| P(repeat)"))
    assert "tools: 0.950 (20; not measurable: after at its bound on every item), 0.050 [0.010, 0.100] (20)" in row
    assert row.endswith(f"| {NOT_MEASURABLE} |")
    # the model's own failures: its greedy attempt from `before` is the failed action, repeated by construction
    own = env_summary(-0.3, -0.1)
    own["conditions"]["before"]["greedy_repeat"] = {"mean": 1.0, "lo": 0.84, "hi": 1.0, "n": 20, "saturated": "s"}
    own["conditions"]["after"]["greedy_repeat"] = {"mean": 0.2, "lo": 0.08, "hi": 0.42, "n": 20}
    greedy = next(line for line in study_table({"model": {"tools": own}, "seeded": {"tools": own}}).splitlines()
                  if line.startswith("| greedy reproduction"))
    assert ("model tools: -0.800 (20; not measurable: before is the model's own greedy attempt, repeated by "
            "construction), by construction: 1.000 (20) -> 0.200 [0.080, 0.420] (20)") in greedy
    assert "seeded tools: -0.800 (20; not measurable: before at its bound on every item)" in greedy


def test_a_readme_block_is_checked_and_rewritten_between_the_markers(tmp_path):
    results = tmp_path / "study-out"
    results.mkdir()
    (results / "summary.json").write_text(json.dumps(SUMMARY))
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n\n{BEGIN}\n| stale | table |\n{END}\n\nafter\n")
    assert drifted(results, readme)
    assert main([str(results), "--check", str(readme)]) == 1
    assert main([str(results), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert extract_block(text) == study_table(SUMMARY).strip()
    assert not drifted(results, readme) and main([str(results), "--check", str(readme)]) == 0
    # A changed summary makes the same README drift.
    changed = json.loads(json.dumps(SUMMARY))
    changed["seeded"]["tools"]["conditions"]["after"]["gain_per_token"]["n"] = 21
    (results / "summary.json").write_text(json.dumps(changed))
    assert drifted(results, readme)


@pytest.mark.parametrize("bad", ["no markers", f"{END}\n{BEGIN}", f"{BEGIN}\n{BEGIN}\n{END}"])
def test_missing_or_misordered_markers_are_refused(bad):
    with pytest.raises(DataError):
        replace_block(bad, "| a |")


def test_every_claim_finds_its_estimate_in_a_real_summary():
    from fastscore.study.analysis.metrics import summarize
    from test_metrics import crafted_study

    text = study_table(summarize(crafted_study(), seed=0, n_boot=100))
    rows = [line for line in text.splitlines()[2:]]
    assert len(rows) == len(CLAIMS)
    missing = [row.split(" | ")[0] for row in rows if "no estimate" in row]
    assert all(row.rsplit(" | ", 1)[1].split(" (")[0].rstrip(" |") in (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)
               for row in rows), rows
    # These crafted rows record no greedy completion and no sampled retries; every other claim is found.
    assert missing == ["| greedy reproduction of the failed call, after − before",
                       "| clean retry − after: P(T=1 sample = failed), paired"]


def test_the_cli_prints_checks_and_writes_the_table(tmp_path):
    from click.testing import CliRunner

    from fastscore.cli import main as cli

    results = tmp_path / "summary.json"
    results.write_text(json.dumps(SUMMARY))
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{BEGIN}\nold\n{END}\n")
    runner = CliRunner()
    printed = runner.invoke(cli, ["study-table", str(results)])
    assert printed.exit_code == 0 and printed.output.strip() == study_table(SUMMARY).strip()
    assert runner.invoke(cli, ["study-table", str(results), "--check", str(readme)]).exit_code == 1
    assert runner.invoke(cli, ["study-table", str(results), "--write", str(readme)]).exit_code == 0
    checked = runner.invoke(cli, ["study-table", str(results), "--check", str(readme)])
    assert checked.exit_code == 0 and "matches" in checked.output
    both = runner.invoke(cli, ["study-table", str(results), "--check", str(readme), "--write", str(readme)])
    assert both.exit_code != 0 and "exclude each other" in both.output
