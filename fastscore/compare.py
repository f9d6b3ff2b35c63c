"""`fastscore compare A B`: how two scoring runs of the same requests differ (each a jsonl, csv or parquet output).

Requests are matched by id and candidates by index (their texts must agree). Reported: per-token |difference| of
log-probs (where both runs scored the same token ids), per-candidate differences of the summed log-prob, token-argmax
changes, candidate-argmax changes per request, and sign flips of every within-request candidate contrast
(logprob_i - logprob_j, i < j). Each proportion comes with a 95% Wilson interval. The candidates whose summed
log-prob moved most are listed for a person to look at.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from fastscore.errors import RequestError
from fastscore.mathops import wilson_interval
from fastscore.tables import read_score_rows

TEXT_WIDTH = 40  # characters of a candidate's text shown in the most-changed table


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
class ChangedCandidate:
    id: str
    index: int
    text: str
    logprob_a: float
    logprob_b: float

    @property
    def delta(self) -> float:
        return self.logprob_b - self.logprob_a


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
    most_changed: tuple[ChangedCandidate, ...] = ()  # by |B - A| of the summed log-prob, largest first

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> list[str]:
        """The most-changed candidates as an aligned text table (empty when nothing was compared)."""
        if not self.most_changed:
            return []
        rows = [(c.id, str(c.index), _clip(c.text), f"{c.logprob_a:.4f}", f"{c.logprob_b:.4f}", f"{c.delta:+.4f}")
                for c in self.most_changed]
        head = ("id", "cand", "text", "logprob A", "logprob B", "Δ (B-A)")
        widths = [max(len(r[k]) for r in (head, *rows)) for k in range(len(head))]
        fmt = lambda r: "  ".join(v.ljust(w) if k < 3 else v.rjust(w)  # noqa: E731
                                  for k, (v, w) in enumerate(zip(r, widths, strict=True)))
        return [f"most changed candidates ({len(rows)} of {self.n_candidates}):", fmt(head), *map(fmt, rows)]

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


def _clip(text: str) -> str:
    flat = " ".join(str(text).split())  # one line per candidate, whatever its newlines
    return flat if len(flat) <= TEXT_WIDTH else flat[:TEXT_WIDTH - 1] + "…"


def _by_id(path: Path) -> dict[str, list[dict]]:
    """Candidates per request id, in index order, from any format `fastscore score` writes."""
    runs: dict[str, list[dict]] = {}
    for row in read_score_rows(Path(path)):
        runs.setdefault(row["id"], []).append(row)
    return {key: sorted(rows, key=lambda r: r.get("index") or 0) for key, rows in runs.items()}


def _stats(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {"max": 0.0, "mean": 0.0, "median": 0.0, "p99": 0.0}
    return {"max": float(values.max()), "mean": float(values.mean()), "median": float(np.median(values)),
            "p99": float(np.percentile(values, 99))}


def compare_files(a: Path, b: Path, top: int = 10) -> Comparison:
    runs_a, runs_b = _by_id(Path(a)), _by_id(Path(b))
    common = [key for key in runs_a if key in runs_b]
    token_diffs, cand_diffs, changed, ids_differ = [], [], [], 0
    token_flips = token_n = best_changes = flips = pairs = n_candidates = 0
    for key in common:
        ca, cb = runs_a[key], runs_b[key]
        if [c["text"] for c in ca] != [c["text"] for c in cb]:
            raise RequestError(f"request {key!r}: the two runs scored different candidates")
        la = np.array([c["logprob"] for c in ca])
        lb = np.array([c["logprob"] for c in cb])
        n_candidates += len(ca)
        cand_diffs.extend(lb - la)
        changed.extend(ChangedCandidate(key, int(x.get("index") or k), x["text"], float(x["logprob"]),
                                        float(y["logprob"])) for k, (x, y) in enumerate(zip(ca, cb, strict=True)))
        best_changes += int(la.argmax() != lb.argmax())
        for i, j in combinations(range(len(ca)), 2):
            pairs += 1
            flips += int(np.sign(la[i] - la[j]) != np.sign(lb[i] - lb[j]))
        for x, y in zip(ca, cb, strict=True):
            if x.get("token_logprobs") is None or y.get("token_logprobs") is None:
                continue  # a table written without per-token columns: candidates only
            if "token_ids" in x and "token_ids" in y and x["token_ids"] != y["token_ids"]:
                ids_differ += 1
                continue
            if len(x["token_logprobs"]) != len(y["token_logprobs"]):
                ids_differ += 1
                continue
            token_diffs.extend(np.abs(np.subtract(y["token_logprobs"], x["token_logprobs"])))
            if x.get("token_is_argmax") is not None and y.get("token_is_argmax") is not None:
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
        most_changed=tuple(sorted(changed, key=lambda c: -abs(c.delta))[:top]),
    )
