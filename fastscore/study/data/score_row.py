"""One item under one condition: the study's per-item score row, as stored in scores.jsonl (one JSON line each).

-inf log-probs (a banned string) are stored as null, so the file stays plain JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from fastscore.errors import DataError
from fastscore.mathops import softmax
from fastscore.study.data.conditions import CONDITIONS, GAIN_UNDEFINED
from fastscore.study.data.envs import ENVS


# Fields added after rows were committed by running studies: written only where they have a value, so rows that
# have none (e.g. every seeded failure's) stay field for field what earlier code wrote.
WRITTEN_WHEN_SET = ("sampled_repeat_semantic",)


@dataclass(frozen=True)
class ScoreRow:
    """Scores of one item under one condition. lp values are natural-log sums over the scored tokens;
    candidate 0 is the failed action. -inf (a banned string) is written as null in JSON."""

    item_id: str
    env: str
    condition: str
    lp: float
    n_tokens: int
    cand_lp: tuple[float, ...]
    cand_n_tokens: tuple[int, ...]
    p_repeat: float
    p_repeat_norm: float
    greedy: str | None = None
    greedy_repeat: bool | None = None  # token for token (end-of-turn included when scored)
    greedy_success: bool | None = None
    banned_mass: float | None = None
    failure_kind: str | None = None  # the mutation kind (seeded) or "model:<runtime kind>" (on-policy)
    greedy_repeat_program: bool | None = None  # the environment's own comparison (MBPP: the extracted program)
    greedy_decoded: bool | None = None  # False: greedy read off the scoring pass's argmax chain, not decoded
    token_lp: tuple[float, ...] | None = None  # the failed action's per-token log-probs under this condition
    token_edited: tuple[bool, ...] | None = None  # per failed-action token: not shared with the correct action
    sampled_k: int | None = None  # sampled retries (temperature 1.0) from this condition's context
    sampled_repeat: int | None = None  # ... that reproduce the failed action token for token
    # The greedy completion repeats the failed action in meaning (StudyEnv.repeats_failure: tools, the same call after
    # argument normalisation; MBPP, the same failing test outcome)
    greedy_repeat_semantic: bool | None = None
    # On-policy: how the model's own attempt stopped ("end_of_turn", "action_done": the harness cut it after the
    # action while the model wrote on); None for seeded failures. With `scored_end_of_turn`, it says whether the
    # end-of-turn token scored after the action is one the model never emitted.
    action_cut: str | None = None
    scored_end_of_turn: bool | None = None
    # ... of the sampled retries, those that repeat the failed action in meaning (StudyEnv.repeats_failure, the rule
    # greedy_repeat_semantic uses)
    sampled_repeat_semantic: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cand_lp", tuple(float(x) for x in self.cand_lp))
        object.__setattr__(self, "cand_n_tokens", tuple(int(x) for x in self.cand_n_tokens))
        if self.token_lp is not None:
            object.__setattr__(self, "token_lp", tuple(float(x) for x in self.token_lp))
        if self.token_edited is not None:
            object.__setattr__(self, "token_edited", tuple(bool(x) for x in self.token_edited))
        where = f"row {self.env}/{self.item_id}/{self.condition}"
        if self.env not in ENVS:
            raise DataError(f"{where}: unknown env {self.env!r} (expected one of {ENVS})")
        if self.condition not in CONDITIONS:
            raise DataError(f"{where}: unknown condition {self.condition!r} (expected one of {CONDITIONS})")
        if math.isnan(self.lp) or (self.lp == -math.inf and self.condition not in GAIN_UNDEFINED):
            raise DataError(f"{where}: lp must be finite (got {self.lp})")
        if self.n_tokens < 1:
            raise DataError(f"{where}: n_tokens must be >= 1 (got {self.n_tokens})")
        if not self.cand_lp or len(self.cand_lp) != len(self.cand_n_tokens):
            raise DataError(f"{where}: cand_lp and cand_n_tokens must be non-empty and of equal length")
        for name in ("p_repeat", "p_repeat_norm", "banned_mass"):
            value = getattr(self, name)
            if value is not None and not (0.0 <= value <= 1.0 + 1e-6):
                raise DataError(f"{where}: {name} must be a probability (got {value})")

    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        for name in WRITTEN_WHEN_SET:
            if raw[name] is None:
                del raw[name]
        raw["lp"] = _encode_lp(self.lp)
        raw["cand_lp"] = [_encode_lp(x) for x in self.cand_lp]
        raw["cand_n_tokens"] = list(self.cand_n_tokens)
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ScoreRow":
        raw = dict(raw)
        try:
            raw["lp"] = _decode_lp(raw["lp"])
            raw["cand_lp"] = tuple(_decode_lp(x) for x in raw["cand_lp"])
            raw["cand_n_tokens"] = tuple(raw["cand_n_tokens"])
            return cls(**raw)
        except (KeyError, TypeError) as exc:
            raise DataError(f"malformed score row: {exc}") from exc


def candidate_probabilities(cand_lp: Iterable[float], cand_n_tokens: Iterable[int]) -> tuple[float, float]:
    """P(candidate 0) over the candidate set: by summed log-prob, and by per-token (length-normalised) log-prob."""
    lp = np.asarray(list(cand_lp), dtype=float)
    n = np.asarray(list(cand_n_tokens), dtype=float)
    return float(_softmax(lp)[0]), float(_softmax(lp / n)[0])


def _softmax(x: np.ndarray) -> np.ndarray:
    top = np.max(x)
    if not np.isfinite(top):
        raise DataError("every candidate has log-probability -inf")
    return softmax(x)


def _encode_lp(x: float) -> float | None:
    return None if x == -math.inf else float(x)


def _decode_lp(x: float | None) -> float:
    return -math.inf if x is None else float(x)


def read_score_rows(path: Path) -> list[ScoreRow]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(ScoreRow.from_dict(json.loads(line)))
                except (json.JSONDecodeError, DataError) as exc:
                    raise DataError(f"{path}:{number}: {exc}") from exc
    return rows
