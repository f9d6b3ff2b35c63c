"""The Python API (fastscore.load / OpenModel.score / score_many / to_frame) and its request forms: OpenAI-style
dicts with tool calls, raw-text prompts, per-token ranks and top-k. The README's examples run in tests/test_docs.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scorer_helpers import CountingFakeBackend

import fastscore
from fastscore.api import OpenModel
from fastscore.errors import RequestError
from fastscore.records import CandidateSet, Message, ScoreRequest, TokenRequest
from fastscore.scorer import Scorer

CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "Error: unknown city"}]
# A template that renders tools and tool calls the way the Qwen2.5 / Llama 3 templates do (tojson of the schema and
# of the arguments object), so what the template receives is visible in the text.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_import_fastscore_loads_no_backend_library():
    code = ("import sys, fastscore; heavy = ('llama_cpp', 'torch', 'transformers', 'onnxruntime', 'tokenizers', "
            "'pandas', 'pyarrow'); print([m for m in sys.modules if m.split('.')[0] in heavy])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert callable(fastscore.load) and fastscore.__version__


@pytest.fixture
def session(smollm_tokenizer):
    return OpenModel(Scorer(CountingFakeBackend(), smollm_tokenizer, top_k=3), "fake", "fake", "fake")


def test_dict_messages_score_exactly_as_message_records(session):
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    from_dicts = session.score(plain, ["Hello", "Hey there"], id="x")
    records = tuple(Message(m["role"], m["content"]) for m in plain)
    [direct] = session.scorer.score_candidates([CandidateSet("x", records, ("Hello", "Hey there"))])
    assert [r.token_logprobs for r in from_dicts.results] == [r.token_logprobs for r in direct.results]
    assert [r.index for r in from_dicts.results] == [0, 1]
    assert json.loads(json.dumps(from_dicts.to_dict()))["candidates"][1]["continuation"] == "Hey there"


def test_tool_calls_and_tools_reach_the_template_as_transformers_gives_them(tmp_path, smollm_tokenizer):
    from scorer_helpers import copy_tokenizer

    from fastscore.tokenizer import Tokenizer

    transformers = pytest.importorskip("transformers")
    folder = copy_tokenizer(Path(smollm_tokenizer.name), tmp_path / "tok", template=TOOLS_TEMPLATE)
    scorer = Scorer(CountingFakeBackend(), Tokenizer.from_folder(folder))
    ids = scorer.context_ids(OpenModel._records([{"messages": MESSAGES, "candidates": ["x"]}])[0].messages,
                             tools=TOOLS)
    # transformers is given what the OpenAI format means: the arguments as an object.
    parsed = json.loads(json.dumps(MESSAGES))
    parsed[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    expected = hf.apply_chat_template(parsed, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert '<tool_call>get_weather {"city": "Paris"}</tool_call>' in expected and "Tools:" in expected
    assert smollm_tokenizer.decode(ids) == expected
    without = scorer.context_ids((Message("user", "Hi"),))
    assert "Tools:" not in smollm_tokenizer.decode(without)  # no tools: `tools` is none, as in transformers


def test_bad_request_dicts_are_refused_with_the_field_named(session):
    with pytest.raises(RequestError, match="'arguments' is not valid JSON"):
        session.score([{"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "f", "arguments": "{"}}]}], ["x"])
    with pytest.raises(RequestError, match="does not render 'tool_calls'"):  # SmolLM2's template drops them
        session.score(MESSAGES, ["x"])
    with pytest.raises(RequestError, match="ignores 'tools'"):
        session.score(MESSAGES[:1], ["x"], tools=TOOLS)
    with pytest.raises(RequestError, match="unknown role"):
        session.score([{"role": "narrator", "content": "x"}], ["x"])
    with pytest.raises(RequestError, match="not both"):
        session.score_many([{"prompt": "a", "messages": [], "candidates": ["b"]}])
    with pytest.raises(RequestError, match="duplicate id"):
        session.score_many([{"id": 1, "prompt": "a", "continuations": ["b"]}, {"id": 1, "prompt": "a",
                                                                               "continuations": ["b"]}])


def test_raw_text_is_scored_without_template_or_end_of_turn(session, smollm_tokenizer):
    result = session.score(prompt="The capital of France is", candidates=[" Paris", " Rome"])
    tok = smollm_tokenizer
    for candidate, text in zip(result.results, [" Paris", " Rome"], strict=True):
        prompt_ids = list(tok.encode("The capital of France is").ids)
        full = list(tok.encode("The capital of France is" + text).ids)
        assert full[: len(prompt_ids)] == prompt_ids and not candidate.includes_end_of_turn
        assert candidate.token_ids == tuple(full[len(prompt_ids):])
        [alone] = session.scorer.backend.score_tokens([TokenRequest(tuple(full), len(prompt_ids))])
        assert candidate.token_logprobs == pytest.approx(alone.logprobs.tolist(), abs=1e-9)
        assert "".join(candidate.token_texts) == text


def test_ranks_and_top_k_agree_with_the_full_distribution(session):
    result = session.score([{"role": "user", "content": "Name a colour."}], ["Blue sky", "Red"])
    for candidate in result.results:
        prepared = session.scorer.prepare(ScoreRequest("r", (Message("user", "Name a colour."),),
                                                       candidate.continuation))
        [rows] = session.scorer.backend.logprob_rows([prepared.token_request])
        for k, token in enumerate(candidate.token_ids):
            row = rows[k]
            assert candidate.token_ranks[k] == 1 + int((row > row[token]).sum())
            best = np.argsort(-row, kind="stable")[:3]
            assert [t for t, _, _ in candidate.top_k[k]] == best.tolist()
            assert [lp for _, _, lp in candidate.top_k[k]] == pytest.approx(row[best].tolist(), abs=1e-6)
            assert (candidate.token_ranks[k] == 1) == candidate.token_is_argmax[k]


def test_to_frame_has_one_row_per_candidate(session):
    pytest.importorskip("pandas")
    results = session.score_many([{"messages": [{"role": "user", "content": "Hi"}], "candidates": ["a", "b", "c"]},
                                  {"prompt": "One, two,", "continuations": [" three"]}])
    frame = fastscore.to_frame(results)
    assert list(frame["id"]) == ["0", "0", "0", "1"] and list(frame["index"]) == [0, 1, 2, 0]
    assert list(frame["text"]) == ["a", "b", "c", " three"]
    assert frame.groupby("id")["prob"].sum().tolist() == pytest.approx([1.0, 1.0])
