"""Study metrics: per-item score rows in, corrective gains with paired bootstrap CIs out (pure numpy).

Missing values are NaN only inside this module and stats.py; `summarize` emits absent keys with a reason
instead, and checks that its output holds no NaN or infinity.
"""

from __future__ import annotations

import logging
import math
import zlib
from typing import Any, Iterable

import numpy as np

from fastscore.errors import DataError
from fastscore.study.data.conditions import (  # the study's vocabulary, re-exported for the tables' readers
    CLEAN_RETRY_SEEDED,
    CONDITIONS,
    GAIN_CONDITIONS,
    GAIN_UNDEFINED,
    REFERENCE,
    REMEDIES,
    SAME_AS_REFERENCE,
)
from fastscore.study.data.envs import ENVS
from fastscore.study.analysis.control import by_kind, copy_control, pooled, without_name_typos
from fastscore.study.analysis.label import (
    SATURABLE, as_cut_contrasts, clean_retry_contrasts, label_contrasts, saturation_flags,
)
from fastscore.study.analysis.power import SATURATED, power_fields
from fastscore.study.analysis.table import EnvTable  # re-exported: the tables summarize builds
from fastscore.study.analysis.stats import (  # re-exported: the maths is part of this module's public API
    CI_LEVEL,
    Estimate,
    assert_json_safe,
    bootstrap_ci,
    bootstrap_means,
    corrective_gain,
    odds_factor,
    present_count,
    ratio_ci,
    resample_indices,
    share_removed,
    wilson_ci,
    wilson_interval,
)
from fastscore.study.data.score_row import (  # re-exported: the rows summarize reads
    ScoreRow,
    candidate_probabilities,
    read_score_rows,
)

log = logging.getLogger(__name__)

POOLED = "pooled"  # the summary's key for estimates over the items of every environment together

__all__ = [
    "CI_LEVEL", "CONDITIONS", "ENVS", "GAIN_CONDITIONS", "GAIN_UNDEFINED", "REFERENCE", "REMEDIES", "SAME_AS_REFERENCE",
    "EnvTable", "Estimate", "ScoreRow", "assert_json_safe", "bootstrap_ci", "bootstrap_means", "build_tables",
    "candidate_probabilities", "corrective_gain", "odds_factor", "present_count", "ratio_ci", "read_score_rows",
    "resample_indices", "share_removed", "summarize",
]

GAIN_METRICS = ("gain", "gain_per_token", "odds_factor", "share_negative")
# Per-item 0/1 outcomes: their share gets a Wilson interval, never a percentile bootstrap (which collapses at 0 and 1).
BINARY_METRICS = ("greedy_repeat", "greedy_repeat_program", "greedy_repeat_semantic", "greedy_success")
# Shares of the samples under a condition: rate metric -> the ScoreRow count it divides by sampled_k (token for token,
# in meaning).
SAMPLED_RATES = {"sampled_repeat_rate": "sampled_repeat", "sampled_repeat_semantic_rate": "sampled_repeat_semantic"}
ROW_METRICS = ("p_repeat", "p_repeat_norm", *BINARY_METRICS, "banned_mass", "p_sample_repeat", *SAMPLED_RATES)
TABLE_COLUMNS = ("lp", "n_tokens", "correct_lp", "correct_n", "alt_lp", "alt_lp_per_token", "sampled_k",
                 *SAMPLED_RATES.values(), "lp_as_cut", "n_as_cut", "cut_before_end_of_turn") + ROW_METRICS


# ---------------------------------------------------------------- per-env tables


def _as_float(x: float | bool | None) -> float:
    return np.nan if x is None else float(x)


