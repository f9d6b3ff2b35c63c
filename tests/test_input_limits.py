"""Inputs are bounded before they are tokenized: a huge line is refused as it is read (time and memory measured), a
text that cannot fit the context is refused on its byte count; lone surrogates are refused with their line; a full
disk is one OutputError whose note says exactly what is on disk; "context too long" names what sets the context."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from scorer_helpers import CountingFakeBackend

from fastscore.errors import ContextTooLongError, OutputError, RequestError
from fastscore.outputs import partial_path
from fastscore.records import ScoreRequest
from fastscore.requests_io import LINE_WINDOWS, default_line_limit, score_file
from fastscore.scorer import Scorer

GOOD = {"id": "a", "messages": [{"role": "user", "content": "Say hi"}], "candidates": ["Hi", "Hello"]}


def _line(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def test_a_50_mb_line_is_refused_in_under_a_second_and_200_mb(tmp_path, fake_scorer):
    huge = _line(id="huge", candidates=["x" * (50 << 20)])
    alone, among = tmp_path / "alone.jsonl", tmp_path / "among.jsonl"
    alone.write_bytes(huge + b"\n")
    among.write_bytes(b"\n".join([_line(id="a"), huge, _line(id="c")]) + b"\n")
    del huge
    started = time.perf_counter()
    limit = default_line_limit(fake_scorer)  # once per run: the vocabulary's longest token
    setup = time.perf_counter() - started
    assert limit == LINE_WINDOWS * fake_scorer.backend.n_ctx * fake_scorer.max_token_bytes
    started, cpu = time.perf_counter(), time.process_time()
    with pytest.raises(RequestError, match=f"^line 1: the line is 52,428,8.. bytes, more than the {limit:,}"):
        score_file(fake_scorer, alone, tmp_path / "out.jsonl", progress=False)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu  # CPU: the machine is shared
    tracemalloc.start()  # a second run, for memory (tracemalloc slows allocations, so it is not timed)
    with pytest.raises(RequestError):
        score_file(fake_scorer, alone, tmp_path / "again.jsonl", progress=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"\n50 MB line: longest-token bound {setup:.3f} s once per run; the line refused in {seconds:.3f} s ({cpu:.3f} s CPU), peak "
          f"traced memory {peak / 1e6:.1f} MB (limit {limit:,} bytes)")
    assert cpu < 1.0 and peak < 200e6
    out = tmp_path / "skip.jsonl"  # skipped, the lines around it are scored
    summary = score_file(fake_scorer, among, out, progress=False, on_error="skip")
    [skipped] = [json.loads(x) for x in (tmp_path / "skip.jsonl.skipped.jsonl").read_text().splitlines()]
    assert skipped["line"] == 2 and f"more than the {limit:,} a request line may hold" in skipped["error"]
    assert summary.n_requests == 2 and [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["a", "c"]


def test_a_text_that_cannot_fit_is_refused_before_it_is_tokenized(tmp_path, smollm_tokenizer):
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer)
    encoded: list[int] = []
    real_encode = smollm_tokenizer.encode
    scorer.tokenizer.encode = lambda text, spans=(): encoded.append(len(text)) or real_encode(text, spans)
    try:
        text = "word " * (scorer.max_text_bytes // 5 + 1)  # under the line limit, over what the context can hold
        with pytest.raises(ContextTooLongError, match=r"bytes, more than 512 tokens of at most \d+ bytes"):
            scorer.score([ScoreRequest("long", (), text, prompt="Once")])
        assert encoded == []  # refused on its byte count alone
        scorer.score([ScoreRequest("short", (), " word", prompt="Once")])
        assert encoded  # the instrument sees what is tokenized
    finally:
        del scorer.tokenizer.encode


@pytest.mark.parametrize("bad", [
    b'{"id": "s", "messages": [{"role": "user", "content": "\\ud83d"}], "candidates": ["\\ude00"]}',
    b'{"id": "s", "prompt": "\\ud83d", "continuations": ["\\ude00"]}',
], ids=["chat", "raw"])
def test_halves_of_a_surrogate_pair_in_separate_strings_are_refused_with_their_line(tmp_path, fake_scorer, bad):
    requests = tmp_path / "r.jsonl"
    requests.write_bytes(_line(id="ok") + b"\n" + bad + b"\n")
    with pytest.raises(RequestError, match=r"^line 2, request 's': contains a lone surrogate \('\\ud83d'\)"):
        score_file(fake_scorer, requests, tmp_path / "out.jsonl", progress=False)


def test_a_pair_within_one_string_is_kept_exactly(tmp_path, fake_scorer):
    requests = tmp_path / "r.jsonl"
    requests.write_bytes(b'{"id": "e", "prompt": "Smile", "continuations": [" \\ud83d\\ude00"]}\n')
    score_file(fake_scorer, requests, tmp_path / "out.jsonl", progress=False)
    [candidate] = json.loads((tmp_path / "out.jsonl").read_text())["candidates"]
    assert candidate["text"] == " \U0001F600"


def test_the_python_api_refuses_lone_surrogates_too(fake_scorer):
    with pytest.raises(RequestError, match="lone surrogate"):
        fake_scorer.score([ScoreRequest("s", (), "\ude00", prompt="x\ud83d")])


class LlamaLikeBackend(CountingFakeBackend):
    """The fake, describing its context as llama.cpp does (an option sets it; the weights say the trained one)."""

    context_option = "--n-ctx"
    n_ctx_train = 2048


def test_context_too_long_names_the_option_and_the_models_limit(smollm_tokenizer):
    scorer = Scorer(LlamaLikeBackend(n_ctx=64), smollm_tokenizer)
    with pytest.raises(ContextTooLongError) as err:
        scorer.score([ScoreRequest("long", (), " word" * 100, prompt="Once")])
    print(err.value)
    assert "longer than the backend's context of 64 tokens (set by --n-ctx)" in str(err.value)
    assert "trained context of 2048 tokens, so --n-ctx up to 2048 can hold more" in str(err.value)


def test_a_full_disk_is_one_error_that_says_exactly_what_was_kept(tmp_path, tiny_disk, fake_scorer):
    requests = tmp_path / "r.jsonl"
    requests.write_bytes(b"".join(_line(id=f"r{k}") + b"\n" for k in range(400)))
    out = tiny_disk("64k") / "out.jsonl"
    with pytest.raises(OutputError, match="No space left on device") as err:
        score_file(fake_scorer, requests, out, progress=False, chunk_size=8)
    note = " ".join(err.value.__notes__)
    print(err.value, note)
    kept = partial_path(out).read_bytes()
    n_lines = kept.count(b"\n")
    assert 0 < n_lines < 400 and kept.endswith(b"\n")
    assert all(json.loads(line)["id"] == f"r{k}" for k, line in enumerate(kept.splitlines()))
    assert f"the {n_lines} finished lines are kept in {partial_path(out)} ({len(kept)} bytes, fsynced)" in note
    assert "--resume" in note and "--restart" in note
