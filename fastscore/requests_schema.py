"""What a scoring request is, as plain data: one JSON object (a line of a requests file, or a dict given to the
Python API) validated into an `InputRecord`.

Chat form: {"id", "messages": [...], "candidates": [...], "tools": [...], "banned": [...]} with OpenAI-style
messages: {"role", "content"}; "content" may be a list of text parts (joined with newlines); the "developer" role
reaches templates that know it and is rendered as "system" by those that do not (fastscore.chat). An assistant message may carry "tool_calls" (its "content" may then be null or
absent), a tool result "tool_call_id" and "name". A tool call's "function.arguments" given as a JSON string (as
the OpenAI API writes it) is parsed to an object, which is what chat templates expect (they `tojson` it).
Raw-text form: {"id", "prompt": "...", "continuations": [...]} (or "candidates"), scored without a template.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastscore.chat import ALLOWED_ROLES
from fastscore.errors import RequestError
from fastscore.records import CandidateSet, Message


@dataclass(frozen=True)
class InputRecord:
    line: int | None
    id: str | int  # as written in the file (echoed in the output)
    messages: tuple[Message, ...]
    candidates: tuple[str, ...]
    banned: tuple[str, ...] = ()
    tools: tuple[Any, ...] = ()
    prompt: str | None = None  # the raw-text form

    @property
    def key(self) -> str:
        return str(self.id)

    def candidate_set(self) -> CandidateSet:
        return CandidateSet(self.key, self.messages, self.candidates, self.tools, self.prompt)


def _string_list(value: Any, field: str, line: int | None, rid: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequestError(f"{field!r} must be a list of strings", line=line, request_id=rid)
    return tuple(value)


def _tool_call(call: Any, where: str, line: int | None, rid: object) -> dict:
    if not isinstance(call, Mapping):
        raise RequestError(f"{where} must be an object", line=line, request_id=rid)
    call = dict(call)
    function = call.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
        try:
            arguments = json.loads(function["arguments"])
        except json.JSONDecodeError as exc:
            raise RequestError(f"{where}: 'arguments' is not valid JSON ({exc.msg})", line=line,
                               request_id=rid) from None
        call["function"] = {**function, "arguments": arguments}
    return call


def message_text(content: Any, k: int, line: int | None = None, rid: object = None) -> Any:
    """A message's content as text: OpenAI's list of content parts ([{"type": "text", "text": ...}, ...]) joined
    with newlines, as vLLM does for templates that take string content; anything else is returned as it is."""
    if not isinstance(content, list):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise RequestError(f"message {k} content part {j} is {kind!r}: only text parts "
                               '({"type": "text", "text": "..."}) can be scored', line=line, request_id=rid)
        texts.append(part["text"])
    if not texts:
        raise RequestError(f"message {k} has an empty list of content parts", line=line, request_id=rid)
    return "\n".join(texts)


def parse_message(message: Any, k: int, line: int | None = None, rid: object = None) -> Message:
    """One OpenAI-style message dict as a Message."""
    if isinstance(message, Message):
        return message
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise RequestError(f"message {k} must be an object with a string 'role'", line=line, request_id=rid)
    role = message["role"]
    if role not in ALLOWED_ROLES:
        raise RequestError(f"message {k} has unknown role {role!r}; allowed roles: {', '.join(ALLOWED_ROLES)}",
                           line=line, request_id=rid)
    tool_calls = message.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        raise RequestError(f"message {k}: 'tool_calls' must be a list", line=line, request_id=rid)
    content = message_text(message.get("content"), k, line, rid)
    # An assistant turn of tool calls may have no text: None reaches the template as in transformers.
    if not isinstance(content, str) and not (content is None and tool_calls):
        raise RequestError(f"message {k} must have a string 'content'", line=line, request_id=rid)
    for field in ("name", "tool_call_id"):
        if message.get(field) is not None and not isinstance(message[field], str):
            raise RequestError(f"message {k}: {field!r} must be a string", line=line, request_id=rid)
    calls = tuple(_tool_call(c, f"message {k} tool call {j}", line, rid) for j, c in enumerate(tool_calls))
    return Message(role, content, calls, message.get("name"), message.get("tool_call_id"))


def record_from_dict(raw: Any, line: int | None = None, default_id: str | int | None = None) -> InputRecord:
    """Validate one request object (chat or raw-text form); errors name the line and id."""
    if not isinstance(raw, Mapping):
        raise RequestError(f"expected a JSON object, got {type(raw).__name__}", line=line)
    check_no_lone_surrogate(raw, line)
    raw_form = "prompt" in raw
    candidates_field = "continuations" if raw_form and "continuations" in raw else "candidates"
    required = ("id", "prompt", candidates_field) if raw_form else ("id", "messages", "candidates")
    if default_id is not None and "id" not in raw:
        raw = {**raw, "id": default_id}
    for field in required:
        if field not in raw:
            raise RequestError(f"missing field {field!r}", line=line, request_id=raw.get("id"))
    rid = raw["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise RequestError(f"'id' must be a string or an integer, not {json.dumps(rid)}", line=line)
    messages: list[Message] = []
    prompt = None
    if raw_form:
        if "messages" in raw:
            raise RequestError("give either 'messages' (chat) or 'prompt' (raw text), not both", line=line,
                               request_id=rid)
        prompt = raw["prompt"]
        if not isinstance(prompt, str):
            raise RequestError("'prompt' must be a string", line=line, request_id=rid)
    else:
        if not isinstance(raw["messages"], list):
            raise RequestError("'messages' must be a list", line=line, request_id=rid)
        messages = [parse_message(message, k, line, rid) for k, message in enumerate(raw["messages"])]
    candidates = _string_list(raw[candidates_field], candidates_field, line, rid)
    if not candidates:
        raise RequestError("empty candidate list", line=line, request_id=rid)
    for k, candidate in enumerate(candidates):
        if not candidate:
            raise RequestError(f"candidate {k} is an empty continuation", line=line, request_id=rid)
    banned = _string_list(raw.get("banned", []), "banned", line, rid)
    tools = raw.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
        raise RequestError("'tools' must be a list of objects (JSON schemas)", line=line, request_id=rid)
    if tools and raw_form:
        raise RequestError("'tools' need chat messages: a raw-text 'prompt' has no template to pass them to",
                           line=line, request_id=rid)
    return InputRecord(line, rid, tuple(messages), candidates, banned, tuple(tools), prompt)


def parse_record(text: str, line: int) -> InputRecord:
    """One line of a requests file."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"malformed JSON: {exc.msg} (at character {exc.pos + 1})", line=line) from None
    except RecursionError:
        raise RequestError("JSON nested too deeply", line=line) from None
    return record_from_dict(raw, line)


def check_no_lone_surrogate(raw: Any, line: int | None = None) -> None:
    """JSON may spell lone surrogates ("\\ud800"), which are not text and no tokenizer accepts. Each string is
    checked on its own: two halves of a pair in separate strings ("\\ud83d" then "\\ude00") are two lone
    surrogates, refused, never joined into one character; a pair within one string is decoded by JSON already."""
    pending = [raw]  # depth first, in the order the strings are written: the first lone surrogate is named
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                rid = raw.get("id") if isinstance(raw, Mapping) else None
                raise RequestError(f"contains a lone surrogate ({exc.object[exc.start]!r}), which is not valid text",
                                   line=line, request_id=rid if isinstance(rid, (str, int)) else None) from None
        elif isinstance(value, Mapping):
            pending += reversed([x for pair in value.items() for x in pair])
        elif isinstance(value, (list, tuple)):
            pending += reversed(value)
        elif dataclasses.is_dataclass(value):  # a Message given to the Python API
            pending += reversed([getattr(value, f.name) for f in dataclasses.fields(value)])
