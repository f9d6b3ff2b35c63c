"""`fastscore sweep`: the grid, shard commits and resume, the cross-model summary, and Ray (a local instance started
inside the tests) giving the same per-item rows as the in-process run, also when a worker or the driver is killed.

The grid runs on the tiny random Llama through llama.cpp f32 (exact, so rows must match byte for byte) in the tools
environment, both failure sources, a few items in one-item shards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from fastscore import __version__
from fastscore.cli import main
from fastscore.errors import DataError, OutputError, ResumeConfigError
from fastscore.study.data.envs import ENV_CLASSES
from fastscore.study.data.envs.mbpp.env import MbppEnv
from fastscore.study.data.envs.tools.env import ToolsEnv
from fastscore.sweep import grid
from fastscore.sweep import items as sweep_items
from fastscore.sweep.run import SweepConfig, run_sweep
from fastscore.sweep.summary import mark_by_construction, sign_check, table_markdown

LIMIT = 3
MAX_NEW = 6


# --- the grid: pure ---

def test_shards_cover_each_cell_once_in_windows():
    cell = grid.Cell("m", "llamacpp", "f32", "tools", "seeded")
    shards = grid.shards_of(cell, 23, 10)
    assert [(s.start, s.stop) for s in shards] == [(0, 10), (10, 20), (20, 23)]
    assert len({s.key for s in shards}) == 3 and all(s.key.startswith(cell.key + "/") for s in shards)
    assert grid.shards_of(cell, 0, 10) == []
    with pytest.raises(DataError):
        grid.shards_of(cell, 5, 0)


def test_variants_models_and_failure_sources_are_checked():
    assert grid.parse_variant("f32") == ("llamacpp", "f32")
    assert grid.parse_variant("onnx:int8") == ("onnx", "int8")
    with pytest.raises(Exception, match="q3"):
        grid.parse_variant("q3")
    assert grid.model_slug("smollm2-135m-instruct") == "smollm2-135m-instruct"
    a, b = grid.model_slug("/x/tiny-llama"), grid.model_slug("/y/tiny-llama")
    assert a != b and "/" not in a and a.startswith("tiny-llama-")
    with pytest.raises(DataError, match="failure source"):
        grid.cells(("m",), (("llamacpp", "f32"),), ("tools",), ("seeded", "typo"))


def _est(mean, lo, hi):
    return {"mean": mean, "lo": lo, "hi": hi, "n": 20}


def _cell(variant, est):
    return {"model": "m", "env": "tools", "failures": "seeded", "variant": variant, "status": "done",
            "summary": {"conditions": {"after": {"gain_per_token": est}}}}


def test_sign_check_flags_only_resolved_flips():
    ref = _cell("llamacpp:f32", _est(-0.5, -0.7, -0.3))
    checks = {c["variant"]: c["verdict"] for c in sign_check([
        ref, _cell("llamacpp:q4_1", _est(-0.4, -0.6, -0.2)), _cell("llamacpp:q4_0", _est(0.3, 0.1, 0.5)),
        _cell("llamacpp:q8_0", _est(0.1, -0.1, 0.3))])}
    assert checks == {"llamacpp:q4_1": "sign kept", "llamacpp:q4_0": "SIGN FLIPPED",
                      "llamacpp:q8_0": "undetermined: this variant's 95% CI includes 0"}
    alone = sign_check([_cell("llamacpp:q4_1", _est(-0.4, -0.6, -0.2))])
    assert alone[0]["verdict"].startswith("not applicable")


def test_greedy_reproduction_before_is_not_applicable_under_the_model_s_own_failures():
    def cell(failures):
        c = _cell("llamacpp:f32", _est(-0.5, -0.7, -0.3))
        conds = c["summary"]["conditions"]
        conds["before"] = {"greedy_repeat": _est(1.0, 0.84, 1.0)}
        conds["after"]["greedy_repeat"] = _est(0.05, 0.01, 0.24)
        return {**c, "failures": failures, "summary": mark_by_construction({**c["summary"], "n_items": 20}, failures)}

    seeded, model = table_markdown({"cells": [cell("seeded"), cell("model")]}).splitlines()[2:]
    assert "| 100% [84%, 100%] (n=20) → 5% [1%, 24%] (n=20) |" in seeded
    assert "| not applicable (the model's own attempt: by construction) → 5% [1%, 24%] (n=20) |" in model
    assert "100%" not in model


# --- end to end on the tiny model ---

def _config(model: Path, data: Path, out: Path, **changes) -> SweepConfig:
    base = {"models": (str(model),), "variants": ("f32",), "envs": ("tools",), "failures": ("seeded", "model"),
            "limit": LIMIT, "shard_size": 1, "seed": 0, "out_dir": out, "data_dir": data, "threads": 1,
            "max_new_tokens": MAX_NEW, "n_boot": 50}
    return SweepConfig(**{**base, **changes})


def _shard_files(out: Path) -> dict[str, bytes]:
    """Every committed shard's per-item rows, by path under the sweep folder."""
    files = {}
    for name in ("scores.jsonl", "logprobs.jsonl", "items.jsonl"):
        for path in sorted((out / "cells").rglob(name)):
            assert ".partial" not in str(path.parent), f"uncommitted shard left behind: {path.parent}"
            files[str(path.relative_to(out))] = path.read_bytes()
    return files


