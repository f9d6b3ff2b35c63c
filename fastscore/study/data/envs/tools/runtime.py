"""Simulated tool runtime: executes one call against BFCL JSON schemas as a real Python tool layer would.

The action format of the tools environment is one call in Python call syntax, on one line:

    func_name(param=value, ...)

keyword arguments only, each value a Python literal (the repr of a str / int / float / bool / list / dict; a tuple for
a "tuple" parameter), parameters in the order the schema lists them. Dotted names (`math.factorial`) are allowed.
The text is parsed with `ast` and literal values read with `ast.literal_eval`; nothing is ever evaluated.

The runtime checks, in the order Python itself would: syntax, that the function exists, that no positional
argument is given, unexpected keyword arguments, missing required arguments, then each value's type and enum
(recursively through arrays and dicts). The first problem is reported with a Python-like message (`TypeError:
calculate_area() got an unexpected keyword argument 'hieght'`) and a machine-readable `kind`. BFCL schema types:
"dict" (object), "integer", "float" (an int is accepted), "string", "boolean", "array", "tuple", "any".
An optional parameter passed as None means "use the default", as in Python.
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


CALL_FORMAT = "func_name(param=value, ...)"
CALL_FORMAT_INSTRUCTIONS = (
    f"Respond with exactly one call in the form {CALL_FORMAT} on a single line: keyword arguments only, "
    "values written as Python literals (quoted strings, numbers, True/False, lists [...], dicts {...}), "
    "parameters in the order the schema lists them. Write nothing else."
)

PY_TYPE_NAMES = {
    "integer": "int", "float": "float", "string": "str", "boolean": "bool",
    "array": "list", "tuple": "tuple", "dict": "dict",
}


@dataclass(frozen=True)
class Call:
    """A parsed call: function name and keyword arguments in the order written."""

    name: str
    args: tuple[tuple[str, Any], ...]

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)

    def render(self) -> str:
        """The canonical action text: `name(p=repr(v), ...)` on one line."""
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.args)})"


@dataclass(frozen=True)
class ToolOutcome:
    """What the runtime answered. `error` is the message a tool layer prints; `result` is the JSON returned when ok.

    `function`, `param` and `detail` are the structured facts behind the message (called name, offending argument
    path, expected type / allowed values / missing names) from which the runtime writes natural-language descriptions.
    """

    ok: bool
    error: str
    kind: str
    function: str = ""
    param: str = ""
    detail: str = ""
    result: str = ""


class ToolRejection(Exception):
    """Raised inside the runtime when a call is rejected; carries the outcome that `execute` returns."""

    def __init__(self, outcome: ToolOutcome):
        super().__init__(outcome.error)
        self.outcome = outcome


def _reject(kind: str, error: str, function: str = "", param: str = "", detail: str = "") -> ToolRejection:
    return ToolRejection(ToolOutcome(False, error, kind, function, param, detail))


def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _literal(node: ast.expr, function: str, param: str) -> Any:
    if isinstance(node, ast.Name) and node.id not in ("True", "False", "None"):
        raise _reject("name_error", f"NameError: name '{node.id}' is not defined", function, param, node.id)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _reject(
            "syntax_error",
            f"SyntaxError: argument '{param}' of {function}() is not a literal value",
            function, param, "not a literal",
        ) from None


def parse_call(text: str) -> Call:
    """Parse one call in the action format; raises ToolRejection (kind syntax_error/name_error/positional_argument)."""
    source = text.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        where = f"line {exc.lineno}, column {exc.offset}" if exc.lineno else "line 1"
        raise _reject("syntax_error", f"SyntaxError: {exc.msg} ({where})", detail=exc.msg) from None
    except ValueError as exc:  # e.g. null bytes in the source
        raise _reject("syntax_error", f"SyntaxError: {exc}", detail=str(exc)) from None
    node = tree.body
    if not isinstance(node, ast.Call):
        raise _reject("syntax_error", "SyntaxError: expected a single function call", detail="not a call")
    name = _dotted_name(node.func)
    if name is None:
        raise _reject("syntax_error", "SyntaxError: expected a function name before '('", detail="no function name")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise _reject("syntax_error", f"SyntaxError: {name}() takes literal keyword arguments only, not * or **",
                      name, detail="star arguments")
    if node.args:
        n = len(node.args)
        raise _reject(
            "positional_argument",
            f"TypeError: {name}() takes 0 positional arguments but {n} {'was' if n == 1 else 'were'} given",
            name, detail=str(n),
        )
    names = [k.arg for k in node.keywords]
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if repeated is not None:  # the compiler, not the parser, rejects this in Python; a tool layer must too
        raise _reject("syntax_error", f"SyntaxError: keyword argument repeated: {repeated}", name, repeated,
                      "keyword argument repeated")
    args = tuple((k.arg, _literal(k.value, name, k.arg)) for k in node.keywords)
    return Call(name, args)


def _canonical(value: Any) -> Any:
    """A literal as a hashable, type-tagged value: True, 1 and 1.0 stay distinct (a wrong-type mutation is another
    call), dict keys lose their order."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), _canonical(v)) for k, v in value.items()), key=lambda kv: kv[0])))
    if isinstance(value, (list, tuple, set, frozenset)):
        items = tuple(_canonical(v) for v in value)
        return (type(value).__name__, tuple(sorted(items, key=repr)) if isinstance(value, (set, frozenset)) else items)
    return (type(value).__name__, value)


