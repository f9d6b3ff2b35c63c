"""Requests as users write them: OpenAI content-part lists, the `developer` role, raw text scored unconditionally
(`score --text`), and `bench --requests` on every request kind."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from click.testing import CliRunner

from fastscore import chat
from fastscore.bench.measure import token_requests
from fastscore.bench.workload import Workload, context_ids, workload_from_requests
from fastscore.cli import main
from fastscore.errors import RequestError
from fastscore.records import Message
from fastscore.requests_schema import record_from_dict
from fastscore.text_score import score_text, windows

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


# ---------------------------------------------------------------- content parts and the developer role


def test_content_part_lists_are_joined_text():
    record = record_from_dict({"id": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}],
        "candidates": ["Hi"]})
    assert record.messages[0].content == "Hello\nworld"
    with pytest.raises(RequestError, match="content part 1 is 'image_url'"):
        record_from_dict({"id": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}], "candidates": ["b"]})
    with pytest.raises(RequestError, match="empty list of content parts"):
        record_from_dict({"id": 1, "messages": [{"role": "user", "content": []}], "candidates": ["b"]})


def test_developer_role_is_system_for_a_template_without_it(smollm_tokenizer, caplog):
    template = smollm_tokenizer.require_chat_template()
    assert "developer" not in template
    system = [Message("system", "Be brief."), Message("user", "Hi")]
    developer = [Message("developer", "Be brief."), Message("user", "Hi")]
    chat._say_developer_mapped.cache_clear()
    with caplog.at_level(logging.WARNING, logger="fastscore.chat"):
        got = chat.render(template, developer, add_generation_prompt=True)
    assert got == chat.render(template, system, add_generation_prompt=True)
    assert "<|im_start|>system\nBe brief." in got
    assert "rendered as 'system'" in caplog.text


def test_developer_role_reaches_a_template_that_knows_it():
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{# developer #}"
    got = chat.render(template, [Message("developer", "Be brief.")], add_generation_prompt=False)
    assert got == "[developer] Be brief.\n"


def test_user_forms_score_as_their_plain_equivalents(fake_scorer):
    parts = record_from_dict({"id": "a", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "You answer"}, {"type": "text", "text": "briefly."}]},
        {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}], "candidates": ["4", "four"]})
    plain = record_from_dict({"id": "a", "messages": [
        {"role": "system", "content": "You answer\nbriefly."}, {"role": "user", "content": "What is 2+2?"}],
        "candidates": ["4", "four"]})
    got, want = (fake_scorer.score_candidates([r.candidate_set()])[0] for r in (parts, plain))
    assert [r.token_ids for r in got.results] == [r.token_ids for r in want.results]
    assert [r.logprob for r in got.results] == [r.logprob for r in want.results]


# ---------------------------------------------------------------- raw text, unconditionally


@pytest.mark.parametrize("n, window, stride", [(1, 4, 2), (10, 4, 2), (10, 4, 3), (37, 16, 8), (15, 16, 8),
                                               (16, 16, 8), (100, 2, 1)])
def test_windows_score_every_token_once_within_the_context(n, window, stride):
    spans = windows(n, window, stride)
    scored = [p for _, lo, hi in spans for p in range(lo, hi)]
    assert scored == list(range(1, n + 1))
    for start, lo, hi in spans:
        assert hi - start <= window and start < lo
    assert spans[0][0] == 0  # the first window starts at the context token
    # every later window gives its first scored token as much context as fits
    assert all(lo - start == window - (hi - lo) for start, lo, hi in spans[1:])


def test_score_text_windows_agree_where_they_see_the_same_context(fake_scorer):
    text = "The quick brown fox jumps over the lazy dog. " * 6
    full = score_text(fake_scorer, text)
    small = score_text(fake_scorer, text, window=16, stride=8)
    assert full.n_tokens == small.n_tokens == len(fake_scorer.tokenizer.encode(text, ((0, len(text)),)).ids)
    assert full.window == fake_scorer.backend.n_ctx and full.n_tokens < full.window
    # the first window (15 tokens) sees exactly the context the full scoring sees
    assert small.token_logprobs[:15] == full.token_logprobs[:15]
    assert small.token_logprobs != full.token_logprobs  # later tokens see less context
    assert math.isclose(full.perplexity, math.exp(-np.mean(full.token_logprobs)), rel_tol=1e-12)
    assert full.context_token == fake_scorer.tokenizer.decode_piece(
        fake_scorer.tokenizer.bos_id if fake_scorer.tokenizer.bos_id is not None else fake_scorer.tokenizer.eos_id)
    with pytest.raises(RequestError, match="empty"):
        score_text(fake_scorer, "")


def test_score_text_cli(tmp_path, smollm_artefact):
    smollm_artefact("llamacpp", "f32")  # converted once, by the session's fixture
    text_file = tmp_path / "t.txt"
    text_file.write_text("def square(x):\n    return x * x\n")
    out = tmp_path / "ppl.json"
    result = CliRunner().invoke(main, ["score", "--text", str(text_file), "--out", str(out)])
    print(result.output)
    assert result.exit_code == 0, result.output
    body = json.loads(out.read_text())
    assert body["n_tokens"] == len(body["tokens"]) > 5
    assert "".join(t["text"] for t in body["tokens"]) == text_file.read_text()
    assert math.isclose(body["perplexity"], math.exp(-body["logprob"] / body["n_tokens"]), rel_tol=1e-9)
    assert body["meta"]["quant"] == "f32" and "perplexity" in result.output
    # a string is the text itself, and stdout gets the JSON
    inline = CliRunner().invoke(main, ["score", "--text", text_file.read_text()])
    assert inline.exit_code == 0, inline.output
    again = json.loads(inline.output[inline.output.index("{"):inline.output.rindex("}") + 1])
    assert again["logprob"] == pytest.approx(body["logprob"], abs=1e-9)
    usage = CliRunner().invoke(main, ["score", str(text_file), "--text", "x"])
    assert usage.exit_code == 2 and "either REQUESTS or --text" in usage.output


# ---------------------------------------------------------------- bench --requests on every request kind


def _every_kind(path, tools: bool = True):
    lines = [
        {"id": "chat", "messages": [{"role": "developer", "content": "Be brief."},
                                    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
         "candidates": ["Sunny.", "Rainy."]},
        {"id": "tools", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL],
         "candidates": ['{"name": "get_weather", "arguments": {"city": "Paris"}}', "I don't know."]},
        {"id": "calls", "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}],
         "tools": [TOOL], "candidates": ["It is sunny.", "It rains."]},
        {"id": "raw", "prompt": "The capital of France is", "continuations": [" Paris", " Lyon"]},
    ]
    lines = lines if tools else [line for line in lines if "tools" not in line]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


# ChatML that renders tools and tool calls (SmolLM2's own template reads neither, so it refuses such requests).
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def tools_scorer(smollm_tokenizer_dir):
    from fastscore.scorer import Scorer
    from fastscore.tokenizer import Tokenizer
    from scorer_helpers import CountingFakeBackend

    tokenizer = Tokenizer.from_folder(smollm_tokenizer_dir)
    tokenizer.chat_template = TOOLS_TEMPLATE
    return Scorer(CountingFakeBackend(), tokenizer)


def test_bench_workload_takes_every_request_kind(tmp_path, tools_scorer):
    fake_scorer = tools_scorer
    workload = workload_from_requests(_every_kind(tmp_path / "r.jsonl"))
    again = Workload.from_json(workload.to_json())  # what each benchmark worker process reads
    assert again == workload
    assert again.sets[3].prompt == "The capital of France is" and again.sets[1].tools == (TOOL,)
    want = [fake_scorer.prepare(r).token_request.tokens for s in workload.sets for r in s.score_requests()]
    assert [r.tokens for r in token_requests(fake_scorer, again)] == want
    assert context_ids(fake_scorer, again.sets[3]) == fake_scorer.prompt_ids("The capital of France is")
    assert context_ids(fake_scorer, again.sets[1]) == fake_scorer.context_ids(again.sets[1].messages,
                                                                              tools=(TOOL,))


@pytest.mark.slow
def test_bench_requests_cli_runs_every_kind(tmp_path):
    requests = _every_kind(tmp_path / "r.jsonl", tools=False)  # SmolLM2's template reads no tools
    result = CliRunner().invoke(main, [
        "bench", "throughput", "--requests", str(requests), "--backends", "llamacpp", "--quants", "q4_1",
        "--skip-reference", "--repeats", "1", "--set", "pp_tokens=16", "--set", "per_request_limit=1",
        "--set", "greedy_batches=1", "--set", "new_tokens=1", "--set", "sgemm_n=128", "--threads", "2", "--json"])
    print(result.output[-3000:])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["workload"]["requests"] == 4
