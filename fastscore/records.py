"""Requests and results: frozen dataclasses shared by the engine, the scorer and the CLI.

Two levels. The engine (backends, trie) sees only token ids: `TokenRequest` -> `TokenScores`.
The scorer sees chat messages and continuation text: `ScoreRequest` -> `ScoreResult`, grouped per context as
`CandidateSetResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class TokenRequest:
    """Score tokens[score_from:], each given every token before it. score_from >= 1 (the first token is context)."""

    tokens: tuple[int, ...]
    score_from: int

    def __post_init__(self) -> None:
        if not 1 <= self.score_from < len(self.tokens):
            raise ValueError(f"score_from={self.score_from} must be in [1, {len(self.tokens)})")

    @property
    def n_scored(self) -> int:
        return len(self.tokens) - self.score_from


@dataclass(frozen=True, eq=False)
class TokenScores:
    """Natural-log probabilities of the scored tokens (float64) and whether each was the model's argmax."""

    logprobs: np.ndarray
    is_argmax: np.ndarray

    @property
    def total(self) -> float:
        return float(self.logprobs.sum())


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class ScoreRequest:
    """Chat messages rendered with the model's template and a generation prompt, then `continuation` as the reply."""

    id: str
    messages: tuple[Message, ...]
    continuation: str


@dataclass(frozen=True)
class CandidateSet:
    """One context and K candidate continuations scored under it (the context's prefix is computed once)."""

    id: str
    messages: tuple[Message, ...]
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class GreedyRequest:
    """Decode greedily from the context; the completion may never equal any of `banned` (compared as text)."""

    id: str
    messages: tuple[Message, ...]
    banned: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScoreResult:
    """Scored tokens are the continuation's tokens plus the template's end-of-turn token (unless excluded)."""

    request_id: str
    continuation: str
    logprob: float  # sum over scored tokens
    n_tokens: int
    token_ids: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    token_is_argmax: tuple[bool, ...]
    # 1 when a token straddled the context/continuation boundary and was scored as part of the continuation.
    boundary_straddles: int = 0
    includes_end_of_turn: bool = True

    @property
    def logprob_per_token(self) -> float:
        return self.logprob / self.n_tokens


@dataclass(frozen=True)
class CandidateSetResult:
    """K candidates scored under one context; probabilities normalised over the set."""

    id: str
    results: tuple[ScoreResult, ...]
    probs: tuple[float, ...]  # softmax of summed log-probs
    probs_per_token: tuple[float, ...]  # softmax of length-normalised log-probs


@dataclass(frozen=True)
class GreedyResult:
    """Greedy completion of one context, stopped at end-of-turn or the token limit."""

    id: str
    text: str
    token_ids: tuple[int, ...]
    stopped_by: str  # "end_of_turn" or "max_tokens"
    banned_mass: float = 0.0  # total probability mass the ban removed over the decoded steps (sum of removed p)
    banned_steps: int = 0  # decoding steps at which the ban removed any token


@dataclass
class EngineStats:
    """Counters a backend keeps, so sharing and batching are measurable (mutable: it accumulates)."""

    requested_tokens: int = 0  # sum of len(tokens) over requests
    computed_tokens: int = 0  # tokens actually fed through the model
    trie_minimal_tokens: int = 0  # distinct prefixes: the least any prefix-sharing engine must compute
    scored_tokens: int = 0
    forward_calls: int = 0  # decode / session.run / model() calls
    extra: dict = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()
