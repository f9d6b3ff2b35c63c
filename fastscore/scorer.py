"""Text-level scoring on top of a token-level backend.

Requests are rendered and tokenized by `RequestTokenizer` (fastscore/request_tokens.py, which the Scorer extends);
many of them go to the backend per call, so its prefix trie shares the common context of all candidates of many
contexts at once. Candidate sets are normalised within each set; greedy decoding continues rendered contexts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastscore.backends.base import Backend
from fastscore.decode import Decoded, greedy_decode, queue_decode
from fastscore.decode_units import DecodeUnit, decode_unit, per_context_temperatures
from fastscore.errors import BackendError, ContextTooLongError, DamagedArtefactError, RequestError
from fastscore.mathops import softmax
from fastscore.records import (
    CandidateSet,
    CandidateSetResult,
    GreedyRequest,
    GreedyResult,
    ScoreRequest,
    ScoreResult,
    TokenRequest,
)
from fastscore.request_tokens import PreparedRequest, RequestTokenizer
from fastscore.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GreedyUnit:
    """Greedy requests made ready for Scorer.serve_greedy (Scorer.greedy_unit): the requests and their token-level
    unit, whose key names them in on_done."""

    requests: tuple[GreedyRequest, ...]
    unit: DecodeUnit

    @property
    def longest(self) -> int:
        return self.unit.longest


def set_probabilities(logprobs: Sequence[float]) -> tuple[float, ...]:
    """Softmax over a candidate set: each candidate's share of the set's total probability."""
    return tuple(float(p) for p in softmax(logprobs))


class Scorer(RequestTokenizer):
    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        include_end_of_turn: bool = True,
        max_batch_tokens: int = 65_536,
        max_decode_batch: int = 32,
        refill_decode: bool = True,
        weights_note: str = "",
        weights_repair: str = "",
        top_k: int = 0,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.include_end_of_turn = include_end_of_turn
        self.max_batch_tokens = max_batch_tokens
        self.max_decode_batch = max_decode_batch
        # Greedy calls in one refilling decoder session where the backend's decoder can (False: fixed batches
        # everywhere, the path of decoders that cannot refill; the results are the same on an exact backend).
        self.refill_decode = refill_decode
        self._weights_note = weights_note
        self._weights_repair = weights_repair
        if top_k < 0:
            raise RequestError(f"top_k must be >= 0, not {top_k}")
        self.top_k = top_k  # alternatives returned per scored token

    @property
    def weights_note(self) -> str:
        """Which weights produced the scores (e.g. a quantisation caveat), from the resolved artefact."""
        return self._weights_note or f"{self.backend.name} {self.backend.path.name}"

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- scoring ---

    def _batches(self, prepared: Sequence[PreparedRequest]) -> Iterable[list[PreparedRequest]]:
        batch, size = [], 0
        for item in prepared:
            n = len(item.token_request.tokens)
            if batch and size + n > self.max_batch_tokens:
                yield batch
                batch, size = [], 0
            batch.append(item)
            size += n
        if batch:
            yield batch

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Log-prob of each request's continuation (+ end-of-turn), in request order."""
        prepared = [self.prepare(request) for request in requests]  # every input error surfaces before compute
        results: list[ScoreResult] = []
        for batch in self._batches(prepared):
            with self._finite_weights():
                scores = self.backend.score_tokens([item.token_request for item in batch])
            for item, token_scores in zip(batch, scores, strict=True):
                results.append(self._result(item, token_scores))
        return results

    def score_token_requests(self, requests: Sequence[TokenRequest]) -> list:
        """Token-level requests scored as they are, with no template (e.g. the windows of a raw text); non-finite
        log-probs mean damaged weights, as for `score`."""
        with self._finite_weights():
            scores = self.backend.score_tokens(list(requests))
        if not all(np.all(np.isfinite(s.logprobs)) for s in scores):
            raise self._damaged("non-finite log-probs")
        return scores

    @contextlib.contextmanager
    def _finite_weights(self):
        """Non-finite logits mean damaged weights (NaN/inf in a tensor): name the file and how to rebuild it."""
        try:
            yield
        except FloatingPointError as exc:
            raise self._damaged(f"non-finite logits: {exc}") from exc

    def _damaged(self, what: str) -> DamagedArtefactError:
        fix = f"; rebuild it with: {self._weights_repair}" if self._weights_repair else ""
        return DamagedArtefactError(f"the weights in {self.backend.path} are damaged ({what}){fix}")

    def _result(self, item: PreparedRequest, token_scores) -> ScoreResult:
        tr = item.token_request
        logprobs = np.asarray(token_scores.logprobs, dtype=np.float64)
        if logprobs.shape != (tr.n_scored,):
            raise BackendError(
                f"request {item.request.id!r}: backend {self.backend.name!r} returned invalid log-probs "
                f"(shape {logprobs.shape}, expected ({tr.n_scored},))"
            )
        if not np.all(np.isfinite(logprobs)):
            raise self._damaged(f"request {item.request.id!r} got non-finite log-probs")
        ids = tr.tokens[tr.score_from :]
        piece = self.tokenizer.decode_piece
        top_k = ()
        if token_scores.top_ids is not None:
            top_k = tuple(
                tuple((int(t), piece(t), float(lp)) for t, lp in zip(top_ids, top_lps, strict=True))
                for top_ids, top_lps in zip(token_scores.top_ids, token_scores.top_logprobs, strict=True))
        return ScoreResult(
            request_id=item.request.id,
            continuation=item.request.continuation,
            logprob=float(logprobs.sum()),
            n_tokens=tr.n_scored,
            token_ids=ids,
            token_logprobs=tuple(float(x) for x in logprobs),
            token_is_argmax=tuple(bool(x) for x in np.asarray(token_scores.is_argmax)),
            boundary_straddles=item.boundary_straddles,
            includes_end_of_turn=item.includes_end_of_turn,
            token_texts=tuple(piece(t) for t in ids),
            token_ranks=() if token_scores.ranks is None else tuple(int(r) for r in token_scores.ranks),
            top_k=top_k,
        )

    def score_candidates(self, sets: Sequence[CandidateSet]) -> list[CandidateSetResult]:
        """Score every candidate of every set in shared backend calls; normalise probabilities within each set."""
        flat = []
        for candidate_set in sets:
            if not candidate_set.candidates:
                raise RequestError("empty candidate list", request_id=candidate_set.id)
            flat.extend(candidate_set.score_requests())
        results = iter(self.score(flat))
        out = []
        for candidate_set in sets:
            group = tuple(dataclasses.replace(next(results), index=k) for k in range(len(candidate_set.candidates)))
            out.append(
                CandidateSetResult(
                    id=candidate_set.id,
                    results=group,
                    probs=set_probabilities([r.logprob for r in group]),
                    probs_per_token=set_probabilities([r.logprob_per_token for r in group]),
                )
            )
        return out

    # --- greedy decoding ---

    def greedy(self, requests: Sequence[GreedyRequest], max_new_tokens: int = 128, ban_prefix: bool = False, *,
               temperature: float | Sequence[float] = 0.0,
               rngs: Sequence[np.random.Generator | None] | None = None) -> list[GreedyResult]:
        """Greedy completion of each context (rendered with a generation prompt; a raw-text prompt as it is), never
        equal to its banned texts (with `ban_prefix`, the call's or the request's: never starting with one); with
        temperature > 0 (the call's, or one per request), sampled from `rngs[i]` (one Generator per sampled request;
        greedy and sampled requests of one context share its prefill in one call). Each request decodes up to its own
        `max_new_tokens` if set, at most the call's (budgets share decoder calls), and its `action_done` rule may end
        it early (stopped_by "action_done", see fastscore.decode). A request's `start_ids` begin its completion as
        given. Results are in request order."""
        temperatures, contexts, budgets = self._greedy_prepared(requests, max_new_tokens, temperature, rngs)
        results: list[GreedyResult | None] = [None] * len(requests)
        if not requests:
            return []
        # A request's start tokens are prefilled with its context: the decoder reserves room for the rest only.
        to_decode = [max(budget - len(request.start_ids), 1) for budget, request in zip(budgets, requests)]
        for idx, decoder, width in self._decode_batches(to_decode):
            chunk = [requests[i] for i in idx]
            with self._finite_weights():
                decoded = greedy_decode(
                    decoder,
                    [contexts[i] for i in idx],
                    token_bytes=self.tokenizer.token_bytes,
                    stop_ids=self.tokenizer.stop_ids,
                    max_new_tokens=[budgets[i] for i in idx],
                    banned=[request.banned for request in chunk],
                    ban_prefix=[ban_prefix or request.ban_prefix for request in chunk],
                    temperature=[temperatures[i] for i in idx],
                    rngs=None if rngs is None else [rngs[i] for i in idx],
                    action_done=[request.action_done for request in chunk],
                    width=width,
                    starts=[request.start_ids for request in chunk],
                )
            for i, request, d in zip(idx, chunk, decoded, strict=True):
                results[i] = self._greedy_result(request, d)
        return results

    def greedy_unit(self, key: Hashable, requests: Sequence[GreedyRequest], max_new_tokens: int = 128,
                    ban_prefix: bool = False, *, temperature: float | Sequence[float] = 0.0,
                    rngs: Sequence[np.random.Generator | None] | None = None) -> GreedyUnit:
        """`requests` as greedy() takes them, made ready for serve_greedy: tokenized and checked, so an item-level
        error (RequestError, ContextTooLongError, TokenizationError) is raised here, before any decoding."""
        temperatures, contexts, budgets = self._greedy_prepared(requests, max_new_tokens, temperature, rngs)
        unit = decode_unit(key, contexts, max_new_tokens=budgets, banned=[r.banned for r in requests],
                           ban_prefix=[ban_prefix or r.ban_prefix for r in requests], temperature=temperatures,
                           rngs=rngs, action_done=[r.action_done for r in requests],
                           starts=[r.start_ids for r in requests])
        return GreedyUnit(tuple(requests), unit)

    def can_serve_greedy(self) -> bool:
        """Can serve_greedy run here: a decoder that takes sequences between steps, and refilling on."""
        if not self.refill_decode:
            return False
        decoder = self.backend.decoder(1)
        try:
            return decoder.refills
        finally:
            decoder.close()

    def serve_greedy(self, pull: Callable[[], GreedyUnit | None],
                     on_done: Callable[[Hashable, list[GreedyResult]], None], longest: int,
                     width: int | None = None) -> None:
        """The completions of the units `pull` hands out (None: no more), in one refilling decoder session of at most
        max_decode_batch live sequences, or `width` if fewer (fastscore.decode.queue_decode): on_done(key, results in
        its requests' order) as each unit's last completion ends. `longest`: the most tokens any unit's sequence
        holds (GreedyUnit.longest). On an exact type whose steps give a prefill's bits, several sessions may pull
        from one queue: each completion is then the one greedy() gives."""
        requests: dict[Hashable, tuple[GreedyRequest, ...]] = {}

        def next_unit() -> DecodeUnit | None:
            got = pull()
            if got is None:
                return None
            requests[got.unit.key] = got.requests
            return got.unit

        def done(key: Hashable, decoded: list[Decoded]) -> None:
            on_done(key, [self._greedy_result(r, d) for r, d in zip(requests.pop(key), decoded, strict=True)])

        with self._finite_weights():
            queue_decode(self.backend.decoder(longest), next_unit, done, token_bytes=self.tokenizer.token_bytes,
                         stop_ids=self.tokenizer.stop_ids,
                         width=min(self.max_decode_batch, width or self.max_decode_batch), longest=longest)

    def _greedy_prepared(self, requests: Sequence[GreedyRequest], max_new_tokens: int,
                         temperature: float | Sequence[float], rngs) -> tuple[list[float], list, list[int]]:
        """(temperatures, context token ids, budgets) of greedy requests, checked."""
        if max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
        temperatures = per_context_temperatures(temperature, rngs, len(requests))
        contexts, budgets = [], []
        for request in requests:
            budget = max_new_tokens if request.max_new_tokens is None else min(request.max_new_tokens, max_new_tokens)
            if budget < 1:
                raise RequestError(f"max_new_tokens must be >= 1, not {budget}", request_id=request.id)
            ids = (self.prompt_ids(request.prompt, request.id) if request.prompt is not None
                   else self.context_ids(request.messages, request.id, request.tools))
            if len(ids) + budget > self.backend.n_ctx:
                raise ContextTooLongError(
                    f"the context is {len(ids)} tokens; with {budget} new tokens that is longer than "
                    f"{self.context_limit()}",
                    request_id=request.id,
                )
            self.backend.check_tokens(request.start_ids, "start_ids", request_id=request.id)
            contexts.append(ids)
            budgets.append(budget)
        return temperatures, contexts, budgets

    def _greedy_result(self, request: GreedyRequest, d: Decoded) -> GreedyResult:
        return GreedyResult(id=request.id, text=self.tokenizer.decode(d.token_ids), token_ids=d.token_ids,
                            stopped_by=d.stopped_by, banned_mass=d.banned_mass, banned_steps=d.banned_steps)

    def _decode_batches(self, budgets: Sequence[int]):
        """(request indices, decoder, width) of each decoder call. A decoder that refills takes every request in one
        session, at most max_decode_batch live at once, the longest budgets first (so the call ends on short ones)
        and each finished request's slot refilled at once. Otherwise fixed batches in budget order (stably: an
        item's requests stay together), so a batch that holds only short budgets ends early instead of stepping on
        for one long request; each batch steps until its longest member ends."""
        order = sorted(range(len(budgets)), key=budgets.__getitem__)
        first = self.backend.decoder(max(budgets[i] for i in order[: self.max_decode_batch]))
        if first.refills and self.refill_decode:  # (its slots are sized by the call's requests, not by its reserve)
            yield sorted(range(len(budgets)), key=lambda i: -budgets[i]), first, self.max_decode_batch
            return
        for lo in range(0, len(order), self.max_decode_batch):
            idx = order[lo : lo + self.max_decode_batch]
            yield idx, first if lo == 0 else self.backend.decoder(max(budgets[i] for i in idx)), None