def _derived(row: ScoreRow, name: str) -> float:
    """A table column of one row: a ScoreRow field, or one computed from its fields."""
    if name == "correct_lp":
        return row.cand_lp[1] if len(row.cand_lp) > 1 and math.isfinite(row.cand_lp[1]) else np.nan
    if name == "correct_n":
        return float(row.cand_n_tokens[1]) if len(row.cand_n_tokens) > 1 else np.nan
    if name in ("alt_lp", "alt_lp_per_token"):  # the other wrong candidates (never shown): their mean
        alts = [(lp, n) for lp, n in zip(row.cand_lp[2:], row.cand_n_tokens[2:]) if math.isfinite(lp)]
        if not alts:
            return np.nan
        return float(np.mean([lp if name == "alt_lp" else lp / n for lp, n in alts]))
    if name in ("lp_as_cut", "n_as_cut", "cut_before_end_of_turn"):
        return _as_cut(row, name)
    if name == "p_sample_repeat":  # P(a temperature-1 sample is the failed action, token for token) = exp(lp)
        return math.exp(row.lp) if row.condition not in GAIN_UNDEFINED else np.nan
    if name in SAMPLED_RATES:
        count = getattr(row, SAMPLED_RATES[name])
        return np.nan if not row.sampled_k or count is None else count / row.sampled_k
    return _as_float(getattr(row, name))


def _as_cut(row: ScoreRow, name: str) -> float:
    """The failed action scored up to the harness's cut: where the model's own attempt was cut after its action
    (it did not end its turn) the scored end-of-turn token was never emitted, so it is dropped — under every
    condition alike. Elsewhere the action as scored."""
    dropped = (row.action_cut not in (None, "end_of_turn") and bool(row.scored_end_of_turn)
               and row.token_lp is not None and len(row.token_lp) == row.n_tokens and row.n_tokens > 1)
    if name == "cut_before_end_of_turn":
        return float(dropped)
    if name == "n_as_cut":
        return float(row.n_tokens - dropped)
    return row.lp - row.token_lp[-1] if dropped else row.lp


def _measured(row: ScoreRow) -> bool:
    """clean_retry is a measurement only with sampled retries (on-policy failures); otherwise its messages are
    before's and every number of it holds by construction, so its rows are left out of the tables."""
    return row.condition != "clean_retry" or bool(row.sampled_k)


def build_tables(rows: Iterable[ScoreRow]) -> dict[str, EnvTable]:
    by_env: dict[str, dict[tuple[str, str], ScoreRow]] = {}
    for row in rows:
        if not _measured(row):
            continue
        cell = by_env.setdefault(row.env, {})
        key = (row.item_id, row.condition)
        if key in cell:
            raise DataError(f"duplicate score row for {row.env}/{row.item_id}/{row.condition}")
        cell[key] = row
    tables = {}
    for env in sorted(by_env, key=lambda e: (ENVS.index(e), e)):
        cell = by_env[env]
        ids = tuple(sorted({item for item, _ in cell}))
        pos = {item: i for i, item in enumerate(ids)}
        columns: dict[str, dict[str, np.ndarray]] = {}
        tokens: dict[str, list[tuple[np.ndarray, np.ndarray] | None]] = {}
        kinds = [""] * len(ids)
        for cond in CONDITIONS:
            members = [(pos[item], row) for (item, c), row in cell.items() if c == cond]
            if not members:
                continue
            cols = {name: np.full(len(ids), np.nan) for name in TABLE_COLUMNS}
            toks: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(ids)
            for i, row in members:
                for name in cols:
                    cols[name][i] = _derived(row, name)
                if row.token_lp is not None and row.token_edited is not None:
                    toks[i] = (np.asarray(row.token_lp, dtype=float), np.asarray(row.token_edited, dtype=bool))
                kinds[i] = kinds[i] or (row.failure_kind or "")
            columns[cond] = cols
            tokens[cond] = toks
        tables[env] = EnvTable(env, ids, columns, tokens, tuple(kinds))
    return tables


# ---------------------------------------------------------------- summary


def summarize(rows: Iterable[ScoreRow], seed: int = 0, n_boot: int = 2000) -> dict[str, Any]:
    """{env: {n_items, conditions, decomposition, remedies, ...}}: JSON-safe (no NaN/inf; absent keys carry reasons)."""
    tables = build_tables(rows)
    if not tables:
        raise DataError("no score rows to summarise")
    summary: dict[str, Any] = {env: _summarize_env(table, seed, n_boot) for env, table in tables.items()}
    if len(tables) > 1:
        summary[POOLED] = pooled(list(tables.values()), seed, n_boot)
    assert_json_safe(summary)
    return summary


