"""What a runtime-written description of a failure may not contain: the failed action's distinctive surface form.

The description remedy replaces the verbatim failed action; if it quoted the action, or the erroneous names in it
(a misspelled function, an invented parameter), it would bring back the very surface form whose copying it is meant
to remove. Distinctive = every line of the failed action that is not a line of the correct action, and every name
(an identifier of 3+ characters) of the failed action that appears neither in the correct action nor in the context
the model already sees (system prompt and task).
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


def distinctive_substrings(failed: str, correct: str, context: str) -> tuple[str, ...]:
    correct_lines = {line.strip() for line in correct.splitlines()}
    lines = [line.strip() for line in failed.splitlines()
             if line.strip() and line.strip() not in correct_lines and not line.strip().startswith("```")]
    known = set(_NAME.findall(correct)) | set(_NAME.findall(context))
    names = sorted(set(_NAME.findall(failed)) - known)
    return tuple(dict.fromkeys([failed.strip(), *lines, *names]))


def quoted(description: str, failed: str, correct: str, context: str) -> list[str]:
    """The distinctive substrings of the failed action that the description contains (names as whole words)."""
    found = []
    for part in distinctive_substrings(failed, correct, context):
        if _NAME.fullmatch(part):
            if re.search(rf"(?<![A-Za-z0-9_]){re.escape(part)}(?![A-Za-z0-9_])", description):
                found.append(part)
        elif part in description:
            found.append(part)
    return found


def check_description(description: str, failed: str, correct: str, context: str) -> None:
    """ValueError naming what the description would quote."""
    leaks = quoted(description, failed, correct, context)
    if leaks:
        raise ValueError(f"the description would quote the failed action's {', '.join(map(repr, leaks[:3]))}")
