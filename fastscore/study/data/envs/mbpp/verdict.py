"""The caller's side of a sandbox run: which value each test needs, and the verdict from the values reported.

Every MBPP test has the form `assert EXPR == EXPECTED` with EXPECTED a literal (2922 of 2922 tests). For that form
(`kind == "value"`) the sandbox evaluates only EXPR and reports its value as plain data; EXPECTED is evaluated here,
outside the sandbox, by `ast.literal_eval` or a few pure constructors (`set([...])`, `tuple(...)`, ...), and the
two plain values are compared here. Any other test form (`kind == "statement"`) runs whole inside the sandbox and
counts as passed only if it completes and the run then ends with exit status 0 and the per-run token the harness
read from a pipe before the program started. That channel is weaker: the program shares the harness's interpreter
and could find the token in memory (see docs/sandbox-design.md); no MBPP test needs it.
"""

from __future__ import annotations

import ast
import collections
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from fastscore.study.data.envs.mbpp.harness import MAX_DEPTH, MAX_ITEMS, MAX_RECORD_BYTES

# Pure constructors EXPECTED may call; the names mean the real builtins whatever the program defines.
_SAFE_CALLS = {f.__name__: f for f in (set, frozenset, tuple, list, dict, sorted, float, int, str, bool, complex)}
_SAFE_NODES = (
    ast.Expression, ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Load, ast.UnaryOp, ast.USub, ast.UAdd,
    ast.Call, ast.Name, ast.keyword,
)  # fmt: skip
_TAGS = {"set": set, "frozenset": frozenset, "bytes": bytes.fromhex, "bytearray": bytearray.fromhex}


# Members of one set or keys of one dict that may share a hash value. Plain values essentially never do; a forged
# record of keys that all share one (k * (2**61 - 1) for ints, crafted tuples) would make building the container
# quadratic: ~20 s of the caller's CPU per MB. With at most this many per hash, building it stays linear.
MAX_SAME_HASH = 16
_SURROGATE = re.compile("[\ud800-\udfff]")


class MalformedRecord(ValueError):
    """A record from the sandbox that is not what the harness writes (the program tampered with the channel)."""


@dataclass(frozen=True)
class TestPlan:
    source: str  # the test as given
    kind: Literal["value", "statement"]
    expr: str = ""  # kind "value": the expression evaluated in the sandbox
    expected: Any = None  # kind "value": its expected value, evaluated here

    def job(self) -> dict[str, str]:
        """What the sandbox receives: never the expected value."""
        return {"kind": "value", "expr": self.expr} if self.kind == "value" else {"kind": "statement",
                                                                                   "source": self.source}

    def holds(self, value: Any) -> bool:
        try:
            return bool(type(value) is not _Opaque and value == self.expected)
        except Exception:  # a comparison that fails (too deep, ...) is not a match
            return False


class _Opaque:
    """Stands for a value the sandbox could not report as plain data: equal to nothing."""


