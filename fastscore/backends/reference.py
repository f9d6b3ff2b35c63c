"""The transformers reference backend: the ground truth every fast backend is checked against, and the baseline.

Deliberately plain: fp32 weights, one forward pass per request over its full sequence, no cache and no sharing.
Only the lm-head rows that predict scored tokens are kept (transformers' `logits_to_keep`), which changes no number.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fastscore.backends.base import Backend, Decoder
from fastscore.deps import require
from fastscore.errors import ArtefactUnavailableError, ContextTooLongError, RequestError
from fastscore.mathops import gather_logprobs, log_softmax_rows
from fastscore.records import TokenRequest, TokenScores

log = logging.getLogger(__name__)


class ReferenceBackend(Backend):
    name = "reference"
    artefact_kind = "hf"
    shares_prefixes = False
    supports_decoding = True

    def __init__(self, path: Path, n_threads: int | None = None) -> None:
        super().__init__(path, n_threads)
        if not (self.path / "config.json").is_file():
            raise ArtefactUnavailableError(f"no HF checkpoint (config.json) in {self.path}")
        self.torch = require("torch", "reference")
        transformers = require("transformers", "reference")
        if n_threads:
            self.torch.set_num_threads(int(n_threads))
        log.info("loading %s with transformers (fp32)", self.path)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.path, dtype=self.torch.float32, local_files_only=True
        ).eval()
        config = self.model.config
        self.n_ctx = int(getattr(config, "max_position_embeddings", None) or 2**31 - 1)
        self.n_vocab = int(self.model.get_output_embeddings().weight.shape[0])

    def score_tokens(self, requests: Sequence[TokenRequest]) -> list[TokenScores]:
        return self._map_logits(requests, self._scores)

    def logprob_rows(self, requests: Sequence[TokenRequest]) -> list[np.ndarray]:
        return self._map_logits(requests, lambda request, rows: log_softmax_rows(rows))

    def _map_logits(self, requests: Sequence[TokenRequest], reduce) -> list:
        self.check_context(requests)
        results = []
        for request in tqdm(requests, desc="reference scoring", unit="req", disable=None, leave=False):
            results.append(reduce(request, self._logits(request)))
        return results

    def _scores(self, request: TokenRequest, rows: np.ndarray) -> TokenScores:
        # float32 logits; gather_logprobs normalises each row in float64.
        logprobs, is_argmax = gather_logprobs(rows, np.asarray(request.tokens[request.score_from :]))
        return TokenScores(logprobs=logprobs, is_argmax=is_argmax)

    def _logits(self, request: TokenRequest) -> np.ndarray:
        """Logits rows [n_scored, V] predicting the request's scored tokens, from one forward pass."""
        torch = self.torch
        tokens = torch.tensor([request.tokens], dtype=torch.long)
        # The last n_scored + 1 rows: positions score_from - 1 .. end; the final row predicts nothing.
        with torch.inference_mode():
            logits = self.model(input_ids=tokens, use_cache=False, logits_to_keep=request.n_scored + 1).logits
        self.stats.requested_tokens += len(request.tokens)
        self.stats.computed_tokens += len(request.tokens)
        self.stats.trie_minimal_tokens += len(request.tokens)
        self.stats.scored_tokens += request.n_scored
        self.stats.forward_calls += 1
        return logits[0, :-1].numpy()

    def decoder(self) -> "ReferenceDecoder":
        return ReferenceDecoder(self)

    def close(self) -> None:
        self.model = None


class ReferenceDecoder(Decoder):
    """One transformers cache per sequence, stepped one sequence at a time: slow, simple, obviously right."""

    def __init__(self, backend: ReferenceBackend) -> None:
        self.backend = backend
        self.caches: dict[int, object] = {}
        self.lengths: dict[int, int] = {}

    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        self.caches.clear()
        self.lengths.clear()
        rows = []
        for index, context in enumerate(contexts):
            if not context or len(context) >= self.backend.n_ctx:
                raise ContextTooLongError(f"context of {len(context)} tokens cannot be decoded", request_id=index)
            rows.append(self._forward(index, list(context), cache=None))
        return np.stack(rows) if rows else np.zeros((0, self.backend.n_vocab), dtype=np.float32)

    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        if len(active) != len(tokens):
            raise RequestError(f"step got {len(active)} sequences but {len(tokens)} tokens")
        rows = []
        for index, token in zip(active, tokens):
            if index not in self.caches:
                raise RequestError(f"sequence {index} was not started in this decoder")
            if self.lengths[index] >= self.backend.n_ctx:
                raise ContextTooLongError(f"decoding ran past the model's context of {self.backend.n_ctx}")
            rows.append(self._forward(index, [int(token)], cache=self.caches[index]))
        return np.stack(rows) if rows else np.zeros((0, self.backend.n_vocab), dtype=np.float32)

    def _forward(self, index: int, tokens: list[int], cache) -> np.ndarray:
        torch = self.backend.torch
        with torch.inference_mode():
            out = self.backend.model(
                input_ids=torch.tensor([tokens], dtype=torch.long), past_key_values=cache, use_cache=True,
                logits_to_keep=1,
            )
        self.caches[index] = out.past_key_values
        self.lengths[index] = self.lengths.get(index, 0) + len(tokens)
        stats = self.backend.stats
        stats.computed_tokens += len(tokens)
        stats.forward_calls += 1
        return out.logits[0, -1].float().numpy()

    def close(self) -> None:
        self.caches.clear()
