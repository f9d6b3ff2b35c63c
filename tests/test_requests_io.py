"""Request files: validation names the line and id (bad JSON, bad UTF-8, lone surrogates, deep nesting included);
valid lines before an error stay written in OUT.partial, OUT itself is replaced only by a complete output, and
--resume / on_error="skip" continue past an interruption or a bad line."""

from __future__ import annotations

import json

import pytest

from fastscore.errors import ContextTooLongError, OutputError, RequestError, ResumeConfigError
from fastscore.outputs import partial_path
from fastscore.requests_io import SKIPPED_SUFFIX, read_requests, score_file

GOOD = {"id": "a", "messages": [{"role": "user", "content": "Say hi"}], "candidates": ["Hi", "Hello"]}


def _line(**changes) -> str:
    record = {**GOOD, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...})


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reads_valid_lines_lazily_and_skips_blank_lines(tmp_path):
    path = _write(tmp_path, [_line(id="a"), "", _line(id=2, banned=["Hi"])])
    records = list(read_requests(path))
    assert [(r.line, r.id, r.banned) for r in records] == [(1, "a", ()), (3, 2, ("Hi",))]
    assert records[0].messages[0].role == "user" and records[0].candidates == ("Hi", "Hello")


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"id": "x", "messages": [', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        (_line(candidates=...), "missing field 'candidates'"),
        (_line(messages=...), "missing field 'messages'"),
        (_line(id=...), "missing field 'id'"),
        (_line(candidates=[]), "empty candidate list"),
        (_line(candidates=["ok", ""]), "candidate 1 is an empty continuation"),
        (_line(messages=[{"role": "wizard", "content": "hi"}]), "unknown role 'wizard'"),
        (_line(messages=[{"role": "user"}]), "string 'content'"),
        (_line(banned="Hi"), "'banned' must be a list of strings"),
        (_line(id=[1]), "'id' must be a string or an integer"),
        (_line(id="first"), "duplicate id (first used on line 1)"),
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        (_line(messages=[{"role": "user", "content": "\ud800"}]), "lone surrogate"),
    ],
)
def test_bad_line_raises_with_its_line_number(tmp_path, bad, message):
    path = _write(tmp_path, [_line(id="first"), _line(id="second"), bad])
    records = read_requests(path)
    assert [r.id for r in (next(records), next(records))] == ["first", "second"]  # lazily: good lines first
    with pytest.raises(RequestError) as err:
        next(records)
    print(err.value)
    assert err.value.line == 3
    assert message in str(err.value)
    assert str(err.value).startswith("line 3")


def test_valid_lines_before_a_bad_line_are_written(tmp_path, fake_scorer):
    lines = [_line(id=f"r{i}") for i in range(5)] + ["{not json"] + [_line(id="after")]
    out = tmp_path / "out.jsonl"
    with pytest.raises(RequestError) as err:
        score_file(fake_scorer, _write(tmp_path, lines), out, chunk_size=4, progress=False)
    assert err.value.line == 6
    assert "rerun with --resume" in " ".join(err.value.__notes__)
    assert not out.exists()
    written = [json.loads(line) for line in partial_path(out).read_text().splitlines()]
    assert [w["id"] for w in written] == [f"r{i}" for i in range(5)]


def test_a_request_failing_in_the_scorer_names_its_line_and_keeps_earlier_lines(tmp_path, fake_scorer):
    long_text = "word " * (fake_scorer.backend.n_ctx + 10)
    lines = [_line(id="r0"), _line(id="r1"), _line(id="long", candidates=[long_text]), _line(id="r3")]
    out = tmp_path / "out.jsonl"
    with pytest.raises(ContextTooLongError) as err:
        score_file(fake_scorer, _write(tmp_path, lines), out, chunk_size=64, progress=False)
    print(err.value)
    assert err.value.line == 3 and "'long'" in str(err.value)
    assert [json.loads(line)["id"] for line in partial_path(out).read_text().splitlines()] == ["r0", "r1"]


def test_output_fields(tmp_path, fake_scorer):
    out = tmp_path / "out.jsonl"
    summary = score_file(
        fake_scorer, _write(tmp_path, [_line(id=7, banned=["Hi"])]), out, generate=True, max_new_tokens=4,
        progress=False,
    )
    assert (summary.n_requests, summary.n_candidates) == (1, 2)
    [line] = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["id"] == 7 and line["scored_end_of_turn"] is True
    assert [c["text"] for c in line["candidates"]] == ["Hi", "Hello"]
    for c in line["candidates"]:
        assert set(c) == {"index", "text", "logprob", "n_tokens", "logprob_per_token", "token_ids", "token_texts",
                          "token_logprobs", "token_ranks", "token_is_argmax", "boundary_straddles", "prob",
                          "prob_per_token"}  # "top_k" only with top_k > 0
        assert len(c["token_logprobs"]) == len(c["token_is_argmax"]) == len(c["token_ids"]) == c["n_tokens"]
        assert c["logprob"] == pytest.approx(sum(c["token_logprobs"]))
    assert sum(c["prob"] for c in line["candidates"]) == pytest.approx(1.0)
    assert set(line["greedy"]) == {"text", "stopped_by", "banned_mass", "banned_steps"}
    assert line["greedy"]["stopped_by"] in ("end_of_turn", "max_tokens")


