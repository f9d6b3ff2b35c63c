"""Power and saturation of paired per-item contrasts (pure numpy): what a run of this n can and cannot resolve.

A paired contrast is a per-item difference d_i (NaN: the item lacks one side). With n items, mean d and standard
deviation s, the standard error is s / sqrt(n); a two-sided test at level alpha has power `power` against a true mean
difference of (z_{1-alpha/2} + z_power) * SE (about 2.8 SE at alpha = 0.05, power = 0.8): the minimal detectable
effect. The n needed to detect the observed mean at that power is ((z_{1-alpha/2} + z_power) * s / |mean d|)^2, and
at least MIN_ITEMS.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

ALPHA = 0.05
POWER = 0.8
SATURATED = "saturated — not measurable at this n"
# Below this many items a percentile bootstrap is no interval (two items give at most three resample means), so no
# direction or ranking is stated from it.
MIN_ITEMS = 5


def power_multiplier(alpha: float = ALPHA, power: float = POWER) -> float:
    """z_{1-alpha/2} + z_power: 2.80 at alpha 0.05 and power 0.8."""
    z = NormalDist()
    return z.inv_cdf(1.0 - alpha / 2.0) + z.inv_cdf(power)


def paired_se(diff: np.ndarray) -> float | None:
    """Standard error of the mean of the present per-item differences (None with fewer than 2 items)."""
    d = np.asarray(diff, dtype=float)
    d = d[~np.isnan(d)]
    if d.size < 2:
        return None
    return float(np.std(d, ddof=1) / math.sqrt(d.size))


def min_detectable_effect(diff: np.ndarray, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest true mean difference this many items detect with `power` at two-sided level `alpha` (None with
    fewer than 2 items or no spread: identical differences on every item estimate no standard error)."""
    se = paired_se(diff)
    return None if se is None or se == 0.0 else power_multiplier(alpha, power) * se


def n_needed(diff: np.ndarray, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Items needed to detect the observed mean difference (None: fewer than 2 items, a mean of exactly 0, or no
    spread to estimate a standard error from)."""
    d = np.asarray(diff, dtype=float)
    d = d[~np.isnan(d)]
    if d.size < 2 or float(d.mean()) == 0.0:
        return None
    sd = float(np.std(d, ddof=1))
    if sd == 0.0:
        return None
    # Never below MIN_ITEMS: fewer items give no interval the study states a direction from.
    return max(MIN_ITEMS, math.ceil((power_multiplier(alpha, power) * sd / abs(float(d.mean()))) ** 2))


def power_fields(diff: np.ndarray, alpha: float = ALPHA, power: float = POWER) -> dict[str, Any]:
    """{"mde": ..., "n_needed": ...} for an Estimate's dict (keys absent where not computable)."""
    out: dict[str, Any] = {}
    mde, need = min_detectable_effect(diff, alpha, power), n_needed(diff, alpha, power)
    if mde is not None:
        out["mde"] = mde
    if need is not None:
        out["n_needed"] = need
    return out


def saturation(values: np.ndarray, lo: float = 0.0, hi: float = 1.0, tol: float = 5e-4) -> str | None:
    """"upper" / "lower" when every present value sits at that bound (within tol: it prints as 0.000 / 1.000), else
    None.

    A share that is 0/n or n/n, or a probability that is 1 on every item, measures nothing about a difference at
    this n: its CI is set by n alone.
    """
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return None
    if np.all(v >= hi - tol):
        return "upper"
    if np.all(v <= lo + tol):
        return "lower"
    return None
