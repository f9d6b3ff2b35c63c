"""The report's markdown cells and tables: an estimate as `mean [CI] (n)`, a share's CI in percent, a table."""

from __future__ import annotations

from typing import Any

from fastscore.study.analysis.power import SATURATED


def num(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.2e}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.3f}"


def mean_and_ci(mean: float, lo: float, hi: float) -> str:
    """`mean [lo, hi]`, with more decimals (up to 6) where three would print an interval of width as one point:
    0.99993 [0.99978, 1.0] is `0.9999 [0.9998, 1.0000]`, not `1.000 [1.000, 1.000]`, which reads as saturated."""
    text = [num(mean), num(lo), num(hi)]
    if text[1] == text[2] and lo != hi and "e" not in text[1]:
        for decimals in range(4, 7):
            text = [f"{x:.{decimals}f}" for x in (mean, lo, hi)]
            if text[1] != text[2]:
                break
    return f"{text[0]} [{text[1]}, {text[2]}]"


def cell(entry: dict[str, Any] | None, reason: str | None = None) -> str:
    if entry is None:
        return f"n/a ({reason})" if reason else "n/a"
    flag = " ⚠" if entry.get("unstable") else ""
    if entry.get("saturated"):  # at its bound on every item: the CI is set by n alone, no finding
        return f"{SATURATED}: {num(entry['mean'])} ({entry['n']})"
    if entry.get("lo") is None:
        return f"{num(entry['mean'])} [n/a] ({entry['n']}){flag}"
    return f"{mean_and_ci(entry['mean'], entry['lo'], entry['hi'])} ({entry['n']}){flag}"


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
