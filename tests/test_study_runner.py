"""The study runner end to end on the embedded model (llamacpp, shipped Q4_1): outputs, resume, typed errors.

Runs are tiny (1 item per env, short greedy limits, few bootstrap resamples) so the whole file stays fast: one
uninterrupted run through the CLI, one run killed twice and resumed, one resume from a truncated scores.jsonl.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from fastscore.cli import main
from fastscore.errors import DataError, ResumeConfigError
from fastscore.study.analysis.metrics import CONDITIONS, read_score_rows
from fastscore.study.report.plots import PLOT_FILES
from fastscore.study.runner import StudyConfig, run_study
from fastscore.study.stages.store import AppendLog, StudyStore

LIMIT = 1
SEED = 43  # its first items are short (about 1,600 tokens to score in all), which keeps the runs quick
MAX_NEW = 8
N_BOOT = 50
OUTPUT_FILES = ("config.json", "items.jsonl", "skipped.jsonl", "logprobs.jsonl", "scores.jsonl", "summary.json",
                "report.md", *PLOT_FILES)


class Killed(Exception):
    """Stands in for a kill: raised from the runner's per-item hook."""


def _config(out: Path, data_dir: Path, **changes) -> StudyConfig:
    base = StudyConfig(envs=("tools", "mbpp"), limit=LIMIT, seed=SEED, failures="seeded", out_dir=out, data_dir=data_dir,
                       n_boot=N_BOOT, max_new_tokens=MAX_NEW, threads=2)
    return replace(base, **changes)


def _rows(out: Path) -> list[dict]:
    return sorted((r.to_dict() for r in read_score_rows(out / "scores.jsonl")),
                  key=lambda r: (r["item_id"], r["condition"]))


def _assert_same_rows(got: list[dict], want: list[dict]) -> None:
    keys = [(r["item_id"], r["condition"]) for r in got]
    assert len(keys) == len(set(keys)), "duplicated rows"
    assert keys == [(r["item_id"], r["condition"]) for r in want], "lost or extra rows"
    max_diff = 0.0
    for a, b in zip(got, want):
        for x, y in zip([a["lp"], *a["cand_lp"]], [b["lp"], *b["cand_lp"]]):
            if x is None or y is None:
                assert x is None and y is None
            else:
                max_diff = max(max_diff, abs(x - y))
        assert {k: v for k, v in a.items() if k not in ("lp", "cand_lp", "p_repeat", "p_repeat_norm")} == \
               {k: v for k, v in b.items() if k not in ("lp", "cand_lp", "p_repeat", "p_repeat_norm")}
        assert a["p_repeat"] == pytest.approx(b["p_repeat"], abs=1e-9)
    print(f"resumed vs uninterrupted: max |lp difference| = {max_diff:.3g} nats")
    assert max_diff <= 1e-6


