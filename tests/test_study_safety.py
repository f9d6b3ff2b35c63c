"""`study`, `bench quant` and `bench throughput` validate model, backend, quant and data before their output folder is created
or cleaned; a study holds an exclusive lock on --out; a resumed study survives a torn line that ends in a newline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from fastscore.cli import main
from fastscore.outputs import OutDirLock
from fastscore.study.stages.store import AppendLog

DATA = Path(os.environ.get("FASTSCORE_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
PREVIOUS = {"config.json": '{"model": "previous"}\n', "logprobs.jsonl": '{"item_id": "x"}\n',
            "scores.jsonl": '{"item_id": "x", "condition": "after"}\n', "summary.json": "{}\n"}


@pytest.fixture
def previous_run(tmp_path) -> Path:
    out = tmp_path / "prev-run"
    out.mkdir()
    for name, text in PREVIOUS.items():
        (out / name).write_text(text)
    return out


def _files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if not p.name.startswith(".")}


def _invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    print(result.output)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


MISSING = "/nonexistent-study-data"


@pytest.mark.parametrize(
    "args, code, message",
    [
        # No --quant: the default quant of the backend (fp32), so the run gets as far as the data.
        (["--backend", "onnx", "--data", MISSING], 7, "study data folder"),
        (["--backend", "reference", "--data", MISSING], 7, "study data folder"),
        (["--quant", "q9_9", "--data", MISSING], 2, "unknown quant 'q9_9'"),
        (["--model", "smollm2-135m-instruckt", "--data", MISSING], 2, "Did you mean"),
        (["--backend", "tensorrt", "--data", MISSING], 2, "unknown backend"),
    ],
)
def test_a_bad_setting_leaves_the_previous_run_intact(previous_run, args, code, message):
    result = _invoke("study", "--out", previous_run, *args)
    assert result.exit_code == code and message in result.output
    assert _files(previous_run) == PREVIOUS


def test_the_default_quant_is_the_backends():
    from fastscore.study.runner import StudyConfig

    assert [StudyConfig(backend=b).quant for b in ("llamacpp", "onnx", "reference")] == ["f32", "fp32", "fp32"]


def test_a_new_out_folder_is_not_created_for_a_run_that_cannot_start(tmp_path):
    for command in (["study", "--model", "nope-model", "--data", DATA], ["bench", "quant", "--model", "nope-model"]):
        out = tmp_path / f"{command[0]}-out"
        result = _invoke(*command, "--out", out)
        assert result.exit_code == 2 and "unknown model 'nope-model'" in result.output
        assert not out.exists()


def test_a_model_that_fails_to_load_leaves_the_previous_run_intact(previous_run, tmp_path):
    if not DATA.is_dir():
        pytest.skip(f"study data not found at {DATA}")
    broken = tmp_path / "broken-checkpoint"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "not-a-model"}')
    result = _invoke("study", "--model", broken, "--out", previous_run, "--data", DATA, "--limit", "1")
    assert result.exit_code != 0 and result.output.count("Error:") == 1
    assert _files(previous_run) == PREVIOUS


def test_a_second_study_on_the_same_out_is_refused_naming_the_holder(previous_run):
    if not DATA.is_dir():
        pytest.skip(f"study data not found at {DATA}")
    with OutDirLock(previous_run):
        result = _invoke("study", "--out", previous_run, "--data", DATA, "--limit", "1")
    assert result.exit_code == 10
    assert f"in use by another run (pid {os.getpid()}" in result.output
    assert _files(previous_run) == PREVIOUS


def test_bench_checks_its_data_before_converting_anything(tmp_path):
    result = _invoke("bench", "throughput", "--data", tmp_path / "missing", "--json-out", tmp_path / "b.json")
    assert result.exit_code == 7 and not (tmp_path / "b.json").exists()


def test_a_torn_last_line_that_ends_in_a_newline_is_dropped_not_fatal(tmp_path):
    log = AppendLog(tmp_path / "scores.jsonl")
    good = [{"item_id": f"i{k}", "value": k} for k in range(3)]
    log.append(good)
    with open(log.path, "a") as fh:
        fh.write('{"item_id": "i3", "val\n')
    assert list(log.load()) == ["i0", "i1", "i2"]
    assert [json.loads(x) for x in log.path.read_text().splitlines()] == good  # repaired on disk
    with open(log.path, "a") as fh:  # unreadable in the middle is still an error, not silent loss
        fh.write('{broken\n{"item_id": "i9"}\n')
    from fastscore.errors import DataError

    with pytest.raises(DataError, match="unreadable line"):
        log.load()
