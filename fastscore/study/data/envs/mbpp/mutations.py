"""Seeded single-edit AST mutants of a reference program, applied as text edits at the mutated node's source span.

A mutant's text equals the reference text everywhere except the one replaced span, so the candidate set cannot be
told apart by formatting (re-printing the tree with `ast.unparse` would change every line's spacing and quoting).
Whether a mutant actually fails is decided by running it (see mbpp_env); this module only proposes edits.
"""

from __future__ import annotations

import ast
import bisect
import io
import random
import tokenize
import warnings
from dataclasses import dataclass


KINDS = ("operator_swap", "comparison_flip", "off_by_one", "return_value")

_BINOP_SYMBOLS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
    ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^",
}  # fmt: skip
_OPERATOR_SWAPS = {
    "+": "-", "-": "+", "*": "/", "/": "*", "//": "%", "%": "//", "**": "*",
    "<<": ">>", ">>": "<<", "|": "&", "&": "|", "^": "|", "and": "or", "or": "and",
}  # fmt: skip
_COMPARE_SYMBOLS = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}  # fmt: skip
_COMPARE_NEGATIONS = {
    "==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">",
    "in": "not in", "not in": "in", "is": "is not", "is not": "is",
}  # fmt: skip
_COMPARE_BOUNDARY = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
# Expressions to which " + 1" / " - 1" can be appended without changing how the rest of the expression parses.
_SHIFTABLE = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
_SHIFTABLE_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_RETURN_NAME_ALTERNATIVES = 2
_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
                  ast.DictComp, ast.GeneratorExp)
_BUILTIN_SWAPS = {"min": "max", "max": "min", "any": "all", "all": "any"}


@dataclass(frozen=True)
class Mutant:
    text: str  # the whole mutated program
    kind: str  # one of KINDS
    start: int  # character span [start, end) of the reference text that was replaced
    end: int
    original: str
    replacement: str


class _SourceMap:
    """Character offsets for ast positions (ast columns are UTF-8 byte offsets) and the token stream."""

    def __init__(self, code: str):
        self.code = code
        self.lines = code.split("\n")
        self.line_starts = [0]
        for line in self.lines[:-1]:
            self.line_starts.append(self.line_starts[-1] + len(line) + 1)
        self.tokens = [
            (self.offset_chars(tok.start), self.offset_chars(tok.end), tok.string)
            for tok in tokenize.generate_tokens(io.StringIO(code).readline)
            if tok.type in (tokenize.OP, tokenize.NAME)
        ]
        self.token_starts = [t[0] for t in self.tokens]

    def offset_chars(self, position: tuple[int, int]) -> int:
        lineno, col = position
        return self.line_starts[lineno - 1] + col

    def offset_bytes(self, lineno: int, col_bytes: int) -> int:
        prefix = self.lines[lineno - 1].encode("utf-8")[:col_bytes].decode("utf-8", errors="ignore")
        return self.line_starts[lineno - 1] + len(prefix)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset_bytes(node.lineno, node.col_offset),
            self.offset_bytes(node.end_lineno, node.end_col_offset),
        )

    def operator_between(self, left: ast.AST, right: ast.AST) -> tuple[int, int, str] | None:
        """The operator tokens between two operand nodes (parentheses skipped): their span and joined text."""
        lo, hi = self.span(left)[1], self.span(right)[0]
        i = bisect.bisect_left(self.token_starts, lo)
        found = []
        while i < len(self.tokens) and self.tokens[i][0] < hi:
            if self.tokens[i][2] not in "()":
                found.append(self.tokens[i])
            i += 1
        if not found:
            return None
        return found[0][0], found[-1][1], " ".join(t[2] for t in found)