@pytest.fixture(scope="module")
def data_dir(study_data) -> Path:
    return study_data


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, data_dir) -> Path:
    """One uninterrupted run through the CLI; the other tests compare against it."""
    out = tmp_path_factory.mktemp("study") / "baseline"
    result = CliRunner().invoke(main, [
        "study", "--env", "tools,mbpp", "--limit", str(LIMIT), "--seed", str(SEED), "--failures", "seeded",
        "--out", str(out), "--data", str(data_dir), "--max-new-tokens", str(MAX_NEW), "--n-boot", str(N_BOOT),
        "--threads", "2",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "measured time:" in result.output
    print(result.output)
    (out.parent / "cli-output.txt").write_text(result.output)
    return out


def test_cli_shows_one_bar_over_every_stage(baseline):
    # 2 items (1 per env), each scored and decoded: 4 item-stages, all done when the run ends.
    output = (baseline.parent / "cli-output.txt").read_text()
    states = re.findall(r"study, all stages:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)", output)
    assert states, output
    assert states[-1] == ("4", "4")
    assert all(int(done) <= int(total) for done, total in states)


def test_cli_writes_every_output_file_with_every_metric(baseline):
    for name in OUTPUT_FILES:
        assert (baseline / name).is_file(), name
        assert (baseline / name).stat().st_size > 0 or name == "skipped.jsonl", name
    items = [json.loads(line) for line in (baseline / "items.jsonl").read_text().splitlines()]
    assert sorted({i["env"] for i in items}) == ["mbpp", "tools"] and len(items) == 2 * LIMIT
    rows = read_score_rows(baseline / "scores.jsonl")
    assert len(rows) == len(items) * len(CONDITIONS)
    assert {(r.item_id, r.condition) for r in rows} == {(i["item_id"], c) for i in items for c in CONDITIONS}
    for row in rows:
        assert row.greedy is not None and row.greedy_repeat is not None and row.greedy_success is not None
        assert len(row.cand_lp) == len(row.cand_n_tokens) >= 2
        if row.condition == "ban":
            assert row.lp == -math.inf and row.p_repeat == 0.0 and row.banned_mass is not None
            assert row.greedy.strip() != next(i for i in items if i["item_id"] == row.item_id)["failed_action"]
        else:
            assert math.isfinite(row.lp) and row.banned_mass is None
    by = {(r.item_id, r.condition): r for r in rows}
    for i in items:
        # clean_retry renders to before's messages, so the scorer must give it the same numbers.
        assert by[i["item_id"], "clean_retry"].cand_lp == by[i["item_id"], "before"].cand_lp
        assert by[i["item_id"], "ban"].cand_lp[1:] == by[i["item_id"], "after"].cand_lp[1:]
    summary = json.loads((baseline / "summary.json").read_text())
    for env in ("tools", "mbpp"):
        conds = summary[env]["conditions"]
        assert summary[env]["n_items"] == LIMIT
        for metric in ("gain", "gain_per_token", "odds_factor", "share_negative", "p_repeat", "p_repeat_norm",
                       "greedy_repeat", "greedy_success"):
            assert metric in conds["after"], metric
        assert "banned_mass" in conds["ban"]
        assert set(summary[env]["remedies"]) >= {"description", "dont_repeat", "clean_retry", "ban"}
        redacted = summary[env]["description_redacted"]  # counted from the stored items' meta
        assert redacted["n_items"] == LIMIT and redacted["n_redacted"] == sum(
            i["meta"]["description_redacted"] > 0 for i in items if i["env"] == env)
    report = (baseline / "report.md").read_text()
    assert "Descriptions redacted:" in report.split("## Items", 1)[1].split("\n## ", 1)[0]
    assert "## Stage timings" in report and "greedy decoding" in report
    weights = report.split("## Weights", 1)[1].split("##", 1)[0].strip()
    assert weights and weights != "not recorded"


def test_killed_run_resumes_without_losing_or_duplicating_items(baseline, tmp_path, data_dir):
    out = tmp_path / "killed"

    def kill_at(stage: str):
        def hook(at: str, item_id: str) -> None:
            if at == stage:
                raise Killed(f"{stage} {item_id}")
        return hook

    # Killed after the first item's candidate sets were stored, then again after its greedy rows were stored.
    with pytest.raises(Killed, match="score"):
        run_study(_config(out, data_dir), progress=False, after_item=kill_at("score"))
    assert len((out / "logprobs.jsonl").read_text().splitlines()) == 1
    assert not (out / "scores.jsonl").exists()
    with pytest.raises(Killed, match="greedy"):
        run_study(_config(out, data_dir, resume=True), progress=False, after_item=kill_at("greedy"))
    assert len((out / "logprobs.jsonl").read_text().splitlines()) == 2 * LIMIT
    assert len((out / "scores.jsonl").read_text().splitlines()) == len(CONDITIONS)
    outcome = run_study(_config(out, data_dir, resume=True), progress=False)
    assert outcome.n_resumed == 1
    _assert_same_rows(_rows(out), _rows(baseline))
    assert (out / "items.jsonl").read_text() == (baseline / "items.jsonl").read_text()
    assert json.loads((out / "summary.json").read_text()) == json.loads((baseline / "summary.json").read_text())


def test_resume_discards_a_partial_last_line_and_an_incomplete_item(baseline, tmp_path, data_dir):
    out = tmp_path / "truncated"
    shutil.copytree(baseline, out)
    lines = (out / "scores.jsonl").read_text().splitlines(keepends=True)
    n_per_item = len(CONDITIONS)
    # One complete item, three rows of the next, then half a line: what a kill mid-write can leave.
    assert len(lines) == 2 * n_per_item
    kept = "".join(lines[: n_per_item + 3]) + lines[n_per_item + 3][: len(lines[n_per_item + 3]) // 2]
    (out / "scores.jsonl").write_text(kept)
    items_before = (out / "items.jsonl").stat().st_mtime_ns
    outcome = run_study(_config(out, data_dir, resume=True), progress=False)
    assert outcome.n_resumed == 1
    _assert_same_rows(_rows(out), _rows(baseline))
    assert (out / "items.jsonl").stat().st_mtime_ns == items_before  # same config: the item set is not rewritten


def test_resume_with_a_different_config_is_refused(baseline, tmp_path, data_dir):
    out = tmp_path / "other"
    shutil.copytree(baseline, out)
    with pytest.raises(ResumeConfigError, match="seed"):
        run_study(_config(out, data_dir, resume=True, seed=1), progress=False)
    result = CliRunner().invoke(main, ["study", "--out", str(out), "--data", str(data_dir), "--limit", "3", "--resume",
                                       "--failures", "seeded"])
    assert result.exit_code == ResumeConfigError.exit_code
    assert "different configuration" in result.output and "limit" in result.output
    assert "Traceback" not in result.output
    assert read_score_rows(out / "scores.jsonl") == read_score_rows(baseline / "scores.jsonl")  # nothing touched


def test_model_failures_are_the_models_own_greedy_attempts(tmp_path, data_dir):
    out = tmp_path / "on-policy"
    # The default token cap: an attempt cut off at the cap is not a finished action and is skipped.
    # Two samples per record (the default) check "samples under every record" as well as more would, at half the cost.
    config = _config(out, data_dir, envs=("tools",), failures="model", max_new_tokens=None, retries=2)
    outcome = run_study(config, progress=False)
    assert outcome.n_items == {"tools": LIMIT}
    items = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    assert [i["failure_kind"] for i in items] == ["model"] * LIMIT
    rows = {(r.item_id, r.condition): r for r in read_score_rows(out / "scores.jsonl")}
    for item in items:
        # The failure was decoded greedily from the before context: its greedy completion there is that attempt,
        # and the greedy retry from the clean context repeats it by construction (the report says so).
        assert rows[item["item_id"], "before"].greedy.strip() == item["failed_action"].strip()
        assert rows[item["item_id"], "before"].greedy_repeat_program
        assert rows[item["item_id"], "clean_retry"].greedy_repeat_program
        assert not rows[item["item_id"], "before"].greedy_success
        assert not rows[item["item_id"], "ban"].greedy_repeat
        # Every record and the clean retry are measured by seeded samples too; before's and ban's are not (the own
        # attempt; the ban refuses the action).
        for cond in ("after", "success", "neutral", "description", "dont_repeat", "clean_retry"):
            sampled = rows[item["item_id"], cond]
            assert sampled.sampled_k == 2 and 0 <= sampled.sampled_repeat <= 2, cond
            assert 0 <= sampled.sampled_repeat_semantic <= 2, cond
        assert rows[item["item_id"], "before"].sampled_k is None and rows[item["item_id"], "ban"].sampled_k is None
        assert rows[item["item_id"], "before"].failure_kind.startswith("model:")
    summary = json.loads((out / "summary.json").read_text())
    for cond in ("after", "success", "clean_retry"):
        assert "sampled_repeat_semantic_rate" in summary["tools"]["conditions"][cond], cond
    assert "sampled_repeat_semantic_rate" in summary["tools"]["label"]["repeat_difference"]["after-success"]


def test_an_item_too_long_for_the_model_is_recorded_and_the_run_goes_on(tmp_path, data_dir):
    from fastscore.selection import ModelSelection
    from fastscore.study.data.envs import open_envs
    from fastscore.study.report.meta import skipped_counts
    from fastscore.study.stages.decode import DecodePlan, greedy_stage
    from fastscore.study.stages.score import score_stage

    envs = open_envs(["tools"], data_dir)
    item = envs["tools"].build_items(1, SEED)[0][0]
    huge = replace(item, item_id=item.item_id + ":huge", task=item.task + " please" * 5000)
    store = StudyStore(tmp_path)
    store.start({"test": 1}, resume=False)
    with ModelSelection.resolve("smollm2-135m-instruct", "llamacpp", "q4_1", threads=2).open() as scorer:
        score_stage(store, scorer, envs, [huge, item], progress=False)
        greedy_stage(store, scorer, envs, [huge, item], lambda env: MAX_NEW, DecodePlan(False, 0, SEED), progress=False)
    errors = store.item_errors().load()
    assert list(errors) == [huge.item_id]
    assert errors[huge.item_id][0]["reason"] == "context too long for the model"
    assert "longer than the backend's context" in errors[huge.item_id][0]["detail"]
    assert {r.item_id for r in read_score_rows(tmp_path / "scores.jsonl")} == {item.item_id}
    counts = skipped_counts([], [r for rs in errors.values() for r in rs])
    assert counts == {"tools": {"context too long for the model": 1}}


def test_missing_data_dir_is_a_clear_error_without_traceback(tmp_path):
    missing = tmp_path / "no-such-data"
    result = CliRunner().invoke(main, ["study", "--data", str(missing), "--out", str(tmp_path / "out")])
    assert result.exit_code == DataError.exit_code
    assert "not found" in result.output and str(missing) in result.output
    assert "Traceback" not in result.output
    with pytest.raises(DataError):
        run_study(_config(tmp_path / "out2", missing), progress=False)


# ---------------------------------------------------------------- the store alone (no model)


def test_append_log_keeps_only_complete_items(tmp_path):
    log_file = AppendLog(tmp_path / "x.jsonl", group_size=lambda _id: 2)
    log_file.append([{"item_id": "a", "v": 1}, {"item_id": "a", "v": 2}])
    log_file.append([{"item_id": "b", "v": 1}, {"item_id": "b", "v": 2}])
    with open(tmp_path / "x.jsonl", "a") as fh:
        fh.write('{"item_id": "c", "v": 1}\n{"item_id": "c", "v"')
    assert list(log_file.load()) == ["a", "b"]
    assert (tmp_path / "x.jsonl").read_text().count("\n") == 4  # the repair was written back
    log_file.append([{"item_id": "c", "v": 1}, {"item_id": "c", "v": 2}])
    assert list(log_file.load()) == ["a", "b", "c"]


def test_store_refuses_resume_with_other_settings_and_fresh_runs_clear_results(tmp_path):
    store = StudyStore(tmp_path)
    assert store.start({"seed": 0}, resume=False) is False
    store.scores(8).append([{"item_id": "a"}])
    with pytest.raises(ResumeConfigError, match="seed: was 0, now 1"):
        store.start({"seed": 1}, resume=True)
    assert store.start({"seed": 0}, resume=True) is True
    assert (tmp_path / "scores.jsonl").exists()
    assert store.start({"seed": 0}, resume=False) is False
    assert not (tmp_path / "scores.jsonl").exists()


def test_a_study_without_isolation_says_so_in_its_report(baseline, data_dir, tmp_path):
    from fastscore.study.data.envs.mbpp.isolation import NOT_ISOLATED_NOTE as note
    from fastscore.study.report.document import write_report
    from fastscore.study.report.meta import report_meta

    assert note not in (baseline / "report.md").read_text()  # the default sandbox is bubblewrap
    for config, said in ((_config(tmp_path, data_dir, sandbox="rlimits"), True), (_config(tmp_path, data_dir), False),
                         (_config(tmp_path, data_dir, sandbox="rlimits", envs=("tools",)), False)):  # fmt: skip
        report = write_report({}, tmp_path, report_meta(config, "w", [], [], {}, False)).read_text()
        assert (note in report) == said
    result = CliRunner().invoke(main, ["study", "--sandbox", "chroot", "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and "bwrap" in result.output


def test_a_study_needing_bubblewrap_where_it_is_missing_stops_before_loading_a_model(data_dir, tmp_path, monkeypatch):
    from fastscore.errors import SandboxUnavailableError
    from fastscore.study.data.envs.mbpp.isolation import bwrap_problem

    monkeypatch.setenv("PATH", "/nonexistent")
    bwrap_problem.cache_clear()
    try:
        result = CliRunner().invoke(main, ["study", "--env", "mbpp", "--data", str(data_dir),
                                           "--out", str(tmp_path / "o")])  # fmt: skip
    finally:
        bwrap_problem.cache_clear()
    assert result.exit_code == SandboxUnavailableError.exit_code, result.output
    assert "sudo apt-get install -y bubblewrap" in result.output and "Traceback" not in result.output


def test_the_default_data_folder_does_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    from fastscore.study.data.datafile import default_data_dir

    monkeypatch.delenv("FASTSCORE_DATA", raising=False)
    here = default_data_dir()
    assert here == Path(__file__).resolve().parents[2] / "shared" / "data"  # beside the checkout, as documented
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == here and here.is_absolute()
    assert StudyConfig().data_dir == here
    monkeypatch.setenv("FASTSCORE_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path


def test_a_run_recorded_before_a_setting_existed_resumes_under_its_default(tmp_path):
    store = StudyStore(tmp_path)
    store.start({"seed": 0}, resume=False)  # a config.json written before "sensitivity" was a setting
    store.scores(8).append([{"item_id": "a"}])
    assert store.start({"seed": 0, "sensitivity": False}, resume=True) is True
    assert (tmp_path / "scores.jsonl").exists()
    with pytest.raises(ResumeConfigError, match="sensitivity: was False, now True"):
        store.start({"seed": 0, "sensitivity": True}, resume=True)


def test_study_bound_reads_the_run_and_bounds_each_stage_by_its_tokens(baseline, tmp_path):
    """`python -m fastscore.bench.lab.study_bound`: each stage's tokens x 2 x non-embedding params at the sgemm rate
    it measured."""
    from fastscore.bench.lab.study_bound import cli
    from fastscore.bench.projection import stage_table
    from fastscore.bench.roofline import ModelShape, non_embedding_params

    json_out = tmp_path / "bound.json"
    result = CliRunner().invoke(cli(), [str(baseline), "--threads", "1", "--sgemm-n", "512", "--json-out",
                                        str(json_out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    print(result.output)
    figures = json.loads(json_out.read_text())  # the table is for people; the figures are in --json-out
    shape = ModelShape(**figures["shape"])
    assert figures["flops_per_computed_token"] == 2 * non_embedding_params(shape)
    rate = figures["sgemm"]["gflops"] * 1e9
    (run,) = figures["runs"]
    table = stage_table(baseline / "report.md")
    assert [s["stage"] for s in run["stages"]] == list(table)
    for stage in run["stages"]:
        seconds, tokens = table[stage["stage"]]
        assert stage["tokens"] == (tokens or 0) and stage["measured_seconds"] == seconds
        assert stage["bound_seconds"] == pytest.approx((tokens or 0) * figures["flops_per_computed_token"] / rate)
    assert sum(s["tokens"] for s in run["stages"]) > 0
    assert run["item_runs"] == 2 * LIMIT
    assert run["bound_item_runs_per_hour"] == pytest.approx(3600 * run["item_runs"] / run["bound_seconds"])
    assert "item-runs/h at the bound" in result.output
