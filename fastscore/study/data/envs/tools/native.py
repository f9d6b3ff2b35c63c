"""The tools environment in a chat template's native tool format (the harness-realism sensitivity check).

The study's default prompt prints the tools' JSON schemas and a text call format in the system prompt, and the model
writes `func(param=value)`. Models trained for tool use are instead given the schemas through the template's
`tools=` and write calls in the template's own format; a harness records a failed call as an assistant `tool_calls`
message and its error as a `tool` message. Here an item is translated to that form: the same question, tools and
runtime error, each candidate call as structured {name, arguments}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastscore.study.data.envs.tools.runtime import ToolRejection, parse_call

# The native system prompt: the template adds the schemas and the call format itself.
NATIVE_SYSTEM = "You are a function-calling assistant. Answer the user's request by calling one of the tools."
# BFCL's Python-flavoured type names -> JSON Schema's (as BFCL's own OpenAI handler converts them).
JSON_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


@dataclass(frozen=True)
class NativeItem:
    """One item in the native tool format: `calls[k]` is candidate k as an OpenAI tool call."""

    system: str
    tools: tuple[dict, ...]
    calls: tuple[dict, ...]


def _json_schema(node: Any) -> Any:
    if isinstance(node, dict):
        out = {key: _json_schema(value) for key, value in node.items()}
        if isinstance(out.get("type"), str):
            out["type"] = JSON_SCHEMA_TYPES.get(out["type"], out["type"])
        return out
    if isinstance(node, list):
        return [_json_schema(value) for value in node]
    return node


def openai_tool(schema: dict) -> dict:
    """A BFCL function schema as an OpenAI `tools` entry."""
    function = {"name": schema["name"], "description": schema.get("description", ""),
                "parameters": _json_schema(schema["parameters"])}
    return {"type": "function", "function": function}


def tool_call(action: str) -> dict:
    """A text action `name(p=v, ...)` as an OpenAI tool call; ValueError if it has no such form (a syntax error,
    positional arguments) or an argument has no JSON value."""
    try:
        call = parse_call(action)
    except ToolRejection as exc:
        raise ValueError(f"a candidate does not parse as a call ({exc.outcome.kind}): it has no tool_calls form") \
            from None
    arguments = dict(call.args)
    try:
        json.dumps(arguments, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError("a candidate's argument has no JSON value") from None
    return {"type": "function", "function": {"name": call.name, "arguments": arguments}}


def native_item(functions: tuple[dict, ...], candidates: tuple[str, ...]) -> NativeItem:
    calls = tuple(tool_call(action) for action in candidates)
    as_json = [json.dumps(c["function"], sort_keys=True) for c in calls]
    if len(set(as_json)) != len(as_json):
        raise ValueError("two candidates are the same call in the native format (they differ only in spelling)")
    return NativeItem(NATIVE_SYSTEM, tuple(openai_tool(f) for f in functions), calls)
