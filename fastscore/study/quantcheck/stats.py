"""Agreement statistics between a reference and a quantised variant (pure numpy, tested on crafted inputs).

Arrays are per item and aligned. Bootstrap CIs reuse fastscore.study.analysis.stats (shared resamples).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastscore.errors import DataError
from fastscore.study.analysis.stats import bootstrap_ci

# Bins of |G_ref| (nats): items whose reference gain is near 0 may flip sign under any perturbation.
MARGIN_EDGES = (0.0, 0.5, 2.0, math.inf)


def _pair(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise DataError(f"paired arrays must be 1-D and of equal length (got {x.shape} and {y.shape})")
    if x.size == 0:
        raise DataError("no items to compare")
    return x, y


def sign_agreement(g_ref: Sequence[float], g_var: Sequence[float]) -> float:
    """Share of items whose gain has the same sign (-, 0, +) under both."""
    x, y = _pair(g_ref, g_var)
    return float(np.mean(np.sign(x) == np.sign(y)))


def binned_sign_agreement(g_ref: Sequence[float], g_var: Sequence[float],
                          edges: Sequence[float] = MARGIN_EDGES) -> list[dict[str, Any]]:
    """Sign agreement within bins [lo, hi) of |G_ref|; an empty bin reports n = 0 and no agreement value."""
    x, y = _pair(g_ref, g_var)
    margin = np.abs(x)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (margin >= lo) & (margin < hi)
        n = int(inside.sum())
        entry: dict[str, Any] = {"lo": float(lo), "hi": None if math.isinf(hi) else float(hi), "n": n}
        if n:
            agree = int(np.sum(np.sign(x[inside]) == np.sign(y[inside])))
            entry["agreement"] = agree / n
            entry["n_agree"] = agree
        out.append(entry)
    return out


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=float)
    sorted_x = x[order]
    # Start of each run of equal values, and each run's average rank.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]
    averages = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks[order] = np.repeat(averages, ends - starts)
    return ranks


def pearson(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Pearson correlation; None when either side is constant (the correlation is undefined)."""
    x, y = _pair(a, b)
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return None if denom == 0.0 else float(dx @ dy) / denom


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson correlation of average ranks (ties handled); None when undefined."""
    x, y = _pair(a, b)
    return pearson(average_ranks(x), average_ranks(y))


def kl_rows(ref_logp: np.ndarray, var_logp: np.ndarray) -> np.ndarray:
    """KL(ref || var) of each row of natural-log probabilities [n, V]: sum_v p_ref (log p_ref - log p_var)."""
    p, q = np.asarray(ref_logp, dtype=np.float64), np.asarray(var_logp, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 2:
        raise DataError(f"log-prob rows must be 2-D and of equal shape (got {p.shape} and {q.shape})")
    weight = np.exp(p)
    # Where p_ref = 0 the term is 0 whatever q is (avoids 0 * inf).
    terms = np.where(weight > 0.0, weight * (p - q), 0.0)
    return np.maximum(terms.sum(axis=1), 0.0)  # tiny negative values are float rounding


def mean_shift(per_token_ref: Sequence[float], per_token_var: Sequence[float], idx: np.ndarray) -> dict[str, Any]:
    """Mean over items of (variant - reference) of a per-token quantity (G, or an lp) with a percentile-bootstrap
    CI over items."""
    x, y = _pair(per_token_ref, per_token_var)
    return bootstrap_ci(y - x, idx).to_dict()


def mean_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    x, y = _pair(a, b)
    return float(np.mean(np.abs(x - y)))


def agreement(a: Sequence[int], b: Sequence[int]) -> float:
    x, y = _pair(a, b)
    return float(np.mean(x == y))


def _sign_word(x: float) -> str:
    return "negative" if x < 0 else "positive" if x > 0 else "zero"


def sign_of_mean_statement(ref_mean: float, var_mean: float, name: str = "mean G") -> str:
    """Plain words: did the sign of the mean gain change? e.g. 'sign of mean G unchanged (ref -1.23, variant -1.19)'."""
    verdict = "unchanged" if np.sign(ref_mean) == np.sign(var_mean) else (
        f"CHANGED ({_sign_word(ref_mean)} -> {_sign_word(var_mean)})")
    return f"sign of {name} {verdict} (ref {ref_mean:+.3f}, variant {var_mean:+.3f})"