def _write_bytes(tmp_path, lines: list[bytes]):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_non_utf8_bytes_name_their_line_and_earlier_lines_are_kept(tmp_path, fake_scorer):
    path = _write_bytes(tmp_path, [_line(id="ok").encode(), _line(id="bad").encode().replace(b"Say hi", b"caf\xe9 \xff")])
    out = tmp_path / "out.jsonl"
    with pytest.raises(RequestError, match=r"^line 2: not valid UTF-8 \(byte 0xe9"):
        score_file(fake_scorer, path, out, progress=False)
    assert [json.loads(line)["id"] for line in partial_path(out).read_text().splitlines()] == ["ok"]


def test_a_lone_surrogate_is_a_request_error_not_a_tokenizer_crash(tmp_path, fake_scorer):
    bad = '{"id": "s", "messages": [{"role": "user", "content": "x"}], "candidates": ["\\ud800"]}'
    out = tmp_path / "out.jsonl"
    with pytest.raises(RequestError, match="line 2, request 's': contains a lone surrogate"):
        score_file(fake_scorer, _write(tmp_path, [_line(id="ok"), bad]), out, progress=False)
    assert [json.loads(line)["id"] for line in partial_path(out).read_text().splitlines()] == ["ok"]


def test_an_existing_output_survives_a_failed_run(tmp_path, fake_scorer):
    out = tmp_path / "out.jsonl"
    out.write_text('{"previous": "valuable results"}\n')
    with pytest.raises(RequestError):
        score_file(fake_scorer, _write(tmp_path, [_line(id="a"), "{broken"]), out, progress=False)
    assert out.read_text() == '{"previous": "valuable results"}\n'


def test_the_requests_file_is_never_its_own_output(tmp_path, fake_scorer):
    path = _write(tmp_path, [_line(id="a")])
    before = path.read_bytes()
    with pytest.raises(OutputError, match="is the input file"):
        score_file(fake_scorer, path, tmp_path / "." / "requests.jsonl", progress=False)
    assert path.read_bytes() == before


def test_resume_scores_only_the_missing_ids_and_matches_an_uninterrupted_run(tmp_path, fake_scorer):
    lines = [_line(id=f"r{i}") for i in range(6)]
    whole = tmp_path / "whole.jsonl"
    score_file(fake_scorer, _write(tmp_path, lines), whole, chunk_size=2, progress=False)
    out = tmp_path / "out.jsonl"
    with pytest.raises(RequestError):  # interrupted at line 4
        score_file(fake_scorer, _write(tmp_path, lines[:3] + ["{cut"]), out, chunk_size=2, progress=False)
    with open(partial_path(out), "a") as fh:
        fh.write('{"id": "r3", "candidates": [{"te\n')  # a torn line that still ends in a newline
    calls_before = len(fake_scorer.backend.calls)
    summary = score_file(fake_scorer, _write(tmp_path, lines), out, chunk_size=2, progress=False, resume=True)
    assert (summary.n_resumed, summary.n_requests) == (3, 3)
    assert sum(fake_scorer.backend.calls[calls_before:]) == 3 * 2  # only r3..r5, two candidates each
    assert out.read_text() == whole.read_text()


def test_resume_with_other_settings_is_refused(tmp_path, fake_scorer):
    out = tmp_path / "out.jsonl"
    with pytest.raises(RequestError):
        score_file(fake_scorer, _write(tmp_path, [_line(id="a"), "{cut"]), out, progress=False)
    with pytest.raises(ResumeConfigError, match="generate: was False, now True"):
        score_file(fake_scorer, _write(tmp_path, [_line(id="a")]), out, generate=True, progress=False, resume=True)


def test_skip_sets_bad_lines_aside_with_their_reasons(tmp_path, fake_scorer):
    long_text = "word " * (fake_scorer.backend.n_ctx + 10)
    lines = [_line(id="a"), "{broken", _line(id="long", candidates=[long_text]), _line(id="a"), _line(id="b")]
    out = tmp_path / "out.jsonl"
    summary = score_file(fake_scorer, _write(tmp_path, lines), out, progress=False, on_error="skip")
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]
    skipped = [json.loads(line) for line in (tmp_path / ("out.jsonl" + SKIPPED_SUFFIX)).read_text().splitlines()]
    assert [(s["line"], s["id"]) for s in skipped] == [(2, None), (3, "long"), (4, "a")]
    assert "malformed JSON" in skipped[0]["error"] and "longer than the backend's context" in skipped[1]["error"]
    assert "duplicate id" in skipped[2]["error"]
    assert summary.n_skipped == 3 and summary.skipped_file == tmp_path / ("out.jsonl" + SKIPPED_SUFFIX)