@pytest.fixture(scope="module")
def in_process(tiny_model, study_data, tmp_path_factory):
    model = tiny_model("llama")
    out = tmp_path_factory.mktemp("sweep") / "in-process"
    outcome = run_sweep(_config(model, study_data, out))
    return model, out, outcome, _shard_files(out)


def test_in_process_sweep_writes_shards_and_the_cross_model_summary(in_process):
    model, out, outcome, files = in_process
    assert outcome.n_shards == 2 * LIMIT and outcome.n_resumed == 0 and not outcome.skipped
    assert sum(1 for _ in (out / "cells").rglob("shard.json")) == 2 * LIMIT  # empty shards are committed too
    assert sum(name.endswith("scores.jsonl") and "tools-seeded" in name for name in files) == LIMIT
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["versions"]["fastscore_version"] == __version__
    assert summary["meta"]["versions"]["libraries"]["llama-cpp-python"]
    cells = {c["failures"]: c for c in summary["cells"]}
    assert set(cells) == {"seeded", "model"}
    assert cells["seeded"]["status"] == "done" and cells["seeded"]["n_items"] == LIMIT
    # The random model's attempts run into the token cap, and a cut-off attempt is no item: the cell says so.
    model_items = sum(len(files[n].splitlines()) for n in files if "tools-model" in n and n.endswith("items.jsonl"))
    assert cells["model"]["status"] == ("done" if model_items else "empty")
    # The cell's summary pools its shards: as many items as the shards hold.
    n_seeded = sum(len(files[n].splitlines()) for n in files if "tools-seeded" in n and n.endswith("items.jsonl"))
    assert cells["seeded"]["summary"]["n_items"] == n_seeded == LIMIT
    text = (out / "summary.md").read_text()
    assert "| model | variant | env | failures |" in text and Path(model).name in text
    assert (out / "sweep_gain_by_size.png").stat().st_size > 1000


def test_the_tiny_families_stand_in_for_the_registry_s_other_models(tiny_model, study_data, tmp_path):
    models = tuple(str(tiny_model(arch)) for arch in ("llama", "qwen2", "qwen3"))
    outcome = run_sweep(_config(models[0], study_data, tmp_path / "families", models=models, failures=("seeded",),
                                limit=1, variants=("f32", "q8_0")))
    cells = json.loads((tmp_path / "families" / "summary.json").read_text())["cells"]
    assert [(c["model"], c["variant"], c["status"]) for c in cells] == [
        (m, v, "done") for m in models for v in ("llamacpp:f32", "llamacpp:q8_0")]
    assert outcome.n_shards == 6 and len(outcome.result["sign_check"]) == 3


