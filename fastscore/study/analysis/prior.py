"""The failure's prior: does the gap in G between seeded and on-policy failures survive matching on the model's prior?

The failed action's prior is its log-probability per token in the `before` context (no failure record). The model's
own greedy attempt is likely there by construction (prior near 0), while a seeded mutation is a string the model would
not write (prior far below 0); a copy boost has more room to raise a low-prior string. If that is what separates the
sources, their G per token should agree at matched prior. Two ways to match, both from the stored score rows:

- bins of the prior, with edges at the terciles of the pooled prior of both sources (about a third of the items in
  each, on whatever scale the model's priors fall; fixed edges would have to guess that scale in advance). A bin
  where both sources have items is a matched comparison; one where a source is (nearly) absent says so.
- least squares G/token ~ 1 + prior + on_policy (pooled over environments: + one intercept per environment): the
  on_policy coefficient is the gap at equal prior, under a linear effect of the prior common to both sources. Where
  the sources' priors do not overlap it is an extrapolation of that line, and the result says how many items of
  each source lie in the common range.

G and G/token are the study's own (`EnvTable.gain` over the `after` condition's token count, as in the headline);
intervals are percentile bootstraps with items resampled within each failure source, seeded from the study's seed.
Pure numpy; no model is run.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastscore.errors import DataError
from fastscore.study.data.conditions import REFERENCE
from fastscore.study.analysis.metrics import ScoreRow, build_tables, read_score_rows
from fastscore.study.analysis.stats import (
    CI_LEVEL, Estimate, assert_json_safe, bootstrap_ci, bootstrap_means, percentile_interval, resample_indices,
)

SEEDED, MODEL = "seeded", "model"  # the failure sources (runner.FAILURE_SOURCES); MODEL is the on-policy one
CONDITION = "after"  # the headline's condition
BIN_LABELS = ("low prior", "middle prior", "high prior")
MIN_ITEMS = 2  # a mean over fewer items of a source has no spread to resample: the cell says so instead
POOLED = "pooled"
NOT_APPLICABLE = "not applicable"
DEFAULT_N_BOOT = 2000  # fastscore study --n-boot, for a run whose summary.json is not written yet


@dataclass(frozen=True)
class PriorItems:
    """One failure source's items: environment, prior (before lp / token) and G/token under `after`."""

    source: str
    envs: tuple[str, ...]
    prior: np.ndarray
    gain_per_token: np.ndarray

    def subset(self, keep: np.ndarray) -> "PriorItems":
        return PriorItems(self.source, tuple(e for e, k in zip(self.envs, keep) if k), self.prior[keep],
                          self.gain_per_token[keep])


def prior_items(rows: Iterable[ScoreRow], source: str) -> PriorItems:
    """The items of one failure source having both `before` and `after` rows."""
    envs: list[str] = []
    prior, gain = [], []
    for env, table in build_tables(rows).items():
        if not (table.has(REFERENCE) and table.has(CONDITION)):
            continue
        p = table.column(REFERENCE, "lp") / table.column(REFERENCE, "n_tokens")
        g = table.gain(CONDITION) / table.column(CONDITION, "n_tokens")
        keep = ~np.isnan(p) & ~np.isnan(g)
        envs += [env] * int(keep.sum())
        prior.append(p[keep])
        gain.append(g[keep])
    return PriorItems(source, tuple(envs), np.concatenate(prior) if prior else np.zeros(0),
                      np.concatenate(gain) if gain else np.zeros(0))


Value = Estimate | str  # an estimate, or why there is none ("not applicable (n = 1)")


def _to_dict(value: Value) -> dict[str, Any]:
    return {NOT_APPLICABLE: value} if isinstance(value, str) else value.to_dict()


def _too_few(n: int) -> str | None:
    return f"{NOT_APPLICABLE} (n = {n})" if n < MIN_ITEMS else None


def _idx(n: int, n_boot: int, seed: int, *salt: str) -> np.ndarray:
    # crc32, not hash(): str hashes are salted per process and the CIs must be reproducible.
    return resample_indices(n, n_boot, [seed, zlib.crc32(":".join(("prior",) + salt).encode())])


def _difference(a: np.ndarray, b: np.ndarray, boot_a: np.ndarray, boot_b: np.ndarray, n: int) -> Estimate:
    """mean(a) - mean(b) with the percentile interval of the resampled differences."""
    lo, hi = percentile_interval(boot_a - boot_b)
    return Estimate(float(a.mean() - b.mean()), lo, hi, n)


