"""Runtime-generated natural-language descriptions of a rejected call (the "description" remedy of the study).

A description states what went wrong from the runtime's structured outcome (function, parameter, expected type or
allowed values) without repeating the call text, so the failed string never enters the transcript. The remedy is
meant to cost no tokens, so the description is padded with further facts from the schema (what the call passed,
what the parameter means, what the function accepts) until it is roughly as long as call + error.
"""

from __future__ import annotations

import re

from fastscore.study.data.envs.tools.runtime import Call, ToolOutcome, type_label
from fastscore.study.data.hygiene import template_wording


_ERROR_CLASS = re.compile(r"^([A-Za-z]+Error):")


def _top_param(path: str) -> str:
    return path.split("[", 1)[0]


def _param_schema(functions: dict[str, dict], function: str, path: str) -> dict:
    properties = functions.get(function, {}).get("parameters", {}).get("properties", {})
    return properties.get(_top_param(path), {})


def _core(outcome: ToolOutcome, call: Call | None, functions: dict[str, dict]) -> str:
    # Names the failed call made up (a misspelled function, an invented parameter or key) are never quoted: they
    # are the erroneous surface form the description replaces (fastscore.study.data.hygiene).
    fn, param, detail, kind = outcome.function, outcome.param, outcome.detail, outcome.kind
    match = _ERROR_CLASS.match(outcome.error)
    error_class = match.group(1) if match else "error"
    rejected = f"the runtime rejected it ({error_class})."
    if kind == "syntax_error" and fn not in functions:
        return f"Your previous attempt was not a well-formed single call: {rejected}"
    if kind == "syntax_error":
        return f"Your previous attempt called `{fn}`, but the call was malformed: {rejected}"
    if kind == "unknown_function":
        return f"Your previous attempt called a function that is not among the available tools: {rejected}"
    if kind == "positional_argument":
        return (f"Your previous attempt called `{fn}` with {detail} positional argument(s), but the tool takes "
                f"keyword arguments only: {rejected}")
    if kind == "unexpected_parameter" and "[" in param:
        return (f"Your previous attempt called `{fn}` with a key inside `{_top_param(param)}` that the "
                f"schema does not define: {rejected}")
    if kind == "unexpected_parameter":
        return f"Your previous attempt called `{fn}` with a parameter that it does not accept: {rejected}"
    if kind == "missing_required":
        names = detail.split(", ")
        if call is not None and _top_param(param) in call.kwargs:  # a required key missing inside a dict argument
            return (f"Your previous attempt called `{fn}` with `{param}` lacking its required key(s) {detail}: "
                    f"{rejected}")
        typed = ", ".join(f"`{n}` ({type_label(_param_schema(functions, fn, n))})" for n in names)
        noun = "parameter" if len(names) == 1 else "parameters"
        return f"Your previous attempt called `{fn}` without the required {noun} {typed}: {rejected}"
    if kind == "wrong_type":
        return f"Your previous attempt called `{fn}` with `{param}` not of type {detail}: {rejected}"
    if kind == "enum_violation":
        return (f"Your previous attempt called `{fn}` with a value for `{param}` that is not one of its allowed "
                f"values {detail}: {rejected}")
    if kind == "name_error":
        return (f"Your previous attempt called `{fn}` with `{param}` set to an undefined variable instead of a "
                f"literal value: {rejected}")
    if kind == "wrong_answer" and not param:
        return (f"Your previous attempt called `{fn}`; the call ran, but that function does not answer this "
                "request, so the result was rejected.")
    if kind == "wrong_answer" and detail == "not needed":
        return (f"Your previous attempt called `{fn}`; the call ran, but it set `{param}`, which this request "
                "does not call for, so the result was rejected.")
    if kind == "wrong_answer" and detail == "not given":
        return (f"Your previous attempt called `{fn}`; the call ran, but it left out `{param}`, which this "
                "request needs, so the result was rejected.")
    if kind == "wrong_answer":
        return (f"Your previous attempt called `{fn}`; the call ran, but the value it gave for `{param}` "
                "does not fit the request, so the result was rejected.")
    return f"Your previous attempt failed ({kind}): {rejected}"


def _padding(outcome: ToolOutcome, call: Call | None, functions: dict[str, dict]) -> list[str]:
    """Further true statements, most useful first, used to bring the description up to the target length."""
    sentences = []
    fn = outcome.function
    schema = functions.get(fn)
    if call is not None and schema is not None:
        defined = schema.get("parameters", {}).get("properties", {})
        names = [k for k, _ in call.args if k in defined]
        others = len(call.args) - len(names)
        passed = ", ".join(f"`{n}`" for n in names) if names else "none of its parameters"
        extra = f" and {others} parameter(s) the tool does not define" if others else ""
        sentences.append(f"That attempt passed {passed}{extra}.")
    if outcome.param and schema is not None and outcome.kind != "unexpected_parameter":
        about = _param_schema(functions, fn, outcome.param).get("description")
        if about:
            sentences.append(f"`{_top_param(outcome.param)}` is described as: {about.strip().rstrip('.')}.")
    if schema is not None:
        parameters = schema.get("parameters", {})
        required = parameters.get("required", [])
        optional = [p for p in parameters.get("properties", {}) if p not in required]
        parts = []
        if required:
            parts.append("required " + ", ".join(f"`{p}`" for p in required))
        if optional:
            parts.append("optional " + ", ".join(f"`{p}`" for p in optional))
        sentences.append(f"`{fn}` takes " + ("; ".join(parts) if parts else "no parameters") + ".")
    else:
        sentences.append("The available tools are " + ", ".join(f"`{n}`" for n in functions) + ".")
    return sentences


def describe_failure(outcome: ToolOutcome, call: Call | None, functions: dict[str, dict], target_chars: int) -> str:
    """Describe a rejected outcome in words, about `target_chars` long, never quoting the call text.

    `call` is the parsed failed call when it parsed (its argument names are mentioned, never its values).
    """
    if outcome.ok:
        raise ValueError("describe_failure needs a rejected outcome")
    text = _core(outcome, call, functions)
    for sentence in _padding(outcome, call, functions):
        if len(text) >= 0.9 * target_chars:
            break
        text = f"{text} {sentence}"
    return text


# Words this module writes whatever the model wrote: not quotes of a failed action (fastscore.study.data.hygiene).
WORDING = template_wording(__name__)
