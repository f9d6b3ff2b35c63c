"""Statistics on per-item arrays (pure numpy): corrective gain, shared-resample percentile bootstrap, ratios.

NaN marks an item that lacks a value; every function excludes such items (pairwise for ratios).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from fastscore.errors import DataError
from fastscore.mathops import wilson_interval  # noqa: F401  (re-exported: the study modules import it from here)

CI_LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A mean with its percentile-bootstrap CI over items; lo/hi are None only when no resample held an item."""

    mean: float
    lo: float | None
    hi: float | None
    n: int
    unstable: bool | None = None  # set for ratios: True when the denominator's CI includes 0
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mean": float(self.mean), "lo": _opt(self.lo), "hi": _opt(self.hi), "n": self.n}
        if self.unstable is not None:
            out["unstable"] = bool(self.unstable)
        if self.note:
            out["note"] = self.note
        return out


def _opt(x: float | None) -> float | None:
    return None if x is None else float(x)


def corrective_gain(lp_before: np.ndarray, lp_cond: np.ndarray) -> np.ndarray:
    """G = lp(before) - lp(cond): positive means the record made the failed action less likely."""
    return np.asarray(lp_before, dtype=float) - np.asarray(lp_cond, dtype=float)


def resample_indices(n: int, n_boot: int, seed: int | Iterable[int]) -> np.ndarray:
    """One B x n matrix of item indices, drawn once and shared by every metric so paired ratios stay paired."""
    if n < 1 or n_boot < 1:
        raise DataError(f"bootstrap needs n >= 1 and n_boot >= 1 (got n={n}, n_boot={n_boot})")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_means(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Mean of the present (non-NaN) values in each resample; NaN for a resample holding none of them."""
    v = np.asarray(values, dtype=float)[idx]
    present = ~np.isnan(v)
    counts = present.sum(axis=1)
    sums = np.where(present, v, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def percentile_interval(boot: np.ndarray, level: float = CI_LEVEL) -> tuple[float | None, float | None]:
    """The percentile interval of a statistic's bootstrap values (non-finite ones, e.g. empty resamples, left out)."""
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return None, None
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    return float(lo), float(hi)


def present_count(values: np.ndarray) -> int:
    return int(np.count_nonzero(~np.isnan(np.asarray(values, dtype=float))))


def bootstrap_ci(values: np.ndarray, idx: np.ndarray, level: float = CI_LEVEL) -> Estimate:
    """Mean of the present values with a percentile CI from the shared resamples `idx`."""
    values = np.asarray(values, dtype=float)
    n = present_count(values)
    if n == 0:
        raise DataError("bootstrap_ci: no item has a value")
    lo, hi = percentile_interval(bootstrap_means(values, idx), level)
    note = None if lo is not None else "no bootstrap resample contained an item with a value"
    return Estimate(float(np.nanmean(values)), lo, hi, n, note=note)


def ratio_ci(num: np.ndarray, den: np.ndarray, idx: np.ndarray, level: float = CI_LEVEL) -> Estimate:
    """mean(num) / mean(den) over items having both, CI from the same resamples; unstable if den's CI holds 0."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    both = ~np.isnan(num) & ~np.isnan(den)
    num, den = np.where(both, num, np.nan), np.where(both, den, np.nan)
    n = int(both.sum())
    if n == 0:
        raise DataError("ratio_ci: no item has both numerator and denominator")
    den_mean = float(np.nanmean(den))
    if den_mean == 0.0:
        raise DataError("ratio_ci: the denominator's mean is exactly 0")
    boot_num, boot_den = bootstrap_means(num, idx), bootstrap_means(den, idx)
    den_lo, den_hi = percentile_interval(boot_den, level)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo, hi = percentile_interval(boot_num / boot_den, level)
    unstable = den_lo is None or den_lo <= 0.0 <= den_hi
    note = None if lo is not None else "no bootstrap resample contained an item with both values"
    return Estimate(float(np.nanmean(num)) / den_mean, lo, hi, n, unstable=unstable, note=note)


def wilson_ci(values: np.ndarray, level: float = CI_LEVEL) -> Estimate:
    """Share of True among the present (non-NaN) 0/1 values, with the Wilson score interval.

    A percentile bootstrap collapses at 0 and 1 (20/20 gives [1, 1]); Wilson does not (20/20 gives [0.839, 1]).
    """
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    n = int(v.size)
    if n == 0:
        raise DataError("wilson_ci: no item has a value")
    if not np.all((v == 0.0) | (v == 1.0)):
        raise DataError("wilson_ci: values must be 0/1")
    k = int(v.sum())
    lo, hi = wilson_interval(k, n, level)
    return Estimate(k / n, lo, hi, n, note="Wilson score interval")


def odds_factor(per_token_gain: Estimate) -> Estimate:
    """exp(-mean per-token G): the factor on each token's odds; the CI is the transformed bounds (order flips)."""
    g = per_token_gain
    lo = None if g.hi is None else math.exp(-g.hi)
    hi = None if g.lo is None else math.exp(-g.lo)
    return Estimate(math.exp(-g.mean), lo, hi, g.n, note=g.note)


def share_removed(ratio: Estimate) -> Estimate:
    """1 - mean G(remedy)/mean G(after): 1 = the inversion is gone, 0 = no change, < 0 = worse."""
    lo = None if ratio.hi is None else 1.0 - ratio.hi
    hi = None if ratio.lo is None else 1.0 - ratio.lo
    return Estimate(1.0 - ratio.mean, lo, hi, ratio.n, unstable=ratio.unstable, note=ratio.note)


def assert_json_safe(obj: Any, path: str = "summary") -> None:
    """Raise AssertionError naming the first NaN/inf or non-JSON value."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise AssertionError(f"{path}: non-string key {key!r}")
            assert_json_safe(value, f"{path}.{key}")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            assert_json_safe(value, f"{path}[{i}]")
    elif isinstance(obj, float):
        if not math.isfinite(obj):
            raise AssertionError(f"{path}: non-finite number {obj}")
    elif not (obj is None or isinstance(obj, (str, bool, int))):
        raise AssertionError(f"{path}: not JSON-serialisable ({type(obj).__name__})")
