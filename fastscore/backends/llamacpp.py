"""llama.cpp backend: prefix-shared scoring and greedy decoding on any GGUF, through the low-level `llama_cpp` API.

The high-level `Llama` class keeps one sequence per context and hides the batch; here a whole trie group goes into
one llama_decode: each node's tokens once, tagged with the KV sequence ids of every request below it, logits
requested only where a scored token is predicted.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fastscore.backends.base import Backend, Decoder
from fastscore.backends.llamacpp_batch import (
    FLASH_ATTN,
    KV_TYPES,
    BatchBuffer,
    ContextSettings,
    LlamaSession,
    new_context,
)
from fastscore.deps import require
from fastscore.errors import (
    ArtefactUnavailableError,
    ContextTooLongError,
    ModelLoadError,
    RequestError,
    TokenizationError,
)
from fastscore.records import TokenRequest, TokenScores
from fastscore.engine.plan import PlanDecoder, ScoringPlan, run_scoring

log = logging.getLogger(__name__)

_llama_state: dict = {}  # the imported module and the installed log callback (kept alive for llama.cpp)


def llama_module(verbose: bool = False):
    """Import llama_cpp once, initialise its backend and route its stderr log (dropped unless verbose)."""
    if "L" not in _llama_state:
        L = require("llama_cpp", "llamacpp", package="llama-cpp-python")
        L.llama_backend_init()
        _llama_state["L"] = L
    L = _llama_state["L"]
    if _llama_state.get("verbose") != verbose or "callback" not in _llama_state:
        def forward(level: int, text: bytes, user_data) -> None:
            if verbose and text:
                log.debug("llama.cpp: %s", text.decode(errors="replace").rstrip())

        _llama_state["callback"] = L.llama_log_callback(forward)  # a reference must outlive every log call
        _llama_state["verbose"] = verbose
        L.llama_log_set(_llama_state["callback"], None)
    return L


def _check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ArtefactUnavailableError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")


class LlamaCppBackend(Backend):
    name = "llamacpp"
    artefact_kind = "gguf"
    shares_prefixes = True
    supports_decoding = True

    def __init__(
        self,
        path: Path,
        n_threads: int | None = None,
        n_ctx: int = 4096,
        n_seq_max: int = 256,
        n_ubatch: int = 512,
        # Exact arithmetic by default: an f16 KV cache and CPU flash attention each move log-probs by ~0.015 nats,
        # several times the f32 parity tolerance; "on"/"f16" are 10-20% faster and left to callers who opt in.
        flash_attn: str = "off",
        kv_type: str = "f32",
        # Greedy decoding differs: every step's few tokens attend over the whole shared cache of all contexts, and
        # only flash attention skips the masked cells (at 32 contexts, batched decoding was 1.07x one-at-a-time
        # without it and 2.9x with it). Its ~0.03-nat deviations matter only at near-ties of the argmax.
        decode_flash_attn: str = "on",
        # Tokens of one scoring group (a KV cache filled from empty). Without flash attention every token attends
        # over all cells of its group, so big groups waste attention and small ones recompute shared prefixes:
        # 1536 measured fastest overall (f32 40.5 s -> 26.5 s, q4_0 36.1 s -> 23.0 s vs 4096 on the bench workload).
        max_group_tokens: int = 1536,
        progress: bool = True,
        verbose: bool = False,
    ) -> None:
        super().__init__(Path(path), n_threads)
        if flash_attn not in FLASH_ATTN or decode_flash_attn not in FLASH_ATTN or kv_type not in KV_TYPES:
            raise ValueError(f"flash_attn must be one of {sorted(FLASH_ATTN)}, kv_type one of {sorted(KV_TYPES)}")
        if n_ctx < 16 or n_ubatch < 1 or n_seq_max < 1 or max_group_tokens < 1:
            raise ValueError("n_ctx, n_ubatch, n_seq_max and max_group_tokens must be positive (n_ctx at least 16)")
        self.max_group_tokens = max_group_tokens
        self._model = self._ctx = self._buffer = None
        self._decoders: weakref.WeakSet = weakref.WeakSet()
        self.progress = progress
        _check_gguf(self.path)
        self._L = L = llama_module(verbose)
        self.n_seq_max = min(n_seq_max, int(L.llama_max_parallel_sequences()))
        self.settings = ContextSettings(n_ubatch=n_ubatch, n_seq_max=self.n_seq_max,
                                        n_threads=n_threads or os.cpu_count() or 1,
                                        flash_attn=flash_attn, kv_type=kv_type)
        self.decode_settings = dataclasses.replace(self.settings, flash_attn=decode_flash_attn)
        model_params = L.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = L.llama_model_load_from_file(str(self.path).encode(), model_params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.path} (unsupported architecture or damaged file)")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(self._model))
        self._ctx = new_context(L, self._model, n_ctx, n_ctx, self.settings)
        self.n_ctx = int(L.llama_n_ctx(self._ctx))  # llama.cpp may round the cache size up
        self._buffer = BatchBuffer(L, self.n_ctx, self.n_seq_max)
        self._session = LlamaSession(L, self._ctx, self._buffer, self.n_vocab, self.stats, owns_ctx=False)
        log.info("llama.cpp: %s, n_ctx=%d (trained %d), n_vocab=%d, %d threads, flash_attn=%s (decoding %s), kv=%s",
                 self.describe(), self.n_ctx, self.n_ctx_train, self.n_vocab, self.settings.n_threads,
                 flash_attn, decode_flash_attn, kv_type)

    def describe(self) -> str:
        """llama.cpp's one-line model description, e.g. 'llama 135M Q4_1'."""
        text = ctypes.create_string_buffer(256)
        self._L.llama_model_desc(self._model, text, 256)
        return text.value.decode(errors="replace")

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenizer, no special tokens added: for tests and diagnostics (the scorer tokenizes
        with fastscore.tokenizer and the model's chat template)."""
        data = text.encode()
        buf = (self._L.llama_token * (len(data) + 8))()
        n = self._L.llama_tokenize(self._vocab, data, len(data), buf, len(buf), False, False)
        if n < 0:
            raise TokenizationError(f"llama_tokenize needs {-n} token slots for {len(data)} bytes")
        return list(buf[:n])

    # --- scoring ---

    def _validate(self, tokens: Sequence[int], where: str, limit: int) -> None:
        if len(tokens) > limit:
            raise ContextTooLongError(
                f"{where} is {len(tokens)} tokens, longer than the backend's context of {limit} tokens")
        ids = np.asarray(tokens)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise RequestError(f"{where} has a token id outside the vocabulary [0, {self.n_vocab})")

    def score_tokens(self, requests: Sequence[TokenRequest]) -> list[TokenScores]:
        return self._run(requests, keep_rows=False).results() if requests else []

    def logprob_rows(self, requests: Sequence[TokenRequest]) -> list[np.ndarray]:
        """float64 [n_scored, n_vocab] log-softmax rows of each request, computed with the same trie sharing."""
        return self._run(requests, keep_rows=True).rows() if requests else []

    def _run(self, requests: Sequence[TokenRequest], keep_rows: bool) -> ScoringPlan:
        self._require_open()
        for i, request in enumerate(requests):
            self._validate(request.tokens, f"request #{i}", self.n_ctx)
        longest = max(len(r.tokens) for r in requests)
        group_tokens = min(self.n_ctx, max(self.max_group_tokens, longest))
        plan = ScoringPlan(requests, group_tokens, self.n_seq_max, keep_rows=keep_rows)
        self.stats.extra["packs"] = self.stats.extra.get("packs", 0) + len(plan.groups)
        self.stats.requested_tokens += plan.requested_tokens
        self.stats.trie_minimal_tokens += plan.minimal_tokens
        self.stats.scored_tokens += plan.scored_tokens
        if len(plan.groups) < 4 or not self.progress:
            run_scoring(plan, self._session)
            return plan
        with tqdm(total=plan.computed_tokens, unit="tok", desc="llama.cpp", leave=False, disable=None) as bar:
            run_scoring(plan, _ProgressSession(self._session, bar))
        return plan

    # --- greedy decoding ---

    def decoder(self, max_new_tokens: int = 256) -> Decoder:
        """A decoder for up to `max_new_tokens` steps; its contexts get their own KV caches, freed by close()."""
        self._require_open()
        decoder = PlanDecoder(self._open_decode_session, self.n_ctx, self.n_seq_max, max_new_tokens,
                              check_context=lambda tokens, i: self._validate(tokens, f"context #{i}", self.n_ctx))
        self._decoders.add(decoder)
        return decoder

    def _open_decode_session(self, n_cells: int) -> LlamaSession:
        self._require_open()
        n_cells = -(-max(n_cells, 256) // 256) * 256
        ctx = new_context(self._L, self._model, n_cells, self.n_ctx, self.decode_settings)
        return LlamaSession(self._L, ctx, self._buffer, self.n_vocab, self.stats, owns_ctx=True)

    # --- lifetime ---

    def _require_open(self) -> None:
        if self._ctx is None:
            raise ModelLoadError(f"the llama.cpp backend on {self.path} is closed")

    def close(self) -> None:
        for decoder in list(self._decoders):
            decoder.close()
        L = getattr(self, "_L", None)
        if L is None:
            return
        if self._buffer is not None:
            self._buffer.free()
            self._buffer = None
        if self._ctx is not None:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass


class _ProgressSession:
    """A session wrapper that advances a progress bar by the tokens of each forward pass."""

    def __init__(self, inner: LlamaSession, bar) -> None:
        self.inner, self.bar = inner, bar

    def clear(self) -> None:
        self.inner.clear()

    def forward(self, batch):
        rows = self.inner.forward(batch)
        self.bar.update(batch.n_tokens)
        return rows

    def close(self) -> None:
        self.inner.close()
