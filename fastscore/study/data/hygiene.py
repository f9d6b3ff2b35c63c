"""What a runtime-written description of a failure may not contain: the failed action's distinctive surface form.

The description remedy replaces the verbatim failed action; if it quoted the action, or the erroneous names in it
(a misspelled function, an invented parameter), it would bring back the very surface form whose copying it is meant
to remove. Distinctive = every line of the failed action that is not a line of the correct action, and every name
(an identifier of 3+ characters) of the failed action that appears neither in the correct action nor in the context
the model already sees (system prompt and task).

A description is built from the runtime's or the tests' own words, and on the model's own failures those words
name what the model wrote (its parameter names, its prose). Such an item is kept with the quoted substrings
replaced by a marker (`redact`), and `check_description` stays the final guard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


def template_wording(module_name: str) -> frozenset[str]:
    """The names (3+ characters) a description module writes literally: the words of its string constants and
    f-string texts, docstrings left out. A description uses them whatever the model wrote ("not", "call"), so one
    of them in the failed action is not a quote of it; redacting them would change what the description says."""
    import ast
    import importlib
    import inspect

    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return frozenset(word for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                     for word in _NAME.findall(node.value))


def distinctive_substrings(failed: str, correct: str, context: str,
                           wording: Iterable[str] = ()) -> tuple[str, ...]:
    """The failed action, its lines not in the correct action, and its names in none of the correct action, the
    context and the description's own `wording` (template_wording)."""
    correct_lines = {line.strip() for line in correct.splitlines()}
    lines = [line.strip() for line in failed.splitlines()
             if line.strip() and line.strip() not in correct_lines and not line.strip().startswith("```")]
    known = set(_NAME.findall(correct)) | set(_NAME.findall(context)) | set(wording)
    names = sorted(set(_NAME.findall(failed)) - known)
    return tuple(dict.fromkeys([failed.strip(), *lines, *names]))


# The marker for a redacted substring. "…" has no identifier character, so it can never be, or join with its
# neighbours into, a distinctive name (a word marker such as "<name>" would bring back the name `name` whenever the
# failed program used it), and it reads as an elision rather than as an instruction. One marker for names and lines
# alike: a kind-specific one would tell the model which of its lines or names was wrong.
REDACTED = "\u2026"
# Redaction reaches a fixed point in a few passes (a removed line can expose a name only once); more is a bug.
_MAX_PASSES = 8


def _word(part: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(part)}(?![A-Za-z0-9_])")


def quoted(description: str, failed: str, correct: str, context: str, wording: Iterable[str] = ()) -> list[str]:
    """The distinctive substrings of the failed action that the description contains (names as whole words)."""
    found = []
    for part in distinctive_substrings(failed, correct, context, wording):
        if _NAME.fullmatch(part):
            if _word(part).search(description):
                found.append(part)
        elif part in description:
            found.append(part)
    return found


def check_description(description: str, failed: str, correct: str, context: str,
                      wording: Iterable[str] = ()) -> None:
    """ValueError naming what the description would quote."""
    leaks = quoted(description, failed, correct, context, wording)
    if leaks:
        raise ValueError(f"the description would quote the failed action's {', '.join(map(repr, leaks[:3]))}")


def redact(description: str, failed: str, correct: str, context: str,
           wording: Iterable[str] = ()) -> tuple[str, int]:
    """The description with every quoted distinctive substring replaced by REDACTED, and how many were replaced.

    Longest first, so a quoted line is replaced whole before its names are looked for; names whole-word, as `quoted`
    finds them. Replacing a line can leave a name standing alone that was part of a longer word, so passes repeat
    until nothing is quoted. A substring the marker itself contains cannot be removed: the caller's
    check_description then fails, as it must, instead of a quoting description being kept.
    """
    parts = sorted(distinctive_substrings(failed, correct, context, wording), key=len, reverse=True)
    count = 0
    for _ in range(_MAX_PASSES):
        before = description
        for part in parts:
            if _NAME.fullmatch(part):
                description, n = _word(part).subn(REDACTED, description)
            else:
                n = description.count(part)
                description = description.replace(part, REDACTED)
            count += n
        if description == before or not quoted(description, failed, correct, context, wording):
            break
    return description, count
