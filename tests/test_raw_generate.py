"""`fastscore score --generate` on raw-text requests ({"prompt", "continuations"}): the greedy continuation of the
raw prompt (no template), checked token by token against the model's own argmax, bans honoured, and the same output
fields as chat requests. On the tiny random Llama and on the embedded model, both llama.cpp f32 (exact)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import fastscore
from fastscore.cli import main
from fastscore.records import TokenRequest

pytest.importorskip("llama_cpp")

PROMPT = "The capital of France is"
MAX_NEW = 6
CHAT = {"id": "chat", "messages": [{"role": "user", "content": "Name a colour."}], "candidates": ["Blue"]}


def _score(tmp_path, model_args, requests, *extra):
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(path), "--out", str(out), "--generate", "--max-new-tokens",
                                       str(MAX_NEW), "--threads", "2", *model_args, *extra])
    assert result.exit_code == 0, result.output
    return {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}


@pytest.fixture(scope="module", params=[
    "tiny-llama",
    # Slow (the 135M's f32 GGUF opened by four CLI runs and a session, ~20 s on a loaded 2-core machine): the default
    # suite runs every check of this module on the tiny Llama, through the same llama.cpp f32 path.
    pytest.param("embedded", marks=pytest.mark.slow),
])
def model_args(request, tiny_model, smollm_artefact):
    if request.param == "embedded":
        return ["--quant", "f32"]
    return ["--model", str(tiny_model("llama")), "--quant", "f32"]


def test_raw_prompts_are_continued_greedily_with_the_fields_of_chat_requests(model_args, tmp_path):
    lines = _score(tmp_path, model_args, [{"id": "raw", "prompt": PROMPT, "continuations": [" Paris"]}, CHAT])
    raw, chat = lines["raw"], lines["chat"]
    assert raw["greedy"].keys() == chat["greedy"].keys()
    assert raw["scored_end_of_turn"] is False and chat["scored_end_of_turn"] is True

    model = model_args[model_args.index("--model") + 1] if "--model" in model_args else None
    with fastscore.load(model=model, quant="f32", threads=2) as session:
        decoded = session.generate(prompt=PROMPT, max_new_tokens=MAX_NEW)
        assert raw["greedy"]["text"] == decoded.text and raw["greedy"]["stopped_by"] == decoded.stopped_by
        # No template: the context is the prompt's own tokens, and every generated token is the model's argmax
        # after the prompt and the tokens before it.
        prompt_ids = session.scorer.prompt_ids(PROMPT)
        assert session.scorer.tokenizer.decode(prompt_ids).endswith(PROMPT)
        assert len(decoded.token_ids) == MAX_NEW or decoded.stopped_by == "end_of_turn"
        if decoded.token_ids:
            [chain] = session.scorer.backend.score_tokens(
                [TokenRequest(tuple(prompt_ids) + decoded.token_ids, len(prompt_ids))])
            assert all(chain.is_argmax)


def test_bans_of_a_raw_request_are_honoured(model_args, tmp_path):
    free = _score(tmp_path, model_args, [{"id": "free", "prompt": PROMPT, "continuations": [" Paris"]}])
    text = free["free"]["greedy"]["text"]
    assert text.strip(), "the greedy continuation is blank: nothing to ban"
    banned = _score(tmp_path, model_args, [{"id": "banned", "prompt": PROMPT, "continuations": [" Paris"],
                                            "banned": [text]}])["banned"]["greedy"]
    assert banned["text"].strip() != text.strip() and banned["banned_steps"] >= 1 and banned["banned_mass"] > 0
    first_word = text.split()[0]
    by_prefix = _score(tmp_path, model_args, [{"id": "prefix", "prompt": PROMPT, "continuations": [" Paris"],
                                               "banned": [first_word]}], "--ban", "prefix")["prefix"]["greedy"]
    assert not by_prefix["text"].lstrip().startswith(first_word)
