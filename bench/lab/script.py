"""What the lab's `python -m` scripts share: their comma-separated options. (A typed error ends a script as it ends a
`fastscore` command: fastscore.exits.friendly.)"""

from __future__ import annotations


def comma_list(value: str) -> tuple[str, ...]:
    """'a, b,c' -> ('a', 'b', 'c'), as given (model paths keep their case)."""
    return tuple(v.strip() for v in value.split(",") if v.strip())
