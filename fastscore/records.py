"""Requests and results: frozen dataclasses shared by the engine, the scorer and the CLI.

Two levels. The engine (backends, trie) sees only token ids: `TokenRequest` -> `TokenScores`.
The scorer sees chat messages and continuation text: `ScoreRequest` -> `ScoreResult`, grouped per context as
`CandidateSetResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class TokenRequest:
    """Score tokens[score_from:], each given every token before it. score_from >= 1 (the first token is context)."""

    tokens: tuple[int, ...]
    score_from: int
    top_k: int = 0  # also return the k most likely tokens at each scored position

    def __post_init__(self) -> None:
        if not 1 <= self.score_from < len(self.tokens):
            raise ValueError(f"score_from={self.score_from} must be in [1, {len(self.tokens)})")

    @property
    def n_scored(self) -> int:
        return len(self.tokens) - self.score_from


@dataclass(frozen=True, eq=False)
class TokenScores:
    """Natural-log probabilities of the scored tokens (float64) and whether each was the model's argmax.

    `ranks`: 1 + the number of vocabulary tokens strictly more likely than the scored one (1 for the argmax; ties
    share a rank). `top_ids` / `top_logprobs` [n_scored, k]: the k most likely tokens at each position, best first,
    when the request asked for top_k > 0. Backends that fill none of them leave them None.
    """

    logprobs: np.ndarray
    is_argmax: np.ndarray
    ranks: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None

    @property
    def total(self) -> float:
        return float(self.logprobs.sum())


@dataclass(frozen=True)
class Message:
    """One chat message. `tool_calls` (assistant), `name` and `tool_call_id` (tool results) follow the OpenAI
    format and reach the chat template as they are (see fastscore.chat)."""

    role: str
    content: str | None  # None only beside tool_calls
    tool_calls: tuple[Any, ...] = ()
    name: str | None = None
    tool_call_id: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it: only the fields that are set."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True)
class ScoreRequest:
    """Chat messages rendered with the model's template and a generation prompt, then `continuation` as the reply.

    With `prompt` set instead (raw text), no template is used: the scored text is `continuation` right after
    `prompt`, and no end-of-turn token is scored. `tools` (JSON schemas) go to templates that accept them.
    With `continuation_ids`, the continuation is those token ids right after the context as greedy decoding renders
    it (generation prompt included), not `continuation` re-tokenised: the tokens a model emitted, scored as emitted
    (`continuation` is then their decoded text). `end_of_turn` overrides the scorer's include_end_of_turn for this
    request (None: the scorer's).
    """

    id: str
    messages: tuple[Message, ...]
    continuation: str
    tools: tuple[Any, ...] = ()
    prompt: str | None = None
    continuation_ids: tuple[int, ...] | None = None
    end_of_turn: bool | None = None


@dataclass(frozen=True)
class EmittedContinuation:
    """A candidate given as the token ids a model emitted after the context (scored as they are, not re-tokenised
    from its text) and whether the model's end-of-turn token followed them (then it is scored after them)."""

    text: str  # the ids decoded: what results and transcripts show
    token_ids: tuple[int, ...]
    end_of_turn: bool


@dataclass(frozen=True)
class CandidateSet:
    """One context and K candidate continuations scored under it (the context's prefix is computed once); a
    candidate is a text or the token ids a model emitted (EmittedContinuation)."""

    id: str
    messages: tuple[Message, ...]
    candidates: tuple[str | EmittedContinuation, ...]
    tools: tuple[Any, ...] = ()
    prompt: str | None = None  # raw text instead of messages (see ScoreRequest)

    def score_requests(self) -> list[ScoreRequest]:
        """One request per candidate, in order."""
        return [ScoreRequest(self.id, self.messages, c.text, self.tools, self.prompt, continuation_ids=c.token_ids,
                             end_of_turn=c.end_of_turn) if isinstance(c, EmittedContinuation)
                else ScoreRequest(self.id, self.messages, c, self.tools, self.prompt) for c in self.candidates]


@dataclass(frozen=True)
class GreedyRequest:
    """Decode greedily from the context; the completion may never equal any of `banned` (compared as text; with
    `ban_prefix`, never start with one)."""

    id: str
    messages: tuple[Message, ...]
    banned: tuple[str, ...] = ()
    tools: tuple[Any, ...] = ()
    prompt: str | None = None  # raw text instead of messages: its continuation is decoded, no template involved
    max_new_tokens: int | None = None  # this request's token budget (None: the call's; never more than the call's)
    # The environment's "action written" rule (fastscore.decode.ActionDone): once it holds for the completion's text,
    # one more token decides between END_OF_TURN and ACTION_DONE. None: decode to end-of-turn or the budget.
    action_done: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)
    ban_prefix: bool = False
    # Token ids the completion begins with, taken as given: they are prefilled with the context and decoding goes on
    # after them (the budget and the action rule count them; a ban or sampling acts only on the tokens decoded after
    # them; a stop token among them ends the completion there). The study passes a greedy completion of the same
    # context decoded before (stages.onpolicy.KnownAttempts), on a backend whose steps give the bits of a prefill
    # (Backend.steps_match_prefill), so the result is the one decoding again would give.
    start_ids: tuple[int, ...] = ()


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
    token_texts: tuple[str, ...] = ()  # each scored token's text piece
    token_ranks: tuple[int, ...] = ()  # see TokenScores.ranks
    # With top_k: per scored token, the k most likely (token id, text piece, log-prob), best first.
    top_k: tuple[tuple[tuple[int, str, float], ...], ...] = ()
    index: int = 0  # the candidate's place in its set

    @property
    def logprob_per_token(self) -> float:
        return self.logprob / self.n_tokens

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (lists for tuples), with logprob_per_token."""
        out = asdict(self)
        out["logprob_per_token"] = self.logprob_per_token
        out["top_k"] = [[{"id": i, "token": t, "logprob": lp} for i, t, lp in position] for position in self.top_k]
        return {key: list(value) if isinstance(value, tuple) else value for key, value in out.items()}


@dataclass(frozen=True)
class CandidateSetResult:
    """K candidates scored under one context; probabilities normalised over the set."""

    id: str
    results: tuple[ScoreResult, ...]
    probs: tuple[float, ...]  # softmax of summed log-probs
    probs_per_token: tuple[float, ...]  # softmax of length-normalised log-probs

    def to_dict(self) -> dict[str, Any]:
        """{"id", "candidates": [each result's to_dict() with its "prob" and "prob_per_token"]}."""
        return {"id": self.id, "candidates": [
            {**result.to_dict(), "prob": prob, "prob_per_token": prob_per_token}
            for result, prob, prob_per_token in zip(self.results, self.probs, self.probs_per_token, strict=True)]}


@dataclass(frozen=True)
class GreedyResult:
    """Greedy completion of one context, stopped at end-of-turn, the token limit or its action_done rule."""

    id: str
    text: str
    token_ids: tuple[int, ...]
    stopped_by: str  # "end_of_turn", "max_tokens" or "action_done" (see fastscore.decode)
    banned_mass: float = 0.0  # total probability mass the ban removed over the decoded steps (sum of removed p)
    banned_steps: int = 0  # decoding steps at which the ban removed any token

    def to_dict(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}


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