def _edit(source: _SourceMap, kind: str, start: int, end: int, replacement: str) -> Mutant:
    code = source.code
    return Mutant(code[:start] + replacement + code[end:], kind, start, end, code[start:end], replacement)


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _shiftable(node: ast.AST) -> bool:
    if isinstance(node, _SHIFTABLE):
        return True
    # `n-1` / `n+1` are left to the constant mutation (it gives `n-2`, not the odd-looking `n-1 + 1`).
    return isinstance(node, ast.BinOp) and isinstance(node.op, _SHIFTABLE_BINOPS) and not _is_int(node.right)


def _shift_mutants(source: _SourceMap, node: ast.AST) -> list[Mutant]:
    start, end = source.span(node)
    text = source.code[start:end]
    return [_edit(source, "off_by_one", start, end, f"{text} {sign} 1") for sign in ("+", "-")]


def _operator_mutants(source: _SourceMap, node: ast.AST) -> list[Mutant]:
    pairs: list[tuple[ast.AST, ast.AST, str]] = []
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SYMBOLS:
        pairs.append((node.left, node.right, _BINOP_SYMBOLS[type(node.op)]))
    elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SYMBOLS:
        pairs.append((node.target, node.value, _BINOP_SYMBOLS[type(node.op)] + "="))
    elif isinstance(node, ast.BoolOp):
        symbol = "and" if isinstance(node.op, ast.And) else "or"
        pairs.extend((a, b, symbol) for a, b in zip(node.values, node.values[1:]))
    mutants = []
    for left, right, symbol in pairs:
        found = source.operator_between(left, right)
        if found is None or found[2] != symbol:
            continue
        base = symbol[:-1] if isinstance(node, ast.AugAssign) else symbol
        suffix = "=" if isinstance(node, ast.AugAssign) else ""
        mutants.append(_edit(source, "operator_swap", found[0], found[1], _OPERATOR_SWAPS[base] + suffix))
    return mutants


def _compare_mutants(source: _SourceMap, node: ast.Compare) -> list[Mutant]:
    mutants = []
    operands = [node.left, *node.comparators]
    for i, op in enumerate(node.ops):
        symbol = _COMPARE_SYMBOLS[type(op)]
        found = source.operator_between(operands[i], operands[i + 1])
        if found is None or found[2] != symbol:
            continue
        for table in (_COMPARE_NEGATIONS, _COMPARE_BOUNDARY):
            if symbol in table:
                mutants.append(_edit(source, "comparison_flip", found[0], found[1], table[symbol]))
    return mutants


def _constant_mutants(source: _SourceMap, node: ast.Constant, in_return: bool) -> list[Mutant]:
    start, end = source.span(node)
    kind = "return_value" if in_return else "off_by_one"
    if type(node.value) is bool:
        return [_edit(source, "return_value", start, end, str(not node.value))] if in_return else []
    if not _is_int(node):
        return []
    try:
        if ast.literal_eval(source.code[start:end]) != node.value:
            return []
    except (ValueError, SyntaxError):
        return []
    values = [node.value + 1] if node.value == 0 else [node.value + 1, node.value - 1]
    return [_edit(source, kind, start, end, str(v)) for v in values]


def _function_names(function: ast.AST) -> list[str]:
    """Parameters and local names of a function (not those of nested scopes), in order of first appearance."""
    names: list[str] = [a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)]
    body = function.body if isinstance(function.body, list) else [function.body]
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
        if isinstance(node, _NESTED_SCOPES):
            continue  # comprehension variables and nested functions' locals are not in scope at the return
        stack.extend(reversed(list(ast.iter_child_nodes(node))))
    return list(dict.fromkeys(names))


def _return_name_mutants(source: _SourceMap, node: ast.Return, function: ast.AST, rng: random.Random) -> list[Mutant]:
    """`return res` -> `return <another local of the same function>` (a plausible wrong-variable bug)."""
    if not isinstance(node.value, ast.Name) or function is None:
        return []
    others = [n for n in _function_names(function) if n != node.value.id]
    chosen = rng.sample(others, min(_RETURN_NAME_ALTERNATIVES, len(others)))
    start, end = source.span(node.value)
    return [_edit(source, "return_value", start, end, name) for name in chosen]


