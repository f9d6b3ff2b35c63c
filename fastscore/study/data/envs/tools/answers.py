"""BFCL possible answers: the canonical ground-truth call, and whether an accepted call answers the request.

A BFCL ground truth maps each parameter to a list of acceptable values; "" in the list means the parameter may be
omitted. A dict value is itself such a mapping (key -> acceptable values), also inside lists. The canonical call takes
the first acceptable value of each parameter and omits a parameter whose list starts with "" (unless the schema
requires it, then the first non-empty value is taken). Matching follows BFCL's checker: strings compare after
dropping spaces and ,./-_*^ and case; numbers compare by value (an int matches a float); bools only match bools.
"""

from __future__ import annotations

import re
from typing import Any

from fastscore.study.data.envs.tools.runtime import Call, ToolOutcome


_STRING_NOISE = re.compile(r"[ ,./\-_*^]")


class GroundTruthError(ValueError):
    """A possible answer that cannot be turned into one canonical call (the record is skipped)."""


def _first_value(acceptable: Any, schema: dict, required: bool) -> tuple[bool, Any]:
    """(present, value): the first acceptable value, or (False, None) when the parameter is omitted."""
    if not isinstance(acceptable, list):
        raise GroundTruthError(f"acceptable values must be a list, got {acceptable!r}")
    values = [v for v in acceptable if not (isinstance(v, str) and v == "")]
    if acceptable and acceptable[0] == "" and not required:
        return False, None
    if not values:
        raise GroundTruthError("no acceptable value for a required parameter")
    return True, _resolve(values[0], schema)


def _resolve(value: Any, schema: dict) -> Any:
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        order = [k for k in properties if k in value] + [k for k in value if k not in properties]
        resolved = {}
        for key in order:
            present, inner = _first_value(value[key], properties.get(key, {}), key in required)
            if present:
                resolved[key] = inner
        return resolved
    if isinstance(value, list):
        items = schema.get("items", {}) if isinstance(schema.get("items"), dict) else {}
        elements = [_resolve(v, items) for v in value]
        return tuple(elements) if schema.get("type") == "tuple" else elements
    return value


def canonical_call(function: dict, answer: dict[str, list]) -> Call:
    """The ground-truth call for one BFCL answer `{param: [acceptable...]}`, params in schema order."""
    parameters = function.get("parameters", {})
    properties = parameters.get("properties", {})
    required = set(parameters.get("required", []))
    unknown = [k for k in answer if k not in properties]
    if unknown:
        raise GroundTruthError(f"answer names parameters the schema lacks: {unknown}")
    args = []
    for key in properties:
        if key in answer:
            present, value = _first_value(answer[key], properties[key], key in required)
            if present:
                args.append((key, value))
    return Call(function["name"], tuple(args))


def _norm(text: str) -> str:
    return _STRING_NOISE.sub("", text).lower().replace("'", '"')


def _equal(value: Any, expected: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(value, dict) and _dict_matches(value, expected)
    if isinstance(expected, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(expected)
                and all(_equal(v, e) for v, e in zip(value, expected)))
    if isinstance(expected, str):
        return isinstance(value, str) and _norm(value) == _norm(expected)
    if isinstance(expected, bool) or isinstance(value, bool):
        return type(value) is type(expected) and value == expected
    if isinstance(expected, (int, float)):
        return isinstance(value, (int, float)) and value == expected
    return value == expected


def _acceptable(value: Any, acceptable: list) -> bool:
    return any(_equal(value, a) for a in acceptable if not (isinstance(a, str) and a == ""))


def _omittable(acceptable: list) -> bool:
    return "" in acceptable


def _dict_matches(value: dict, expected: dict) -> bool:
    if any(k not in expected for k in value):
        return False
    for key, acceptable in expected.items():
        if key in value:
            if not _acceptable(value[key], acceptable):
                return False
        elif not _omittable(acceptable):
            return False
    return True


def match_answer(call: Call, answer_function: str, answer: dict[str, list]) -> ToolOutcome:
    """Judge a call the runtime accepted against the possible answers: ok, or kind "wrong_answer"."""
    name = call.name
    if name != answer_function:
        return ToolOutcome(False, f"ValueError: {name}() is not applicable to this request", "wrong_answer",
                           function=name, detail=answer_function)
    given = {k: v for k, v in call.args if v is not None}  # None means "use the default", i.e. omitted
    for key, value in given.items():
        if key not in answer:
            return ToolOutcome(False, f"ValueError: {name}() argument '{key}' should not be set for this request",
                               "wrong_answer", function=name, param=key, detail="not needed")
        if not _acceptable(value, answer[key]):
            return ToolOutcome(False, f"ValueError: {name}() argument '{key}' has an unexpected value {value!r}",
                               "wrong_answer", function=name, param=key, detail="wrong value")
    for key, acceptable in answer.items():
        if key not in given and not _omittable(acceptable):
            return ToolOutcome(
                False, f"ValueError: {name}() argument '{key}' is needed for this request but was not given",
                "wrong_answer", function=name, param=key, detail="not given",
            )
    return ToolOutcome(True, "", "ok", function=name)