def same_call(text: str, other: str) -> bool:
    """The same call after argument normalisation: the same function with the same keyword arguments as values,
    whatever their order, spacing, quoting or literal spelling. Texts that are not a call (prose, a syntax error)
    compare with whitespace collapsed."""
    try:
        a, b = parse_call(text), parse_call(other)
    except ToolRejection:
        return " ".join(text.split()) == " ".join(other.split())
    return a.name == b.name and ({k: _canonical(v) for k, v in a.args} == {k: _canonical(v) for k, v in b.args})


# What may stand before a call's function name or inside it without being part of the name: whitespace,
# parentheses ("(f)(x=1)" calls f) and line continuations.
_AROUND_NAME = re.compile(r"[\s\\()]")


def same_call_possible(other: str) -> Callable[[str], bool]:
    """A predicate on a text's start `head`: could a text that starts so still be same_call(text, other)? False only
    where no such text can be:

    - its words are not the start of other's words (how texts compare where one is not a call), and
    - other is not a call, or head cannot start a call of other's function: with whitespace, parentheses and line
      continuations removed, the part of head before any comment sign or character outside ASCII neither starts the
      function's name nor starts with it. Python reads identifiers NFKC-normalised, so the name is compared
      decomposed (NFKD): an ASCII letter and a combining accent after it spell one of its letters, and the ASCII
      start of any spelling of the name is a start of its decomposed form.

    A U+FFFD inside head (an undecodable byte) leaves the repeat open; trailing ones (a character the next token
    completes) are left out."""
    words = " ".join(other.split())
    try:
        name: str | None = unicodedata.normalize("NFKD", parse_call(other).name)
    except ToolRejection:
        name = None

    def possible(head: str) -> bool:
        head = head.rstrip("\ufffd")
        if "\ufffd" in head or words.startswith(" ".join(head.split())):
            return True
        if name is None:
            return False
        plain = re.match(r"[\x00-\x7f]*", head.split("#", 1)[0]).group()
        squeezed = _AROUND_NAME.sub("", plain)
        return name.startswith(squeezed) or squeezed.startswith(name)
    return possible


def _type_ok(schema_type: str | None, value: Any) -> bool:
    if schema_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if schema_type == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if schema_type == "string":
        return isinstance(value, str)
    if schema_type == "boolean":
        return isinstance(value, bool)
    if schema_type in ("array", "tuple"):
        return isinstance(value, (list, tuple))
    if schema_type == "dict":
        return isinstance(value, dict)
    return True  # "any" and types this runtime does not know constrain nothing


