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