@dataclass(frozen=True)
class PriorBin:
    label: str
    lo: float | None  # edges of the prior (nats/token); None: the lowest bin is open below, the highest above
    hi: float | None
    gain: dict[str, Value]  # source -> mean G/token of its items in the bin
    mean_prior: dict[str, Value]  # source -> mean prior of its items in the bin (how well the bin matches them)
    gap: Value  # on-policy minus seeded in the bin

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "prior_from": self.lo, "prior_to": self.hi,
                "gain_per_token": {s: _to_dict(v) for s, v in self.gain.items()},
                "mean_prior": {s: _to_dict(v) for s, v in self.mean_prior.items()}, "gap": _to_dict(self.gap)}


@dataclass(frozen=True)
class SourceGap:
    raw: Value  # mean G/token on-policy - seeded
    adjusted: Value  # the on_policy coefficient of G/token ~ 1 + prior + on_policy
    slope: Value  # the prior coefficient: change of G/token per nat/token of prior
    remaining: Value  # adjusted / raw: the share of the raw gap left at equal prior
    overlap: dict[str, Any]  # the common prior range and how many items of each source lie in it
    singular_resamples: int  # resamples whose design had rank < 3 (left out of the intervals)

    def to_dict(self) -> dict[str, Any]:
        return {"raw": _to_dict(self.raw), "adjusted_for_prior": _to_dict(self.adjusted),
                "prior_slope": _to_dict(self.slope), "share_remaining": _to_dict(self.remaining),
                "overlap": self.overlap, "singular_resamples": self.singular_resamples}


@dataclass(frozen=True)
class PriorAnalysis:
    scope: str  # an environment, or POOLED
    n: dict[str, int]
    prior: dict[str, Value]  # source -> mean prior (nats/token)
    gain: dict[str, Value]  # source -> mean G/token
    edges: tuple[float, float]  # the tercile edges of the pooled prior
    bins: tuple[PriorBin, ...]
    gap: SourceGap

    def to_dict(self) -> dict[str, Any]:
        return {"n": dict(self.n), "mean_prior": {s: _to_dict(v) for s, v in self.prior.items()},
                "gain_per_token": {s: _to_dict(v) for s, v in self.gain.items()}, "tercile_edges": list(self.edges),
                "bins": [b.to_dict() for b in self.bins], "gap": self.gap.to_dict()}


def _mean(values: np.ndarray, n_boot: int, seed: int, *salt: str) -> Value:
    reason = _too_few(values.size)
    return reason if reason else bootstrap_ci(values, _idx(values.size, n_boot, seed, *salt))


