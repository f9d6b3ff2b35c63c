"""`fastscore compare A.jsonl B.jsonl`: how two scoring runs of the same requests differ.

Requests are matched by id and candidates by index (their texts must agree). Reported: per-token |difference| of
log-probs (where both runs scored the same token ids), per-candidate differences of the summed log-prob, token-argmax
changes, candidate-argmax changes per request, and sign flips of every within-request candidate contrast
(logprob_i - logprob_j, i < j). Each proportion comes with a 95% Wilson interval.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from fastscore.errors import RequestError
from fastscore.mathops import wilson_interval


@dataclass(frozen=True)
class Proportion:
    count: int
    n: int
    low: float
    high: float

    @classmethod
    def of(cls, count: int, n: int) -> "Proportion":
        return cls(count, n, *wilson_interval(count, n))

    def line(self) -> str:
        share = f"{self.count / self.n:.1%}" if self.n else "-"
        return f"{self.count}/{self.n} ({share}, 95% CI {self.low:.1%}-{self.high:.1%})"


@dataclass(frozen=True)
class Comparison:
    n_requests: int
    n_candidates: int
    n_tokens: int  # tokens compared (candidates with identical token ids in both runs)
    token_ids_differ: int  # candidates whose scored token ids differ (another tokenizer or template)
    token_abs_diff: dict[str, float]  # max, mean, median, p99 of per-token |B - A| (nats)
    candidate_diff: dict[str, float]  # mean and max |B - A| of summed log-probs, mean signed B - A
    token_argmax_changes: Proportion
    candidate_argmax_changes: Proportion  # per request: the most likely candidate differs
    contrast_sign_flips: Proportion  # per candidate pair within a request
    only_in_a: int
    only_in_b: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        t, c = self.token_abs_diff, self.candidate_diff
        return [
            f"{self.n_requests} requests, {self.n_candidates} candidates, {self.n_tokens} tokens compared"
            + (f"; {self.only_in_a} requests only in A, {self.only_in_b} only in B" if self.only_in_a or self.only_in_b
               else ""),
            f"per-token |B-A| (nats): max {t['max']:.3g}, mean {t['mean']:.3g}, median {t['median']:.3g}, "
            f"p99 {t['p99']:.3g}" + (f" ({self.token_ids_differ} candidates with other token ids left out)"
                                     if self.token_ids_differ else ""),
            f"per-candidate summed log-prob: mean |B-A| {c['mean_abs']:.3g}, max {c['max_abs']:.3g}, "
            f"mean B-A {c['mean_signed']:+.3g}",
            f"token argmax changes: {self.token_argmax_changes.line()}",
            f"best candidate changes: {self.candidate_argmax_changes.line()}",
            f"candidate contrast sign flips: {self.contrast_sign_flips.line()}",
        ]


def _lines(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                yield {"id": line["id"], "candidates": list(line["candidates"])}
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise RequestError(f"{path}: not a fastscore score output line ({exc})", line=number) from None


def _by_id(path: Path) -> dict[str, dict]:
    return {str(line["id"]): line for line in _lines(path)}


def _stats(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {"max": 0.0, "mean": 0.0, "median": 0.0, "p99": 0.0}
    return {"max": float(values.max()), "mean": float(values.mean()), "median": float(np.median(values)),
            "p99": float(np.percentile(values, 99))}


def compare_files(a: Path, b: Path) -> Comparison:
    runs_a, runs_b = _by_id(Path(a)), _by_id(Path(b))
    common = [key for key in runs_a if key in runs_b]
    token_diffs, cand_diffs, ids_differ = [], [], 0
    token_flips = token_n = best_changes = flips = pairs = n_candidates = 0
    for key in common:
        ca, cb = runs_a[key]["candidates"], runs_b[key]["candidates"]
        if [c["text"] for c in ca] != [c["text"] for c in cb]:
            raise RequestError(f"request {key!r}: the two runs scored different candidates")
        la = np.array([c["logprob"] for c in ca])
        lb = np.array([c["logprob"] for c in cb])
        n_candidates += len(ca)
        cand_diffs.extend(lb - la)
        best_changes += int(la.argmax() != lb.argmax())
        for i, j in combinations(range(len(ca)), 2):
            pairs += 1
            flips += int(np.sign(la[i] - la[j]) != np.sign(lb[i] - lb[j]))
        for x, y in zip(ca, cb, strict=True):
            if "token_ids" in x and "token_ids" in y and x["token_ids"] != y["token_ids"]:
                ids_differ += 1
                continue
            if len(x["token_logprobs"]) != len(y["token_logprobs"]):
                ids_differ += 1
                continue
            token_diffs.extend(np.abs(np.subtract(y["token_logprobs"], x["token_logprobs"])))
            token_n += len(x["token_is_argmax"])
            token_flips += int(np.sum(np.asarray(x["token_is_argmax"]) != np.asarray(y["token_is_argmax"])))
    cand = np.asarray(cand_diffs, dtype=np.float64)
    return Comparison(
        n_requests=len(common), n_candidates=n_candidates, n_tokens=len(token_diffs), token_ids_differ=ids_differ,
        token_abs_diff=_stats(np.asarray(token_diffs, dtype=np.float64)),
        candidate_diff={"mean_abs": float(np.abs(cand).mean()) if len(cand) else 0.0,
                        "max_abs": float(np.abs(cand).max()) if len(cand) else 0.0,
                        "mean_signed": float(cand.mean()) if len(cand) else 0.0},
        token_argmax_changes=Proportion.of(token_flips, token_n),
        candidate_argmax_changes=Proportion.of(best_changes, len(common)),
        contrast_sign_flips=Proportion.of(flips, pairs),
        only_in_a=len(runs_a) - len(common), only_in_b=len(runs_b) - len(common),
    )