def test_a_finished_sweep_is_kept_unless_resumed_with_the_same_settings(in_process, study_data):
    model, out, _, files = in_process
    with pytest.raises(OutputError, match="--resume"):
        run_sweep(_config(model, study_data, out))
    with pytest.raises(ResumeConfigError, match="limit"):
        run_sweep(_config(model, study_data, out, resume=True, limit=LIMIT + 1))
    again = run_sweep(_config(model, study_data, out, resume=True))
    assert again.n_resumed == again.n_shards == 2 * LIMIT
    assert _shard_files(out) == files


def test_a_model_that_cannot_be_obtained_is_reported_not_dropped(in_process, study_data, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is never asked, here or anywhere else
    model, *_ = in_process
    out = tmp_path / "sw"
    result = CliRunner().invoke(main, ["sweep", "--models", f"{model},qwen3-0.6b", "--env", "tools", "--failures",
                                       "seeded", "--limit", "1", "--threads", "1", "--max-new-tokens", str(MAX_NEW),
                                       "--n-boot", "20", "--data", str(study_data), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped qwen3-0.6b (llamacpp:f32): cannot be obtained here" in result.output
    cells = json.loads((out / "summary.json").read_text())["cells"]
    assert {c["model"]: c["status"] for c in cells} == {str(model): "done", "qwen3-0.6b": "skipped"}
    assert "## Skipped" in (out / "summary.md").read_text()


# --- each environment's items built once per sweep ---

BUILDS: list[tuple[str, int | None]] = []  # (environment, limit) of every build_items call of the counting envs


class CountingToolsEnv(ToolsEnv):
    """The real tools environment, counting its builds."""

    def build_items(self, limit, seed):
        BUILDS.append((self.name, limit))
        return super().build_items(limit, seed)


class CountingMbppEnv(MbppEnv):
    """The real MBPP environment (its builds run the mutated programs in the sandbox), counting its builds."""

    def build_items(self, limit, seed):
        BUILDS.append((self.name, limit))
        return super().build_items(limit, seed)


def test_each_environment_s_items_are_built_once_per_sweep_and_reused_on_resume(tiny_model, study_data, tmp_path,
                                                                               monkeypatch):
    for env, counting in (("tools", CountingToolsEnv), ("mbpp", CountingMbppEnv)):
        monkeypatch.setitem(ENV_CLASSES, env, (__name__, counting.__name__))
    BUILDS.clear()
    model = tiny_model("llama")
    out = tmp_path / "once"
    config = _config(model, study_data, out, envs=("tools", "mbpp"), limit=2)
    first = run_sweep(config)
    assert first.n_shards == 2 * 2 * 2  # envs x failure sources x one-item shards
    # One build per environment, by the driver: no shard, seeded or on-policy, builds the order again.
    assert BUILDS == [("tools", 2), ("mbpp", 2)]
    files = _shard_files(out)
    assert sum(name.endswith("scores.jsonl") and "-seeded/" in name for name in files) == 4

    # A resumed sweep reuses the stored items, also for the shards it redoes.
    tools_seeded = grid.Cell(str(model), "llamacpp", "f32", "tools", "seeded")
    redone = [grid.shards_of(tools_seeded, 2, 1)[1], grid.shards_of(grid.Cell(str(model), "llamacpp", "f32", "mbpp",
                                                                              "seeded"), 2, 1)[0]]
    for shard in redone:
        shutil.rmtree(out / "cells" / shard.key)
    BUILDS.clear()
    again = run_sweep(replace(config, resume=True))
    assert BUILDS == [] and again.n_resumed == again.n_shards - len(redone)
    assert _shard_files(out) == files

    # A shard cut from the stored list holds the rows the study writes when it builds the window itself.
    from fastscore.study.runner import StudyConfig, run_study

    alone = tmp_path / "alone"
    run_study(StudyConfig(model=str(model), backend="llamacpp", quant="f32", envs=("tools",), limit=1,
                          failures="seeded", out_dir=alone, data_dir=study_data, max_new_tokens=MAX_NEW, threads=1,
                          window=(1, 2)), report=False)
    assert BUILDS == [("tools", 2)]
    for name in ("items.jsonl", "logprobs.jsonl", "scores.jsonl"):
        assert (alone / name).read_bytes() == files[f"cells/{redone[0].key}/{name}"]

    # A stored list of another format version, or built under other settings, is refused.
    path = sweep_items.items_path(out, "tools")
    header, *rest = path.read_text().splitlines(keepends=True)
    for changed in ({"version": sweep_items.VERSION + 1}, {"settings": {**json.loads(header)["settings"], "seed": 7}}):
        path.write_text(json.dumps({**json.loads(header), **changed}) + "\n" + "".join(rest))
        with pytest.raises(ResumeConfigError, match="version|seed was 7"):
            run_sweep(replace(config, resume=True))


# --- Ray: a local instance inside the tests ---

@pytest.fixture(scope="module")
def local_ray():
    import ray

    env = {k: os.environ[k] for k in ("FASTSCORE_HOME", "FASTSCORE_DATA") if k in os.environ}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": env} if env else None)
    yield ray
    ray.shutdown()


def _actor_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ray::ShardActor" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_ray_workers_give_the_in_process_rows_even_when_killed_mid_shard(in_process, study_data, tmp_path,
                                                                      local_ray, caplog):
    model, _, _, want = in_process
    out = tmp_path / "ray"
    config = _config(model, study_data, out, ray="local", workers=2)
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            run_sweep(config)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test thread below)
            errors.append(exc)

    driver = threading.Thread(target=drive)
    driver.start()
    killed = []
    deadline = time.monotonic() + 300
    while driver.is_alive() and not killed and time.monotonic() < deadline:
        if any((out / "cells").rglob("*.partial")) and _actor_pids():
            for pid in _actor_pids():  # mid-shard: its .partial folder exists until the shard commits
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.02)
    driver.join(600)
    assert not errors, errors
    assert killed, "no worker was seen running a shard"
    assert "redoing it on a new worker" in caplog.text
    got = _shard_files(out)
    assert got.keys() == want.keys()
    differing = [name for name in want if got[name] != want[name]]
    print(f"{len(want)} row files compared, {len(differing)} differ; killed workers {killed}")
    assert not differing


