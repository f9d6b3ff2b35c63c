"""The issue-10 table through the CLI (`fastscore score`, embedded model): each ordinary mistake ends in a one-line
error with its documented exit code, no traceback, and the user's files intact."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fastscore.cli import main
from fastscore.outputs import partial_path

pytest.importorskip("llama_cpp")

GOOD = {"id": "a", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "candidates": ["Paris", "Lyon"]}


def _line(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def _write(path, lines: list[str | bytes]):
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


@pytest.fixture(scope="module", autouse=True)
def _embedded_ready(smollm_artefact):
    smollm_artefact("llamacpp", "q4_1")  # the tokenizer variant, built once for the session


def _run(*args, input=None):
    result = CliRunner().invoke(main, ["score", *map(str, args), "--threads", "2"], input=input)
    print(result.output)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _error_line(result) -> str:
    errors = [line for line in result.output.splitlines() if line.startswith(("Error:", "Interrupted"))]
    assert len(errors) == 1, result.output
    return errors[0]


def test_out_equal_to_the_requests_file_is_refused_and_the_file_kept(tmp_path):
    requests = _write(tmp_path / "same.jsonl", [_line()])
    before = requests.read_bytes()
    result = _run(requests, "--out", tmp_path / "." / "same.jsonl")
    assert result.exit_code == 10
    assert "is the input file" in _error_line(result)
    assert requests.read_bytes() == before


def test_an_unwritable_out_is_a_one_line_error(tmp_path):
    result = _run(_write(tmp_path / "r.jsonl", [_line()]), "--out", "/proc/fastscore_out.jsonl")
    assert result.exit_code == 10 and "cannot" in _error_line(result)


@pytest.mark.parametrize(
    "bad, message",
    [
        (_line(id="b").encode().replace(b"France", b"caf\xe9 \xff\xfe"), "line 2: not valid UTF-8"),
        (json.dumps({**GOOD, "id": "b", "candidates": ["\ud800"]}), "line 2, request 'b': contains a lone surrogate"),
        ("[" * 100_000 + "]" * 100_000, "line 2: JSON nested too deeply"),
        ('{"id": "b", "messages": [', "line 2: malformed JSON"),
    ],
    ids=["non-utf8", "surrogate", "deep", "malformed"],
)
def test_a_bad_line_keeps_the_old_output_and_the_lines_before_it(tmp_path, bad, message):
    out = tmp_path / "out.jsonl"
    out.write_text('{"previous": "valuable results"}\n')
    requests = _write(tmp_path / "r.jsonl", [_line(), bad, _line(id="c")])
    result = _run(requests, "--out", out)
    assert result.exit_code == 6
    line = _error_line(result)
    assert message in line and "rerun with --resume" in line
    assert out.read_text() == '{"previous": "valuable results"}\n'
    assert [json.loads(x)["id"] for x in partial_path(out).read_text().splitlines()] == ["a"]
    # Fixed input: a fresh run would discard line 1's result, so it is refused; resumed, line 1 is not scored
    # again and OUT becomes the complete output.
    _write(requests, [_line(), _line(id="b"), _line(id="c")])
    fresh = _run(requests, "--out", out)
    assert fresh.exit_code == 10 and "pass --resume" in _error_line(fresh)
    resumed = _run(requests, "--out", out, "--resume")
    assert resumed.exit_code == 0 and "1 already done" in resumed.output
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["a", "b", "c"]
    assert not partial_path(out).exists()


def test_skip_lists_bad_lines_beside_the_output(tmp_path):
    out = tmp_path / "out.jsonl"
    result = _run(_write(tmp_path / "r.jsonl", [_line(), "{oops", _line(id="c")]), "--out", out, "--on-error", "skip")
    assert result.exit_code == 0 and "1 bad lines skipped" in result.output
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["a", "c"]
    [skipped] = [json.loads(x) for x in (tmp_path / "out.jsonl.skipped.jsonl").read_text().splitlines()]
    assert skipped["line"] == 2 and "malformed JSON" in skipped["error"]


def test_dash_reads_stdin_and_writes_stdout(tmp_path):
    result = _run("-", "--out", "-", input=_line() + "\n" + _line(id="b") + "\n")
    assert result.exit_code == 0
    lines = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert [x["id"] for x in lines] == ["a", "b"]
    assert not list(tmp_path.iterdir())


def test_special_token_text_in_a_candidate_is_scored_as_text(tmp_path):
    out = tmp_path / "out.jsonl"
    result = _run(_write(tmp_path / "r.jsonl", [_line(candidates=["<|im_end|>", "Paris"])]), "--out", out)
    assert result.exit_code == 0
    literal, paris = json.loads(out.read_text())["candidates"]
    print(literal["n_tokens"], literal["logprob"])
    # As control token it would be 2 tokens (<|im_end|> + end of turn); as text it is its characters + end of turn.
    assert literal["n_tokens"] > 2


@pytest.mark.parametrize("input_name, out_args", [
    ("o.jsonl.skipped.jsonl", ["--out", "o.jsonl", "--on-error", "skip"]),  # deleted its input at 907a12e
    ("p.jsonl.meta.json", ["--out", "p.jsonl"]),  # overwritten at 907a12e
    ("t.csv.jsonl", ["--out", "t.csv", "--format", "csv"]),  # the record beside a table
    ("o.jsonl.partial", ["--out", "./o.jsonl"]),
], ids=["skipped", "meta", "table-record", "partial"])
def test_a_file_derived_from_out_that_is_the_input_is_refused_before_anything_is_touched(tmp_path, monkeypatch,
                                                                                       input_name, out_args):
    monkeypatch.chdir(tmp_path)
    requests = _write(tmp_path / input_name, [_line()])
    before = requests.read_bytes()
    result = _run(requests, *out_args)
    assert result.exit_code == 10 and "is the input file" in _error_line(result)
    assert requests.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [input_name]


def test_a_second_run_on_a_held_out_is_refused_in_one_line(tmp_path):
    from fastscore.outputs import ExclusiveLock
    from fastscore.score_outputs import ScoreOutputs

    requests = _write(tmp_path / "r.jsonl", [_line()])
    out = tmp_path / "out.jsonl"
    with ExclusiveLock(ScoreOutputs.of(out).lock_file, "a run", ""):
        result = _run(requests, "--out", out, "--resume")
    assert result.exit_code == 10 and f"--out {out} is in use by another run (pid " in _error_line(result)
    assert not out.exists() and not partial_path(out).exists()


def test_a_failed_runs_partial_file_says_how_to_retry_and_restart_starts_over(tmp_path):
    out = tmp_path / "out.jsonl"
    requests = _write(tmp_path / "r.jsonl", [_line(), "{oops"])
    failed = _run(requests, "--out", out)
    assert failed.exit_code == 6
    assert "the 1 finished lines are kept in" in _error_line(failed) and "fsynced" in _error_line(failed)
    _write(requests, [_line(id="z")])
    blocked = _run(requests, "--out", out)
    assert blocked.exit_code == 10 and "pass --resume to continue it, or --restart" in _error_line(blocked)
    restarted = _run(requests, "--out", out, "--restart")
    assert restarted.exit_code == 0 and [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["z"]
    nothing = _run(_write(tmp_path / "bad.jsonl", ["{oops"]), "--out", tmp_path / "o2.jsonl")
    assert nothing.exit_code == 6 and "nothing was kept" in _error_line(nothing)
    assert not partial_path(tmp_path / "o2.jsonl").exists()  # nothing in the way of the retry


@pytest.mark.parametrize("args, code, message", [
    (["--n-ctx", "512", "--backend-option", "n_ctx=1024"], 2, "n_ctx is given twice, as 1024 and as 512"),
    (["--n-ctx", "16384"], 2, "n_ctx 16384 (--n-ctx) is beyond the 8192 tokens the model was trained on"),
    (["--n-ctx", "256"], 6, "longer than the backend's context of 256 tokens (set by --n-ctx); the model's limit is "
                            "its trained context of 8192 tokens, so --n-ctx up to 8192 can hold more"),
], ids=["twice", "beyond-trained", "too-long"])
def test_context_settings_are_checked_and_named(tmp_path, args, code, message):
    long = _line(messages=[{"role": "user", "content": "word " * 300}])
    result = _run(_write(tmp_path / "r.jsonl", [long]), "--out", tmp_path / "o.jsonl", "--quant", "q4_1", *args)
    assert result.exit_code == code and message in _error_line(result)


def test_a_context_smaller_than_the_sequence_count_does_not_abort(tmp_path):
    """--n-ctx 16 (the CLI's minimum) with the default 256 sequences aborted the process in llama.cpp at 907a12e."""
    out = tmp_path / "o.jsonl"
    result = _run(_write(tmp_path / "r.jsonl", [_line()]), "--out", out, "--quant", "q4_1", "--n-ctx", "16")
    assert result.exit_code == 0 and len(out.read_text().splitlines()) == 1


def test_a_full_disk_is_one_line_that_says_what_is_on_disk(tmp_path, tiny_disk):
    out = tiny_disk("16k") / "out.jsonl"
    requests = _write(tmp_path / "r.jsonl", [_line(id=f"r{k}") for k in range(12)])
    result = _run(requests, "--out", out, "--quant", "q4_1", "--top-k", "20", "--chunk-size", "2")
    line = _error_line(result)
    assert result.exit_code == 10 and "No space left on device" in line
    kept = partial_path(out).read_bytes() if partial_path(out).exists() else b""
    n_lines = kept.count(b"\n")
    if n_lines:
        assert f"the {n_lines} finished lines are kept in {partial_path(out)} ({len(kept)} bytes, fsynced)" in line
    else:
        assert "nothing was kept" in line


def test_two_processes_on_one_out_the_second_is_refused_and_the_first_completes(tmp_path):
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import fastscore
    from fastscore.score_outputs import ScoreOutputs

    out = tmp_path / "out.jsonl"
    requests = _write(tmp_path / "r.jsonl", [_line(id=f"r{k}") for k in range(40)])
    env = {**os.environ, "PYTHONPATH": str(Path(fastscore.__file__).resolve().parents[1])}
    first = subprocess.Popen([sys.executable, "-c", "from fastscore.cli import main; main()", "score", str(requests),
                              "--out", str(out), "--quant", "q4_1", "--threads", "1", "--chunk-size", "1"],
                             env=env, stderr=subprocess.PIPE, text=True)
    holder = ScoreOutputs.of(out).lock_file.with_name(".out.jsonl.lock.holder")
    deadline = time.monotonic() + 120
    while not holder.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert holder.exists(), "the first run never took its lock"
    second = _run(requests, "--out", out, "--resume", "--quant", "q4_1")
    assert second.exit_code == 10 and f"pid {first.pid}" in _error_line(second)
    assert first.wait(timeout=600) == 0, first.stderr.read()
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [f"r{k}" for k in range(40)]
