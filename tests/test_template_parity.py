"""fastscore renders conversations (tools=, assistant tool_calls, tool results) to the same token ids as
transformers' apply_chat_template, on the real Qwen2.5 / Qwen3 / Llama 3.2 templates and the embedded SmolLM2's.

The real templates come from the llama-cpp-python sdist (fastscore.chat_templates; `make test` fetches them). Every
template runs over the SmolLM2 vocabulary (for Llama 3, with its control tokens on spare special ids): parity is
about rendering and where the scored span sits, and both sides tokenize the same text with the same tokenizer.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scorer_helpers import CountingFakeBackend, copy_tokenizer, rename_special_tokens

from fastscore.errors import ArtefactUnavailableError, RequestError
from fastscore.records import ScoreRequest
from fastscore.requests_schema import record_from_dict
from fastscore.scorer import Scorer
from fastscore.tokenizer import Tokenizer

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies.",
        "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "to": {"type": "string"}},
                       "required": ["amount", "to"]}}},
]
FAILED_CALL = {"id": "call_1", "type": "function",
               "function": {"name": "get_wether", "arguments": {"city": "Paris", "days": 3}}}
SECOND_CALL = {"id": "call_2", "type": "function",
               "function": {"name": "convert_currency", "arguments": {"amount": 12.5, "to": "EUR"}}}
ERROR = "NameError: name 'get_wether' is not defined"

# (name, messages, tools, continuation): plain chat, tools offered, a failed call with its error as a tool result,
# the same error as a user message, and two rounds of calls.
CONVERSATIONS = [
    ("plain", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}], None, "4"),
    ("tools", [{"role": "system", "content": "Call a tool."}, {"role": "user", "content": "Weather in Paris?"}],
     TOOLS, '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("tool_error", [{"role": "system", "content": "Call a tool."}, {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [FAILED_CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": ERROR}],
     TOOLS, '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'),
    ("user_error", [{"role": "user", "content": "Weather in Paris for 3 days?"},
                    {"role": "assistant", "content": "", "tool_calls": [FAILED_CALL]},
                    {"role": "user", "content": ERROR}],
     TOOLS, "get_weather(city='Paris', days=3)"),
    ("two_rounds", [{"role": "user", "content": "Convert 12.5 USD to EUR, then the weather in Paris."},
                    {"role": "assistant", "content": "", "tool_calls": [SECOND_CALL]},
                    {"role": "tool", "tool_call_id": "call_2", "content": "11.6"},
                    {"role": "assistant", "content": "", "tool_calls": [FAILED_CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": ERROR}],
     TOOLS, "Sorry: the weather tool is get_weather."),
]
# SmolLM2's template renders neither tools nor tool_calls: its conversations carry the same turns as plain text.
PLAIN_CONVERSATIONS = [
    CONVERSATIONS[0],
    ("tool_role", [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "get_wether(city='Paris')"},
                   {"role": "tool", "content": ERROR}], None, "get_weather(city='Paris')"),
    ("multi_turn", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Name a prime."}], None, " 7 "),
]
FAMILIES = ("qwen2.5", "qwen3", "llama3.2")


@pytest.fixture(scope="module")
def real_templates():
    from fastscore.chat_templates import real_template

    try:
        return {family: real_template(family) for family in FAMILIES}
    except ArtefactUnavailableError as exc:  # `make test` fetches them first; a bare pytest run offline cannot
        pytest.skip(f"real chat templates unavailable: {exc}")


def _tokenizers(folder: Path):
    transformers = pytest.importorskip("transformers")
    return Scorer(CountingFakeBackend(), Tokenizer.from_folder(folder)), transformers.AutoTokenizer.from_pretrained(
        str(folder))


def _hf_ids(hf, messages, tools, *, add_generation_prompt: bool) -> list[int]:
    out = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _check_parity(scorer, hf, name, messages, tools, continuation) -> None:
    record = record_from_dict({"id": name, "messages": messages, "candidates": [continuation],
                               **({"tools": tools} if tools else {})})
    context = scorer.context_ids(record.messages, tools=record.tools)
    assert context == _hf_ids(hf, messages, tools, add_generation_prompt=True), name
    prepared = scorer.prepare(ScoreRequest(name, record.messages, continuation, record.tools))
    ours = list(prepared.token_request.tokens)
    theirs = _hf_ids(hf, [*messages, {"role": "assistant", "content": continuation}], tools,
                     add_generation_prompt=False)
    # Ours ends with the end-of-turn token; the template may write more after it (a newline).
    assert ours == theirs[: len(ours)], name
    scored = scorer.tokenizer.decode(ours[prepared.token_request.score_from:])
    assert continuation in scored and scored.endswith(scorer.tokenizer.decode([scorer.tokenizer.end_of_turn_id]))


@pytest.mark.parametrize("family", FAMILIES)
def test_real_templates_render_tools_and_tool_calls_as_transformers_does(family, real_templates, smollm_tokenizer,
                                                                         tmp_path):
    folder = copy_tokenizer(Path(smollm_tokenizer.name), tmp_path / family, template=real_templates[family])
    if family.startswith("llama"):
        rename_special_tokens(folder)
    scorer, hf = _tokenizers(folder)
    for name, messages, tools, continuation in CONVERSATIONS:
        _check_parity(scorer, hf, name, json.loads(json.dumps(messages)), tools, continuation)
    # The tool schemas and the failed call's arguments really reached the text (not silently dropped).
    record = record_from_dict({"id": 0, "messages": CONVERSATIONS[2][1], "candidates": ["x"], "tools": TOOLS})
    text = scorer.tokenizer.decode(scorer.context_ids(record.messages, tools=record.tools))
    assert "convert_currency" in text and '"days": 3' in text and "get_wether" in text


def test_the_embedded_smollm2_template_matches_and_refuses_what_it_would_drop(smollm_tokenizer, smollm_tokenizer_dir):
    scorer, hf = _tokenizers(Path(smollm_tokenizer_dir))
    for name, messages, tools, continuation in PLAIN_CONVERSATIONS:
        _check_parity(scorer, hf, name, messages, tools, continuation)
    # transformers would render these without the tools or the call; fastscore refuses instead.
    for _, messages, tools, _ in CONVERSATIONS[1:3]:
        record = record_from_dict({"id": 0, "messages": messages, "candidates": ["x"], "tools": tools})
        with pytest.raises(RequestError, match="ignores 'tools'|does not render 'tool_calls'"):
            scorer.context_ids(record.messages, tools=record.tools)