def test_a_killed_driver_resumes_with_only_the_unfinished_shards(in_process, study_data, tmp_path):
    model, _, _, want = in_process
    out = tmp_path / "killed"
    args = ["sweep", "--models", str(model), "--env", "tools", "--failures", "seeded,model", "--limit", str(LIMIT),
            "--shard-size", "1", "--threads", "1", "--max-new-tokens", str(MAX_NEW), "--n-boot", "50",
            "--data", str(study_data), "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", "from fastscore.cli import main; main()", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not any((out / "cells").rglob("shard.json")) and time.monotonic() < deadline:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    n_done = sum(1 for _ in (out / "cells").rglob("shard.json"))
    assert 1 <= n_done < 2 * LIMIT
    result = CliRunner().invoke(main, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert f"({n_done} already done)" in result.output
    assert _shard_files(out) == want


def test_a_shard_that_fails_on_a_ray_worker_stops_the_sweep_naming_the_shard(in_process, study_data, tmp_path,
                                                                          local_ray):
    from fastscore.errors import SweepError
    from fastscore.sweep.ray_exec import run_on_ray
    from fastscore.sweep.worker import ShardSettings

    model, *_ = in_process
    blocker = tmp_path / "a-file"
    blocker.write_text("the shard's folder cannot be made under a file\n")
    shard = grid.shards_of(grid.Cell(str(model), "llamacpp", "f32", "tools", "seeded"), 1, 1)[0]
    settings = ShardSettings(out_dir=blocker, data_dir=study_data, threads=1, max_new_tokens=MAX_NEW)
    with pytest.raises(SweepError, match=f"shard {shard.key} failed on a Ray worker") as caught:
        run_on_ray([shard], settings, "local", 1, 1, lambda done: None)
    assert "\n" not in str(caught.value)