def _return_string_mutants(source: _SourceMap, node: ast.Return, function: ast.AST) -> list[Mutant]:
    """`return 'Found a match!'` -> another string the same function returns (swapped branch results)."""
    if function is None or not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
        return []
    returned = [
        r.value for r in ast.walk(function)
        if isinstance(r, ast.Return) and isinstance(r.value, ast.Constant) and isinstance(r.value.value, str)
    ]  # fmt: skip
    start, end = source.span(node.value)
    texts = dict.fromkeys(source.code[a:b] for a, b in map(source.span, returned))
    return [_edit(source, "return_value", start, end, t) for t in texts if t != source.code[start:end]]


def _builtin_swap_mutants(source: _SourceMap, node: ast.Call) -> list[Mutant]:
    """`min(...)` <-> `max(...)`, `any(...)` <-> `all(...)`: the same operation in the opposite direction."""
    if not (isinstance(node.func, ast.Name) and node.func.id in _BUILTIN_SWAPS):
        return []
    start, end = source.span(node.func)
    return [_edit(source, "operator_swap", start, end, _BUILTIN_SWAPS[node.func.id])]


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return node
    return None


def _parse(code: str) -> ast.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # old MBPP solutions use invalid string escapes like "\w"
        return ast.parse(code)


def all_mutants(code: str, rng: random.Random) -> list[Mutant]:
    """Every single-edit mutant of `code` that parses and differs from it, in source order, duplicates removed.

    `rng` only picks which other local names a `return name` mutant may return, so the result is a pure function
    of (code, rng state).
    """
    try:
        tree = _parse(code)
        source = _SourceMap(code)
    except (SyntaxError, ValueError, tokenize.TokenError):
        return []
    parents = _parents(tree)
    # Positions of nodes inside f-strings are unreliable before Python 3.12; leave f-strings alone.
    in_fstrings = {sub for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for sub in ast.walk(n)}
    nodes = sorted(
        (n for n in ast.walk(tree) if hasattr(n, "lineno") and n not in in_fstrings),
        key=lambda n: (n.lineno, n.col_offset, n.end_lineno or 0, n.end_col_offset or 0, type(n).__name__),
    )
    proposed: list[Mutant] = []
    for node in nodes:
        if isinstance(node, (ast.BinOp, ast.AugAssign, ast.BoolOp)):
            proposed += _operator_mutants(source, node)
        elif isinstance(node, ast.Compare):
            proposed += _compare_mutants(source, node)
        elif isinstance(node, ast.Constant):
            proposed += _constant_mutants(source, node, isinstance(parents.get(node), ast.Return))
        elif isinstance(node, ast.Return):
            function = _enclosing_function(node, parents)
            proposed += _return_name_mutants(source, node, function, rng)
            proposed += _return_string_mutants(source, node, function)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            proposed += [m for arg in node.args[:2] if _shiftable(arg) for m in _shift_mutants(source, arg)]
        elif isinstance(node, ast.Call):
            proposed += _builtin_swap_mutants(source, node)
        elif isinstance(node, ast.Subscript):
            bounds = [node.slice.lower, node.slice.upper] if isinstance(node.slice, ast.Slice) else [node.slice]
            proposed += [
                m for b in bounds if isinstance(b, (ast.Name, ast.Attribute)) for m in _shift_mutants(source, b)
            ]
    seen = {code}
    mutants = []
    for mutant in proposed:
        if mutant.text in seen:
            continue
        seen.add(mutant.text)
        try:
            _parse(mutant.text)
        except (SyntaxError, ValueError):
            continue
        mutants.append(mutant)
    return mutants


def seeded_mutants(code: str, rng: random.Random) -> list[Mutant]:
    """All mutants of `code` in an order drawn from `rng` (callers seed it per task, so order is item-independent)."""
    mutants = all_mutants(code, rng)
    rng.shuffle(mutants)
    return mutants