def tercile_edges(prior: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(prior, [1 / 3, 2 / 3])
    return float(lo), float(hi)


def _bins(seeded: PriorItems, model: PriorItems, n_boot: int, seed: int, scope: str,
          edges: tuple[float, float]) -> tuple[PriorBin, ...]:
    bounds = (-np.inf, *edges, np.inf)
    out = []
    for k, label in enumerate(BIN_LABELS):
        cells: dict[str, PriorItems] = {}
        for items in (seeded, model):
            # lo <= prior < hi; the outer bounds are infinite, so every item falls in exactly one bin
            cells[items.source] = items.subset((items.prior >= bounds[k]) & (items.prior < bounds[k + 1]))
        gain, mean_prior, boots = {}, {}, {}
        for source, cell in cells.items():
            mean_prior[source] = _mean(cell.prior, n_boot, seed, scope, label, source, "prior")
            reason = _too_few(cell.prior.size)
            if reason:
                gain[source] = reason
                continue
            idx = _idx(cell.prior.size, n_boot, seed, scope, label, source)
            gain[source] = bootstrap_ci(cell.gain_per_token, idx)
            boots[source] = bootstrap_means(cell.gain_per_token, idx)
        if len(boots) == 2:
            gap: Value = _difference(cells[MODEL].gain_per_token, cells[SEEDED].gain_per_token, boots[MODEL],
                                     boots[SEEDED], cells[MODEL].prior.size + cells[SEEDED].prior.size)
        else:
            gap = f"{NOT_APPLICABLE} (n = {cells[MODEL].prior.size} on-policy, {cells[SEEDED].prior.size} seeded)"
        lo, hi = (float(x) if np.isfinite(x) else None for x in bounds[k:k + 2])
        out.append(PriorBin(label, lo, hi, gain, mean_prior, gap))
    return tuple(out)


def fit(prior: np.ndarray, on_policy: np.ndarray, gain: np.ndarray, envs: np.ndarray | None = None
        ) -> np.ndarray | None:
    """Least squares gain ~ 1 + prior + on_policy (+ one intercept per environment after the first, when `envs`
    holds several): (intercept, prior slope, on_policy offset, ...); None if the design is singular."""
    columns = [np.ones_like(prior), prior, on_policy.astype(float)]
    if envs is not None:
        columns += [(envs == e).astype(float) for e in sorted(set(envs.tolist()))[1:]]
    design = np.column_stack(columns)
    coef, _, rank, _ = np.linalg.lstsq(design, gain, rcond=None)
    return coef if rank == design.shape[1] else None


def _overlap(seeded: PriorItems, model: PriorItems) -> dict[str, Any]:
    lo = max(float(seeded.prior.min()), float(model.prior.min()))
    hi = min(float(seeded.prior.max()), float(model.prior.max()))
    inside = {s.source: int(((s.prior >= lo) & (s.prior <= hi)).sum()) if lo <= hi else 0 for s in (seeded, model)}
    return {"prior_from": lo, "prior_to": hi, "items_inside": inside} if lo <= hi else \
        {"prior_from": None, "prior_to": None, "items_inside": inside}


def _gap(seeded: PriorItems, model: PriorItems, n_boot: int, seed: int, scope: str) -> SourceGap:
    n_s, n_m = seeded.prior.size, model.prior.size
    if n_s < MIN_ITEMS or n_m < MIN_ITEMS:
        reason = f"{NOT_APPLICABLE} (n = {n_m} on-policy, {n_s} seeded)"
        return SourceGap(reason, reason, reason, reason, _overlap(seeded, model) if n_s and n_m else {}, 0)
    idx_s, idx_m = _idx(n_s, n_boot, seed, scope, SEEDED), _idx(n_m, n_boot, seed, scope, MODEL)
    boot_raw = bootstrap_means(model.gain_per_token, idx_m) - bootstrap_means(seeded.gain_per_token, idx_s)
    raw = Estimate(float(model.gain_per_token.mean() - seeded.gain_per_token.mean()),
                   *percentile_interval(boot_raw), n_s + n_m)
    on_policy = np.r_[np.zeros(n_s), np.ones(n_m)]
    # Pooled, each environment gets its own intercept: G's level differs between environments, and so does each
    # source's share of the items, which would otherwise pass for a difference of sources.
    envs_s, envs_m = np.asarray(seeded.envs), np.asarray(model.envs)
    coef = fit(np.r_[seeded.prior, model.prior], on_policy, np.r_[seeded.gain_per_token, model.gain_per_token],
               np.r_[envs_s, envs_m])
    overlap = _overlap(seeded, model)
    if coef is None:
        reason = f"{NOT_APPLICABLE} (the prior is collinear with the failure source: the fit is singular)"
        return SourceGap(raw, reason, reason, reason, overlap, 0)
    boot = np.full((n_boot, 2), np.nan)
    for b in range(n_boot):  # each resample keeps both sources' sizes, so the design always holds both
        c = fit(np.r_[seeded.prior[idx_s[b]], model.prior[idx_m[b]]], on_policy,
                np.r_[seeded.gain_per_token[idx_s[b]], model.gain_per_token[idx_m[b]]],
                np.r_[envs_s[idx_s[b]], envs_m[idx_m[b]]])
        if c is not None:
            boot[b] = c[2], c[1]
    singular = int(np.isnan(boot[:, 0]).sum())
    adjusted = Estimate(float(coef[2]), *percentile_interval(boot[:, 0]), n_s + n_m)
    slope = Estimate(float(coef[1]), *percentile_interval(boot[:, 1]), n_s + n_m)
    if raw.mean == 0.0:
        remaining: Value = f"{NOT_APPLICABLE} (the raw gap is exactly 0)"
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            lo, hi = percentile_interval(boot[:, 0] / boot_raw)
        unstable = raw.lo is None or raw.lo <= 0.0 <= raw.hi
        remaining = Estimate(adjusted.mean / raw.mean, lo, hi, n_s + n_m, unstable=unstable)
    return SourceGap(raw, adjusted, slope, remaining, overlap, singular)


def analyse_scope(seeded: PriorItems, model: PriorItems, n_boot: int, seed: int, scope: str) -> PriorAnalysis:
    if seeded.prior.size + model.prior.size == 0:
        raise DataError(f"prior analysis ({scope}): no item of either failure source")
    edges = tercile_edges(np.r_[seeded.prior, model.prior])
    per = {s.source: s for s in (seeded, model)}
    return PriorAnalysis(
        scope, {s: items.prior.size for s, items in per.items()},
        {s: _mean(items.prior, n_boot, seed, scope, s, "prior") for s, items in per.items()},
        {s: _mean(items.gain_per_token, n_boot, seed, scope, s, "gain") for s, items in per.items()},
        edges, _bins(seeded, model, n_boot, seed, scope, edges), _gap(seeded, model, n_boot, seed, scope))


def analyse(seeded: PriorItems, model: PriorItems, n_boot: int = 2000, seed: int = 0) -> dict[str, PriorAnalysis]:
    """Per environment where both sources have items, and pooled over those environments when there are several
    (an environment with one source only would add a difference of environments, not of sources)."""
    envs = [e for e in dict.fromkeys(seeded.envs + model.envs) if e in seeded.envs and e in model.envs]
    out = {env: analyse_scope(seeded.subset(np.asarray(seeded.envs) == env),
                              model.subset(np.asarray(model.envs) == env), n_boot, seed, env) for env in envs}
    if len(envs) > 1:
        out[POOLED] = analyse_scope(seeded.subset(np.isin(seeded.envs, envs)), model.subset(np.isin(model.envs, envs)),
                                    n_boot, seed, POOLED)
    return out


def prior_summary(seeded: PriorItems, model: PriorItems, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The summary.json entry: {"method", "bootstrap", "scopes": {env | pooled: ...}} (JSON-safe)."""
    scopes = analyse(seeded, model, n_boot, seed)
    out = {
        "method": ("G/token of the failed action under 'after' against its prior, lp(before) per token; bins at the "
                   "terciles of the pooled prior of both sources; gap adjusted for prior = the on_policy coefficient "
                   "of least squares G/token ~ 1 + prior + on_policy (pooled: + one intercept per environment)"),
        "bootstrap": {"n_boot": n_boot, "seed": seed, "level": CI_LEVEL,
                      "method": "percentile, items resampled within each failure source"},
        "scopes": {scope: a.to_dict() for scope, a in scopes.items()},
    }
    if not scopes:
        out["note"] = "no environment has items of both failure sources"
    assert_json_safe(out, "failure_prior")
    return out


def rows_from_logprobs(path: Path) -> list[ScoreRow]:
    """The `before` and `after` rows of a run's logprobs.jsonl (the scoring stage's record), taken as score_rows takes
    them (candidate 0's lp and token count): enough for this analysis while a run's greedy stages still go on. A
    partial last line (a killed run) is left out, as a resume would."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        for cond in (REFERENCE, CONDITION):
            scored = record["conditions"][cond]
            rows.append(ScoreRow(record["item_id"], record["env"], cond, scored["cand_lp"][0],
                                 scored["cand_n_tokens"][0], scored["cand_lp"], scored["cand_n_tokens"],
                                 scored["p"][0], scored["p_norm"][0]))
    return rows


def prior_of_run(out_dir: Path, n_boot: int | None = None, seed: int | None = None,
                 from_logprobs: bool = False) -> dict[str, Any] | None:
    """The prior analysis of a run over both failure sources from its seeded/ and model/ subfolders' stored score
    rows (or, `from_logprobs`, their scoring stage's log-probs); seed and bootstrap size default to the run's own.
    None when a source's file is missing."""
    # the store's file names only here: the maths above needs no run folder
    from fastscore.study.stages.store import CONFIG_FILE, LOGPROBS_FILE, SCORES_FILE, SUMMARY_FILE

    out_dir = Path(out_dir)
    name, read = (LOGPROBS_FILE, rows_from_logprobs) if from_logprobs else (SCORES_FILE, read_score_rows)
    if not all((out_dir / s / name).exists() for s in (SEEDED, MODEL)):
        return None
    if seed is None:
        seed = int(json.loads((out_dir / SEEDED / CONFIG_FILE).read_text(encoding="utf-8")).get("seed", 0))
    if n_boot is None:  # config.json does not keep it; a finished source's summary.json does
        summary_path = out_dir / SEEDED / SUMMARY_FILE
        summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else {}
        n_boot = next((s["bootstrap"]["n_boot"] for s in summary.values() if "bootstrap" in s), DEFAULT_N_BOOT)
    items = {s: prior_items(read(out_dir / s / name), s) for s in (SEEDED, MODEL)}
    return prior_summary(items[SEEDED], items[MODEL], n_boot, seed)
