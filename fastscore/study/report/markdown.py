"""The report's markdown cells and tables: an estimate as `mean [CI] (n)`, a share's CI in percent, a table."""

from __future__ import annotations

from typing import Any

from fastscore.study.analysis.power import SATURATED


def num(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.2e}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.3f}"


def cell(entry: dict[str, Any] | None, reason: str | None = None) -> str:
    if entry is None:
        return f"n/a ({reason})" if reason else "n/a"
    ci = "[n/a]" if entry.get("lo") is None else f"[{num(entry['lo'])}, {num(entry['hi'])}]"
    flag = " ⚠" if entry.get("unstable") else ""
    if entry.get("saturated"):  # at its bound on every item: the CI is set by n alone, no finding
        return f"{SATURATED}: {num(entry['mean'])} ({entry['n']})"
    return f"{num(entry['mean'])} {ci} ({entry['n']}){flag}"


def ci_pct(est: dict[str, Any]) -> str:
    """A share's CI in percent: `lo, hi%`."""
    if est.get("lo") is None:
        return "n/a"
    lo, hi = (round(100 * est[k]) for k in ("lo", "hi"))  # ints: a bound just below 0 prints as 0, not -0
    return f"{lo}, {hi}%"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)
