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

from fastscore.backends.base import Backend, Decoder, check_step
from fastscore.backends.options import ReferenceOptions
from fastscore.deps import require
from fastscore.engine.plan import Gather
from fastscore.errors import ArtefactUnavailableError, ContextTooLongError
from fastscore.records import TokenRequest

log = logging.getLogger(__name__)


class ReferenceBackend(Backend):
    name = "reference"

    def __init__(self, path: Path, n_threads: int | None = None, options: ReferenceOptions | None = None,
                 progress: bool = False) -> None:
        super().__init__(path, n_threads)
        self.progress = progress
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

    def _logits(self, requests: Sequence[TokenRequest]):
        for index, request in enumerate(tqdm(requests, desc="reference scoring", unit="req",
                                             disable=not self.progress, leave=False)):
            yield Gather.whole(index, request), self._forward(request)

    def _forward(self, request: TokenRequest) -> np.ndarray:
        """Logits rows [n_scored, V] predicting the request's scored tokens, from one forward pass."""
        torch = self.torch
        tokens = torch.tensor([request.tokens], dtype=torch.long)
        # The last n_scored + 1 rows: positions score_from - 1 .. end; the final row predicts nothing.
        with torch.inference_mode():
            logits = self.model(input_ids=tokens, use_cache=False, logits_to_keep=request.n_scored + 1).logits
        self.count_forward(len(request.tokens))
        return logits[0, :-1].numpy()

    def _decoder(self, max_new_tokens: int) -> "ReferenceDecoder":
        return ReferenceDecoder(self)

    def _release(self) -> None:
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
        self.backend._require_open()
        self.backend.check_context(contexts)
        rows = []
        for index, context in enumerate(contexts):
            rows.append(self._forward(index, list(context), cache=None))
        return np.stack(rows) if rows else np.zeros((0, self.backend.n_vocab), dtype=np.float32)

    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        check_step(active, tokens)
        rows = []
        for index, token in zip(active, tokens):
            if index not in self.caches:
                raise ValueError(f"sequence {index} was not started in this decoder")
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
        self.backend.count_forward(len(tokens))
        return out.logits[0, -1].float().numpy()

    def close(self) -> None:
        self.caches.clear()