def _join_names(names: list[str]) -> str:
    quoted = [f"'{n}'" for n in names]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def type_label(schema: dict) -> str:
    """How a parameter's type is named in messages: the Python type, or the allowed values for an enum."""
    label = PY_TYPE_NAMES.get(schema.get("type"), "any value")
    items = schema.get("items")
    if label in ("list", "tuple") and isinstance(items, dict) and items.get("type") in PY_TYPE_NAMES:
        label = f"{label} of {PY_TYPE_NAMES[items['type']]}"
    return label


def _check_value(function: str, path: str, schema: dict, value: Any) -> None:
    if not _type_ok(schema.get("type"), value):
        expected = PY_TYPE_NAMES[schema["type"]]
        raise _reject(
            "wrong_type",
            f"TypeError: {function}() argument '{path}' must be {expected}, not {type(value).__name__}",
            function, path, expected,
        )
    enum = schema.get("enum")
    if enum is not None and not any(type(value) is type(e) and value == e for e in enum):
        raise _reject(
            "enum_violation",
            f"ValueError: {function}() argument '{path}' must be one of {list(enum)!r}, got {value!r}",
            function, path, repr(list(enum)),
        )
    items = schema.get("items")
    if isinstance(value, (list, tuple)) and isinstance(items, dict):
        for i, element in enumerate(value):
            _check_value(function, f"{path}[{i}]", items, element)
    properties = schema.get("properties")
    if isinstance(value, dict) and isinstance(properties, dict):
        for key, element in value.items():
            if key not in properties:
                raise _reject(
                    "unexpected_parameter",
                    f"TypeError: {function}() argument '{path}' got an unexpected key {key!r}",
                    function, f"{path}[{key!r}]", str(key),
                )
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            raise _reject(
                "missing_required",
                f"TypeError: {function}() argument '{path}' is missing required key(s): {_join_names(missing)}",
                function, path, ", ".join(missing),
            )
        for key, element in value.items():
            _check_value(function, f"{path}[{key!r}]", properties[key], element)


class ToolRuntime:
    """Executes calls against a fixed set of BFCL function schemas (the tools one item shows)."""

    def __init__(self, functions: list[dict] | tuple[dict, ...]):
        self.functions = {f["name"]: f for f in functions}

    def schema(self, name: str) -> dict:
        return self.functions[name]

    def execute(self, text: str) -> ToolOutcome:
        """Run one call text; never raises for a bad call (that is a rejected outcome)."""
        try:
            call = parse_call(text)
            self.check(call)
        except ToolRejection as rejection:
            return rejection.outcome
        result = json.dumps({"status": "success", "function": call.name})
        return ToolOutcome(True, "", "ok", function=call.name, result=result)

    def check(self, call: Call) -> None:
        """Validate a parsed call; raises ToolRejection with the first problem found."""
        name = call.name
        if name not in self.functions:
            raise self._unknown_function(name)
        parameters = self.functions[name].get("parameters", {})
        properties = parameters.get("properties", {})
        required = parameters.get("required", [])
        for key, _ in call.args:
            if key not in properties:
                raise _reject(
                    "unexpected_parameter",
                    f"TypeError: {name}() got an unexpected keyword argument '{key}'", name, key, key,
                )
        given = call.kwargs
        missing = [k for k in required if k in properties and k not in given]
        if missing:
            plural = "argument" if len(missing) == 1 else "arguments"
            raise _reject(
                "missing_required",
                f"TypeError: {name}() missing {len(missing)} required keyword-only {plural}: {_join_names(missing)}",
                name, missing[0], ", ".join(missing),
            )
        for key, value in call.args:
            if value is None and key not in required:
                continue  # an optional argument set to None takes its default, as in Python
            _check_value(name, key, properties[key], value)

    def _unknown_function(self, name: str) -> ToolRejection:
        # Python reports an unknown attribute of a known module differently from an unknown top-level name.
        head, _, attr = name.rpartition(".")
        known_modules = {f.rpartition(".")[0] for f in self.functions if "." in f}
        if head and head in known_modules:
            return _reject("unknown_function", f"AttributeError: module '{head}' has no attribute '{attr}'",
                           name, detail=name)
        first = name.split(".")[0]
        return _reject("unknown_function", f"NameError: name '{first}' is not defined", name, detail=name)
