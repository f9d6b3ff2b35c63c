"""The harness-realism checks (fastscore.study.stages.sensitivity) summarised: does the inversion depend on how the
harness writes the failure record?

Each is reported as a change on the headline, paired per item on the items where the check applies: G per token of
the failed action, and the copy control ΔG per token = G(failed)/n(failed) - G(correct)/n(correct); each change also
as a share of the study's value on the same items (mean change / mean study value, bootstrap CI).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastscore.study.analysis.metrics import POOLED
from fastscore.study.analysis.stats import bootstrap_ci, ratio_ci, resample_indices
from fastscore.study.stages.sensitivity import CHECKS, DESCRIPTIONS, NOT_APPLICABLE
from fastscore.study.stages.store import StudyStore


def _gains(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[float, float]:
    """(G per token of the failed action, ΔG per token = that minus the correct action's G per token)."""
    per = [(before["cand_lp"][k] - after["cand_lp"][k]) / after["cand_n_tokens"][k] for k in (0, 1)]
    return per[0], per[0] - per[1]


def _paired(default: Mapping[str, list[dict]], records: Sequence[dict], check: str
            ) -> tuple[np.ndarray, np.ndarray, Counter]:
    """Per applicable item: [default G/tok, check G/tok] and [default ΔG/tok, check ΔG/tok]; reasons of the rest."""
    gains, deltas, reasons = [], [], Counter()
    for record in records:
        entry = record["checks"][check]
        if NOT_APPLICABLE in entry:
            reasons[entry[NOT_APPLICABLE]] += 1
            continue
        conds = default[record["item_id"]][0]["conditions"]
        d_gain, d_delta = _gains(conds["before"], conds["after"])
        v_gain, v_delta = _gains(entry["sets"].get("before", conds["before"]), entry["sets"]["after"])
        gains.append((d_gain, v_gain))
        deltas.append((d_delta, v_delta))
    shape = (len(gains), 2)
    return np.asarray(gains, dtype=float).reshape(shape), np.asarray(deltas, dtype=float).reshape(shape), reasons


def _check_summary(gains: np.ndarray, deltas: np.ndarray, reasons: Counter, idx_seed: list[int], n_boot: int
                   ) -> dict[str, Any]:
    out: dict[str, Any] = {"n_items": len(gains), "n_not_applicable": sum(reasons.values()),
                           "not_applicable_reasons": dict(reasons)}
    if not len(gains):
        out[NOT_APPLICABLE] = "; ".join(sorted(reasons)) or "no item"
        return out
    idx = resample_indices(len(gains), n_boot, idx_seed)
    for name, pair in (("gain_per_token", gains), ("delta_gain_per_token", deltas)):
        change = pair[:, 1] - pair[:, 0]
        out[name] = {"default": bootstrap_ci(pair[:, 0], idx).to_dict(),
                     "check": bootstrap_ci(pair[:, 1], idx).to_dict(),
                     "change": bootstrap_ci(change, idx).to_dict()}
        # The change as a share of the study's value, quoted in the Reading: a ratio, so with its CI (same resamples).
        if pair[:, 0].mean() != 0.0:
            out[name]["relative_change"] = ratio_ci(change, pair[:, 0], idx).to_dict()
    return out


def summarize_sensitivity(default: Mapping[str, list[dict]], records: Sequence[dict], envs: Sequence[str],
                          seed: int, n_boot: int) -> dict[str, dict[str, Any]]:
    """{env or "pooled": {check: summary}} from the study's logprobs records and the checks' records."""
    by_env = {env: [r for r in records if r["env"] == env and r["item_id"] in default] for env in envs}
    by_env = {env: rs for env, rs in by_env.items() if rs}
    out: dict[str, dict[str, Any]] = {}
    groups = dict(by_env)
    if len(by_env) > 1:
        groups[POOLED] = [r for rs in by_env.values() for r in rs]
    for group, rs in groups.items():
        out[group] = {}
        for check in CHECKS:
            gains, deltas, reasons = _paired(default, rs, check)
            summary = _check_summary(gains, deltas, reasons, [seed, zlib.crc32(f"{group}:{check}".encode())], n_boot)
            out[group][check] = {"description": DESCRIPTIONS[check], **summary}
    return out


def attach_sensitivity(summary: dict[str, Any], store: StudyStore, seed: int, n_boot: int) -> None:
    """Each environment's (and the pooled) summary gets its "sensitivity" entry, from the stored records."""
    records = [r for rs in store.sensitivity().load().values() for r in rs]
    envs = [env for env in summary if env != POOLED]
    checks = summarize_sensitivity(store.logprobs().load(), records, envs, seed, n_boot)
    for group, by_check in checks.items():
        if group in summary:
            summary[group]["sensitivity"] = by_check
