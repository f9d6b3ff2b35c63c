"""The backend contract: one abstract token-level method, capabilities as class attributes.

A backend knows token ids only: no text, no chat templates (the scorer owns tokenization).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from fastscore.errors import ContextTooLongError, UnsupportedError
from fastscore.records import EngineStats, TokenRequest, TokenScores


class Decoder(abc.ABC):
    """Incremental next-token logits for a batch of sequences, for greedy decoding.

    `start` feeds the contexts (sharing their prefixes where the backend can) and returns the next-token logits
    of each; `step` appends one token to each still-active sequence and returns their next logits.
    """

    @abc.abstractmethod
    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 [len(contexts), n_vocab]."""

    @abc.abstractmethod
    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Append tokens[i] to sequence active[i] (indices into the start contexts); float32 [len(active), n_vocab]."""

    def close(self) -> None:
        """Free per-decode state (KV cache)."""

    def __enter__(self) -> "Decoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Backend(abc.ABC):
    name: ClassVar[str]
    artefact_kind: ClassVar[str]  # "gguf" (a file), "onnx" (a folder), "hf" (a folder)
    shares_prefixes: ClassVar[bool] = False
    supports_decoding: ClassVar[bool] = False

    n_ctx: int
    n_vocab: int

    def __init__(self, path: Path, n_threads: int | None = None) -> None:
        self.path = Path(path)
        self.n_threads = n_threads
        self.stats = EngineStats()

    @abc.abstractmethod
    def score_tokens(self, requests: Sequence[TokenRequest]) -> list[TokenScores]:
        """Log-probs of each request's scored tokens, in request order. Sequences longer than n_ctx are an error."""

    def check_context(self, requests: Sequence[TokenRequest]) -> None:
        """Raise ContextTooLongError for the first request longer than the model's context."""
        for position, request in enumerate(requests):
            if len(request.tokens) > self.n_ctx:
                raise ContextTooLongError(
                    f"{len(request.tokens)} tokens exceed the model's context of {self.n_ctx}", request_id=position
                )

    def logprob_rows(self, requests: Sequence[TokenRequest]) -> list[np.ndarray]:
        """float64 [n_scored, n_vocab] log-softmax rows predicting each request's scored tokens (for KL divergence)."""
        raise UnsupportedError(f"backend {self.name!r} does not return full distributions")

    def decoder(self) -> Decoder:
        raise UnsupportedError(f"backend {self.name!r} does not support greedy decoding")

    def close(self) -> None:
        """Release native resources."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
