"""The backend contract: the base class owns validation, stats and the logits -> scores mapping; a backend writes
one hook, `_logits`, that computes the logits rows predicting each request's scored tokens.

A backend knows token ids only: no text, no chat templates (the scorer owns tokenization).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from fastscore.engine.plan import Gather
from fastscore.engine.trie import distinct_prefix_count
from fastscore.errors import ContextTooLongError, ModelLoadError, RequestError, UnsupportedError
from fastscore.records import EngineStats, TokenRequest, TokenScores


class Decoder(abc.ABC):
    """Incremental next-token logits for a batch of sequences, for greedy decoding.

    `start` feeds the contexts (sharing their prefixes where the backend can) and returns the next-token logits
    of each; `step` appends one token to each still-active sequence and returns their next logits. A sequence left
    out of a step is finished: it may not come back. Misuse (a step before start, mismatched lists, a sequence not
    started) raises ValueError in every backend.
    """

    @abc.abstractmethod
    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 [len(contexts), n_vocab]."""

    @abc.abstractmethod
    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Append tokens[i] to sequence active[i] (indices into the start contexts); float32 [len(active), n_vocab]."""

    # Sequences may join between steps (reserve_slots, then join_step): one decoder session keeps its batch full
    # while contexts wait, instead of each batch of contexts stepping on for its longest member alone. A decoder
    # without it is started once per batch by its caller.
    refills: ClassVar[bool] = False

    def reserve_slots(self, slots: int, longest: int) -> int:
        """Before start() of a refilling decoder: room for up to `slots` live sequences, none longer than `longest`
        tokens (context and generated tokens together). Returns the slots granted (memory may allow fewer, at least
        one)."""
        raise UnsupportedError(f"{type(self).__name__} cannot take sequences between steps")

    def join_step(self, active: Sequence[int], tokens: Sequence[int],
                  joining: Sequence[Sequence[int]]) -> np.ndarray:
        """step(active, tokens), and the `joining` contexts started as new sequences, numbered on after every
        sequence started so far: float32 [len(active) + len(joining), n_vocab], active rows first."""
        raise UnsupportedError(f"{type(self).__name__} cannot take sequences between steps")

    def close(self) -> None:
        """Free per-decode state (KV cache)."""

    def __enter__(self) -> "Decoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_step(active: Sequence[int], tokens: Sequence[int]) -> None:
    """The decoder-misuse check every Decoder.step shares."""
    if len(active) != len(tokens) or len(set(active)) != len(active):
        raise ValueError(f"step needs distinct sequences, one token each (got {len(active)} sequences, "
                         f"{len(tokens)} tokens)")


class Backend(abc.ABC):
    """Public methods are final: they validate every request once, account the stats and map logits rows to scores
    or log-softmax rows. A backend implements `_logits` (and `_decoder` if it decodes, `_release` if it holds native
    resources)."""

    name: ClassVar[str]
    context_option: ClassVar[str | None] = None  # the option that sets n_ctx, named in "context too long" errors
    # Whether set_threads() changes the CPU threads of an open backend (its results do not depend on them).
    threads_adjustable: ClassVar[bool] = False
    # Whether a decoding step gives a context's next-token logits to the bit of a prefill of it, in any batch: then a
    # completion's tokens may be prefilled instead of stepped (GreedyRequest.start_ids) without changing what follows.
    steps_match_prefill: bool = False

    n_ctx: int
    n_ctx_train: int | None = None  # the context the model was trained on, where the weights say it
    n_vocab: int

    def __init__(self, path: Path, n_threads: int | None = None) -> None:
        self.path = Path(path)
        self.n_threads = n_threads
        self.stats = EngineStats()
        self._closed = False

    # --- the one hook ---

    @abc.abstractmethod
    def _logits(self, requests: Sequence[TokenRequest]) -> Iterator[tuple[Gather, np.ndarray]]:
        """Logits rows [n, n_vocab] with the Gather saying which rows predict which request's scored tokens.

        Every request must be covered by exactly one yielded Gather. Requests arrive validated (length, vocabulary)
        and accounted (requested, scored and distinct-prefix tokens); computed tokens and forward calls are the
        backend's to count.
        """

    # --- the public contract (template methods) ---

    def score_tokens(self, requests: Sequence[TokenRequest]) -> list[TokenScores]:
        """Log-probs of each request's scored tokens, in request order. Sequences longer than n_ctx are an error."""
        out: list[TokenScores | None] = [None] * len(requests)
        for gather, logits in self._admitted(requests):
            for index, scores in zip(gather.members, gather.scores(logits), strict=True):
                out[index] = scores
        return self._complete(out)

    def logprob_rows(self, requests: Sequence[TokenRequest]) -> list[np.ndarray]:
        """float64 [n_scored, n_vocab] log-softmax rows predicting each request's scored tokens (for KL divergence)."""
        out: list[np.ndarray | None] = [None] * len(requests)
        for gather, logits in self._admitted(requests):
            for index, rows in zip(gather.members, gather.log_softmax(logits), strict=True):
                out[index] = rows
        return self._complete(out)

    def decoder(self, max_new_tokens: int) -> Decoder:
        """A greedy decoder for up to `max_new_tokens` steps per sequence (KV caches may be sized by it)."""
        self._require_open()
        if max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
        return self._decoder(max_new_tokens)

    def _decoder(self, max_new_tokens: int) -> Decoder:
        raise UnsupportedError(f"backend {self.name!r} does not support greedy decoding")

    def set_threads(self, n_threads: int) -> None:
        """CPU threads of the calls from now on (only where `threads_adjustable`)."""
        raise UnsupportedError(f"backend {self.name!r} cannot change its threads once open")

    def count_forward(self, n_tokens: int) -> None:
        """One forward pass over n_tokens tokens: the engine's own share of the stats."""
        self.stats.computed_tokens += int(n_tokens)
        self.stats.forward_calls += 1

    def check_tokens(self, tokens: Sequence[int], where: str, limit: int | None = None,
                     request_id: object = None) -> None:
        """ContextTooLongError beyond `limit` tokens (default n_ctx), RequestError for an id outside the vocabulary;
        either names `request_id` where given (a study isolates the item it belongs to)."""
        limit = self.n_ctx if limit is None else limit
        if len(tokens) > limit:
            allowed = "" if limit == self.n_ctx else f" (at most {limit} here)"
            raise ContextTooLongError(
                f"{where} is {len(tokens)} tokens, longer than the backend's context of {self.n_ctx} tokens{allowed}",
                request_id=request_id)
        ids = np.asarray(tokens)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise RequestError(f"{where} has a token id outside the vocabulary [0, {self.n_vocab})",
                               request_id=request_id)

    def check_context(self, contexts: Sequence[Sequence[int]]) -> None:
        """A decoder's start contexts: non-empty, valid ids, and room for at least one new token."""
        for i, context in enumerate(contexts):
            if len(context) == 0:
                raise RequestError(f"context #{i} is empty: there is nothing to decode from")
            self.check_tokens(context, f"context #{i}", self.n_ctx - 1)

    def _admitted(self, requests: Sequence[TokenRequest]) -> Iterator[tuple[Gather, np.ndarray]]:
        self._require_open()
        if not requests:
            return iter(())
        for i, request in enumerate(requests):
            self.check_tokens(request.tokens, f"request #{i}")
        self.stats.requested_tokens += sum(len(r.tokens) for r in requests)
        self.stats.scored_tokens += sum(r.n_scored for r in requests)
        self.stats.trie_minimal_tokens += distinct_prefix_count([r.tokens for r in requests])
        return self._logits(requests)

    def _complete(self, out: list) -> list:
        missing = [i for i, x in enumerate(out) if x is None]
        if missing:
            raise AssertionError(f"backend {self.name!r} returned no rows for requests {missing[:5]}")
        return out

    # --- lifetime ---

    def _require_open(self) -> None:
        if self._closed:
            raise ModelLoadError(f"the {self.name} backend on {self.path} is closed")

    def close(self) -> None:
        """Release native resources; any later call raises ModelLoadError."""
        if not self._closed:
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Free what the backend holds (models, contexts, sessions)."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