def safe_expected(node: ast.expr) -> Any:
    """The value of a literal, or of pure constructors applied to literals; ValueError for anything else."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    tree = ast.Expression(node)
    for sub in ast.walk(tree):
        if not isinstance(sub, _SAFE_NODES):
            raise ValueError(f"not a plain value: {type(sub).__name__}")
        if isinstance(sub, ast.Name) and sub.id not in _SAFE_CALLS:
            raise ValueError(f"not a plain value: name {sub.id!r}")
        if isinstance(sub, ast.Call) and not isinstance(sub.func, ast.Name):
            raise ValueError("not a plain value: a call of something other than a constructor")
    try:
        return eval(compile(ast.fix_missing_locations(tree), "<expected>", "eval"), {"__builtins__": {}},
                    dict(_SAFE_CALLS))  # fmt: skip
    except Exception as exc:
        raise ValueError(f"not a plain value: {exc}") from exc


def plan_test(test: str) -> TestPlan:
    """How `test` is judged: by value when it is `assert EXPR == EXPECTED` with a plain EXPECTED on either side."""
    try:
        module = ast.parse(test)
    except SyntaxError:
        return TestPlan(test, "statement")
    if len(module.body) == 1 and isinstance(module.body[0], ast.Assert):
        check = module.body[0].test
        if isinstance(check, ast.Compare) and len(check.ops) == 1 and isinstance(check.ops[0], ast.Eq):
            for expr, expected in ((check.left, check.comparators[0]), (check.comparators[0], check.left)):
                try:
                    return TestPlan(test, "value", ast.unparse(expr), safe_expected(expected))
                except ValueError:
                    continue
    return TestPlan(test, "statement")


def _hashed(items: list, what: str) -> list:
    """`items` (set members or dict keys, as decoded), refused if too many share a hash value (see MAX_SAME_HASH)."""
    try:
        counts = collections.Counter(hash(x) for x in items)  # hash values are ints that hash to themselves
    except TypeError as exc:
        raise MalformedRecord(f"not an encoded value: {exc}") from exc
    if counts and max(counts.values()) > MAX_SAME_HASH:
        raise MalformedRecord(f"{what} built to collide in a hash table")
    return items


class _Decoder:
    """`harness.encode`'s inverse within its limits: at most MAX_ITEMS values, MAX_DEPTH deep, linear time."""

    def __init__(self) -> None:
        self.budget = MAX_ITEMS + 1

    def __call__(self, data: Any, depth: int = 0) -> Any:
        self.budget -= 1
        if self.budget < 0 or depth > MAX_DEPTH + 1:
            raise MalformedRecord("value too large or nested too deeply")
        if isinstance(data, str):
            if not data.isascii() and _SURROGATE.search(data):
                raise MalformedRecord("a lone surrogate outside the surrogates tag")
            return data
        if data is None or isinstance(data, (bool, int, float)):
            return data
        if isinstance(data, list):
            return [self(x, depth + 1) for x in data]
        if not (isinstance(data, dict) and len(data) == 1):
            raise MalformedRecord("not an encoded value")
        (tag, body), = data.items()
        try:
            return self._tagged(tag, body, depth)
        except (TypeError, ValueError, OverflowError) as exc:  # a wrong pair, bad hex, invalid UTF-8, huge numbers
            if isinstance(exc, MalformedRecord):
                raise
            raise MalformedRecord(f"not an encoded value: {exc}") from exc

    def _tagged(self, tag: str, body: Any, depth: int) -> Any:
        if tag == "int" and isinstance(body, str):
            return int(body, 16)
        if tag == "complex" and isinstance(body, list) and all(isinstance(x, (int, float)) for x in body):
            return complex(*body)
        if tag == "surrogates" and isinstance(body, str):
            return bytes.fromhex(body).decode("utf-8", "surrogatepass")
        if tag in ("bytes", "bytearray") and isinstance(body, str):
            return _TAGS[tag](body)
        if not isinstance(body, list):
            raise MalformedRecord(f"unknown value tag {tag!r}")
        if tag == "dict":
            pairs = [(self(k, depth + 1), self(v, depth + 1)) for k, v in body]
            _hashed([k for k, _ in pairs], "dict keys")
            return dict(pairs)
        if tag in ("set", "frozenset"):
            return _TAGS[tag](_hashed([self(x, depth + 1) for x in body], "set members"))
        if tag == "tuple":
            return tuple(self(x, depth + 1) for x in body)
        raise MalformedRecord(f"unknown value tag {tag!r}")


def decode(data: Any) -> Any:
    """The plain value that `harness.encode` encoded; MalformedRecord for anything it does not write."""
    return _Decoder()(data)


def read_record(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_RECORD_BYTES:
        raise MalformedRecord(f"a record longer than the harness writes ({MAX_RECORD_BYTES} bytes)")
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise MalformedRecord("a record that is not JSON") from exc
    if not isinstance(record, dict):
        raise MalformedRecord("a record that is not an object")
    return record


def reported_value(record: dict[str, Any]) -> Any:
    """The value a test record carries: the decoded plain value, or an opaque stand-in equal to nothing."""
    if "unreportable" in record:
        return _Opaque()
    if "value" not in record:
        raise MalformedRecord("a value test without a value")
    return decode(record["value"])


@dataclass(frozen=True)
class Decision:
    status: Literal["passed", "failed", "error", "memory", "crash"]
    message: str = ""
    failing_test: str = ""


class Judge:
    """Reads the harness's records in order and decides; a record out of place is a tampered channel (crash).

    "passed" here still needs the process's exit status 0, which only the caller of `feed` can check.
    """

    def __init__(self, plans: tuple[TestPlan, ...], token: str):
        self.plans, self.token = plans, token
        self.started = False
        self.next_test = 0

    def _test(self, record: dict[str, Any]) -> str:
        index = record.get("test", -1)
        return self.plans[index].source if isinstance(index, int) and 0 <= index < len(self.plans) else ""

    def feed(self, record: dict[str, Any]) -> Decision | None:
        """The verdict this record settles, or None while the run goes on."""
        try:
            return self._feed(record)
        except MalformedRecord as exc:
            return Decision("crash", f"Crash: the test run's report was malformed ({exc})")

    def _feed(self, record: dict[str, Any]) -> Decision | None:
        if not self.started:
            if record != {"started": True}:
                raise MalformedRecord("no start record")
            self.started = True
            return None
        if "error" in record:
            return Decision("error", str(record["error"]), self._test(record))
        if "memory" in record:
            return Decision("memory", "", self._test(record))
        if "done" in record:
            if record["done"] != self.token or self.next_test != len(self.plans):
                raise MalformedRecord("the run ended without every test reported")
            return Decision("passed")
        if record.get("test") != self.next_test or self.next_test >= len(self.plans):
            raise MalformedRecord("a test record out of order")
        plan = self.plans[self.next_test]
        self.next_test += 1
        if plan.kind == "value":
            holds = plan.holds(reported_value(record))
        else:
            holds = record == {"test": self.next_test - 1, "completed": True}
        return None if holds else Decision("failed", "AssertionError: " + plan.source.strip(), plan.source)