def _summarize_env(table: EnvTable, seed: int, n_boot: int) -> dict[str, Any]:
    # crc32, not hash(): str hashes are salted per process and the CIs must be reproducible.
    idx = resample_indices(len(table.item_ids), n_boot, [seed, zlib.crc32(table.env.encode())])
    log.info("summarising %s: %d items, %d resamples", table.env, len(table.item_ids), n_boot)
    return {
        "n_items": len(table.item_ids),
        "conditions_present": {c: int(table.present(c).sum()) for c in CONDITIONS if table.has(c)},
        "bootstrap": {"n_boot": n_boot, "seed": seed, "level": CI_LEVEL, "method": "percentile, items resampled"},
        "conditions": {c: _condition_metrics(table, c, idx) for c in CONDITIONS if table.has(c)},
        "decomposition": _decomposition(table, idx),
        "remedies": _remedies(table, idx),
        "label": label_contrasts(table, idx),
        **({"clean_retry": retry} if (retry := clean_retry_contrasts(table, idx)) else {}),
        **({"as_cut": cut} if (cut := as_cut_contrasts(table, idx)) else {}),
        "by_kind": by_kind(table, seed, n_boot),
        "without_name_typos": without_name_typos(table, seed, n_boot),
    }


def _condition_metrics(table: EnvTable, cond: str, idx: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    missing: dict[str, str] = {}
    if cond == REFERENCE:
        missing.update(dict.fromkeys(GAIN_METRICS, "reference condition: G(before) = 0 by definition"))
    elif cond in GAIN_UNDEFINED:
        missing.update(dict.fromkeys(GAIN_METRICS, f"not applicable: {GAIN_UNDEFINED[cond]}"))
    elif cond in SAME_AS_REFERENCE:
        missing.update(dict.fromkeys(GAIN_METRICS, f"by construction: {SAME_AS_REFERENCE[cond]}"))
    else:
        gain = table.gain(cond)
        if present_count(gain) == 0:
            missing.update(dict.fromkeys(GAIN_METRICS, f"no item has both {REFERENCE!r} and {cond!r}"))
        else:
            per_token_values = gain / table.column(cond, "n_tokens")
            per_token = bootstrap_ci(per_token_values, idx)
            out["gain"] = {**bootstrap_ci(gain, idx).to_dict(), **power_fields(gain)}
            out["gain_per_token"] = {**per_token.to_dict(), **power_fields(per_token_values)}
            out["odds_factor"] = odds_factor(per_token).to_dict()
            out["share_negative"] = wilson_ci(np.where(np.isnan(gain), np.nan, gain < 0)).to_dict()
            out.update(copy_control(table, cond, idx))
    for name in ROW_METRICS:
        values = table.column(cond, name)
        if present_count(values) == 0:
            missing[name] = f"not recorded for {cond!r}"
        elif name in BINARY_METRICS:
            out[name] = wilson_ci(values).to_dict()
        else:
            out[name] = bootstrap_ci(values, idx).to_dict()
    for name, count in SAMPLED_RATES.items():
        if name in out:
            out[name] = sampled_share(table, cond, count).to_dict()
    for name, bound in saturation_flags(table, cond, SATURABLE).items():
        if name in out:
            out[name]["saturated"] = f"{SATURATED} (every item at the {bound} bound)"
    if missing:
        out["not_applicable"] = missing
    return out


def sampled_share(table: EnvTable, cond: str, count: str = "sampled_repeat") -> Estimate:
    """The share of all samples under `cond` that repeat the failed action (`count`: token for token, or in meaning with
    "sampled_repeat_semantic"), with its Wilson interval.

    Every item has the same k, so the share equals the mean of the per-item shares; a percentile bootstrap of those
    collapses to [0, 0] when no sample repeats, Wilson does not. n counts samples, which within one item are not
    independent: the interval is a floor on the uncertainty.
    """
    k = table.column(cond, "sampled_k")
    repeats = table.column(cond, count)
    n, hits = int(np.nansum(k)), int(np.nansum(repeats))
    if n == 0:
        raise DataError(f"no sampled retries recorded for {cond!r}")
    lo, hi = wilson_interval(hits, n)
    return Estimate(hits / n, lo, hi, n, note=f"Wilson score interval over all {n} samples ({hits} repeat)")


def _masked(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, values, np.nan)


def _needs(table: EnvTable, conds: tuple[str, ...]) -> tuple[np.ndarray, str]:
    mask = np.logical_and.reduce([table.present(c) for c in conds])
    return mask, "items with " + " and ".join(repr(c) for c in conds)


def _ratio_or_reason(num: np.ndarray, den: np.ndarray, idx: np.ndarray) -> Estimate | str:
    if float(np.nanmean(den)) == 0.0:
        return "the denominator's mean is exactly 0"
    return ratio_ci(num, den, idx)


def _decomposition(table: EnvTable, idx: np.ndarray) -> dict[str, Any]:
    """Surface part G(neutral) and semantic parts; each identity is computed on one common item set."""
    out: dict[str, Any] = {}
    missing: dict[str, str] = {}
    mask, who = _needs(table, (REFERENCE, "after", "neutral"))
    out["items_neutral_set"] = who
    if mask.any():
        g_after, g_neutral = _masked(table.gain("after"), mask), _masked(table.gain("neutral"), mask)
        out["gain_after"] = bootstrap_ci(g_after, idx).to_dict()
        out["surface"] = bootstrap_ci(g_neutral, idx).to_dict()
        out["semantic_vs_neutral"] = {**bootstrap_ci(g_after - g_neutral, idx).to_dict(),
                                      **power_fields(g_after - g_neutral)}
        share = _ratio_or_reason(g_neutral, g_after, idx)
        if isinstance(share, str):
            missing["surface_share"] = share
        else:
            out["surface_share"] = share.to_dict()
    else:
        for key in ("gain_after", "surface", "semantic_vs_neutral", "surface_share"):
            missing[key] = f"no {who}"
    mask, who = _needs(table, (REFERENCE, "after", "success"))
    out["items_success_set"] = who
    if mask.any():
        g_after, g_success = _masked(table.gain("after"), mask), _masked(table.gain("success"), mask)
        out["gain_after_success_set"] = bootstrap_ci(g_after, idx).to_dict()
        out["semantic_vs_success"] = {**bootstrap_ci(g_after - g_success, idx).to_dict(),
                                      **power_fields(g_after - g_success)}
    else:
        missing["gain_after_success_set"] = missing["semantic_vs_success"] = f"no {who}"
    if missing:
        out["not_applicable"] = missing
    return out


def _remedies(table: EnvTable, idx: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for remedy in REMEDIES:
        if remedy in SAME_AS_REFERENCE:
            reason = SAME_AS_REFERENCE[remedy] if table.has(remedy) else CLEAN_RETRY_SEEDED
            out[remedy] = {"not_applicable": dict.fromkeys(("gain", "gain_after", "share_removed"), reason)}
            continue
        mask, who = _needs(table, (REFERENCE, "after", remedy))
        if not mask.any():
            out[remedy] = {"not_applicable": dict.fromkeys(("gain", "gain_after", "share_removed"), f"no {who}")}
            continue
        g_remedy, g_after = _masked(table.gain(remedy), mask), _masked(table.gain("after"), mask)
        entry: dict[str, Any] = {
            "gain": bootstrap_ci(g_remedy, idx).to_dict(),
            "gain_after": bootstrap_ci(g_after, idx).to_dict(),
        }
        ratio = _ratio_or_reason(g_remedy, g_after, idx)
        if isinstance(ratio, str):
            entry["not_applicable"] = {"share_removed": ratio}
        else:
            entry["share_removed"] = share_removed(ratio).to_dict()
        out[remedy] = entry
    for cond, reason in GAIN_UNDEFINED.items():
        if table.has(cond):
            # Its effect shows in P(repeat), greedy metrics and banned mass under conditions[cond].
            out[cond] = {"not_applicable": dict.fromkeys(("gain", "gain_after", "share_removed"), reason)}
    return out
