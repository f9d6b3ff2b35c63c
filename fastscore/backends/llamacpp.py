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
from pathlib import Path

from fastscore.backends.base import Decoder
from fastscore.backends.kvcache import KVCacheBackend
from fastscore.backends.options import DEFAULT_N_CTX, LlamaCppOptions
from fastscore.backends.llamacpp_batch import (
    BatchBuffer,
    ContextSettings,
    LlamaCache,
    new_context,
)
from fastscore.backends.llamacpp_compact import (
    build_decodes_weights, build_steps_match_prefill, compact_matches, src1_f32_override,
)
from fastscore.backends.llamacpp_streams import StreamDecoder, kv_bytes_per_cell
from fastscore.deps import require
from fastscore.errors import ArtefactUnavailableError, ModelLoadError, SettingsError, TokenizationError

log = logging.getLogger(__name__)

_llama_state: dict = {}  # the imported module and the installed log callback (kept alive for llama.cpp)


def llama_module():
    """Import llama_cpp once, initialise its backend and route its stderr log to this module's logger at debug
    level (shown by the CLI's -vv, silent otherwise)."""
    if "L" not in _llama_state:
        L = require("llama_cpp", "llamacpp", package="llama-cpp-python")
        L.llama_backend_init()

        def forward(level: int, text: bytes, user_data) -> None:
            if text and log.isEnabledFor(logging.DEBUG):
                log.debug("llama.cpp: %s", text.decode(errors="replace").rstrip())

        _llama_state["callback"] = L.llama_log_callback(forward)  # a reference must outlive every log call
        L.llama_log_set(_llama_state["callback"], None)
        _llama_state["L"] = L
    return _llama_state["L"]


def _check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ArtefactUnavailableError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")


def context_size(asked: int | None, trained: int) -> int:
    """The context to create: the one asked for, at most the trained one (SettingsError beyond it); by default
    DEFAULT_N_CTX, or the trained context if that is smaller. A GGUF without a trained context (0) sets no bound."""
    if asked is None:
        return min(DEFAULT_N_CTX, trained) if trained > 0 else DEFAULT_N_CTX
    if 0 < trained < asked:
        raise SettingsError(f"n_ctx {asked} (--n-ctx) is beyond the {trained} tokens the model was trained on: "
                            f"positions past {trained} would give meaningless scores; choose --n-ctx {trained} or less")
    return asked


class LlamaCppBackend(KVCacheBackend):
    name = "llamacpp"
    context_option = "--n-ctx"
    # Results do not depend on the thread count: ggml splits a product's output among threads, not a dot product
    # (scores and greedy tokens equal at 1 and 2 threads: tests/test_lanes.py).
    threads_adjustable = True

    def __init__(self, path: Path, n_threads: int | None = None, options: LlamaCppOptions | None = None,
                 progress: bool = False, compact: Path | None = None, check_compact: bool = True) -> None:
        """`compact`: a GGUF holding `path`'s f32 weights exactly in Q4_1 / Q8_0 blocks (Artefact.compact_path).
        It is loaded instead when options.compact_weights is on and this build decodes it to the same bits
        (fastscore.backends.llamacpp_compact; `check_compact` False skips that check, for the check itself)."""
        options = options or LlamaCppOptions()
        super().__init__(Path(path), n_threads, options.max_group_tokens, progress, options.max_decode_tokens)
        self.options = options
        self._model = self._ctx = self._buffer = None
        self._decoders: weakref.WeakSet = weakref.WeakSet()
        _check_gguf(self.path)
        module = llama_module()  # initialises llama.cpp's backend and routes its log, whatever wraps the module
        self._L = L = self.llama_library(module)
        self.steps_match_prefill = build_steps_match_prefill(getattr(module, "__version__", ""))
        self.n_seq_max = min(options.n_seq_max, int(L.llama_max_parallel_sequences()))
        if options.n_ctx is not None:  # more sequences than cells aborts llama.cpp (GGML_ASSERT n_outputs_max)
            self.n_seq_max = min(self.n_seq_max, options.n_ctx)
        self.settings = ContextSettings(n_ubatch=options.n_ubatch, n_seq_max=self.n_seq_max,
                                        n_threads=n_threads or os.cpu_count() or 1,
                                        flash_attn=options.flash_attn, kv_type=options.kv_type)
        self.decode_settings = dataclasses.replace(self.settings, flash_attn=options.decode_flash_attn)
        model_params = L.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self.weights_file = self.path  # the file llama.cpp computes from
        if compact is not None and options.compact_weights and self._runs_compact(module, Path(compact), check_compact):
            self.weights_file = Path(compact)
            self._overrides = src1_f32_override(L)  # read while loading; kept with the model all the same
            model_params.kv_overrides = ctypes.cast(self._overrides, ctypes.POINTER(L.llama_model_kv_override))
            model_params.use_extra_bufts = False  # a repacked weight would skip the decoded product
        self._model = L.llama_model_load_from_file(str(self.weights_file).encode(), model_params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.weights_file} (unsupported architecture or damaged "
                                 "file)")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(self._model))
        n_ctx = context_size(options.n_ctx, self.n_ctx_train)
        self._ctx = new_context(L, self._model, n_ctx, n_ctx, self.settings)
        self.n_ctx = int(L.llama_n_ctx(self._ctx))  # llama.cpp may round the cache size up (to 256 cells)
        if self.n_ctx != n_ctx:  # a batch must hold a whole scoring group of n_ctx tokens, or llama.cpp aborts
            L.llama_free(self._ctx)
            self._ctx = new_context(L, self._model, self.n_ctx, self.n_ctx, self.settings)
        self._buffer = BatchBuffer(L, self.n_ctx, self.n_seq_max)
        self._cache = LlamaCache(L, self._ctx, self._buffer, self.n_vocab, owns_ctx=False)
        log.info("llama.cpp: %s, n_ctx=%d (trained %d), n_vocab=%d, %d threads, flash_attn=%s (decoding %s), kv=%s",
                 self.describe(), self.n_ctx, self.n_ctx_train, self.n_vocab, self.settings.n_threads,
                 options.flash_attn, options.decode_flash_attn, options.kv_type)

    def _runs_compact(self, module, compact: Path, check: bool) -> bool:
        version = getattr(module, "__version__", "")
        if not build_decodes_weights(version):
            log.info("llama-cpp-python %s does not decode compact weights exactly: scoring %s", version, self.path)
            return False
        if not compact.is_file():
            log.warning("compact weights %s not found: computing from %s", compact, self.path)
            return False
        if not check:
            return True
        n_threads = self.n_threads

        def open_plain(path: Path, compact: Path | None) -> LlamaCppBackend:
            return LlamaCppBackend(path, n_threads=n_threads, compact=compact, check_compact=False)
        return compact_matches(module, self.path, compact, open_plain)

    def set_threads(self, n_threads: int) -> None:
        self._require_open()
        self.n_threads = n_threads
        self.settings = dataclasses.replace(self.settings, n_threads=n_threads)
        self.decode_settings = dataclasses.replace(self.decode_settings, n_threads=n_threads)
        self._L.llama_set_n_threads(self._ctx, n_threads, n_threads)  # decoding contexts are made per call

    def llama_library(self, module):
        """What every llama.cpp call of this backend goes through: the llama_cpp module. A subclass may return a
        wrapper of it, so tools outside the product path can observe calls without a hook here."""
        return module

    def describe(self) -> str:
        """llama.cpp's one-line model description, e.g. 'llama 135M Q4_1'; with compact weights, what it computes."""
        text = ctypes.create_string_buffer(256)
        self._L.llama_model_desc(self._model, text, 256)
        desc = text.value.decode(errors="replace")
        return desc if self.weights_file == self.path else f"{desc} blocks decoded to f32, f32 activations"

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenizer, no special tokens added: for tests and diagnostics (the scorer tokenizes
        with fastscore.tokenizer and the model's chat template)."""
        data = text.encode()
        buf = (self._L.llama_token * (len(data) + 8))()
        n = self._L.llama_tokenize(self._vocab, data, len(data), buf, len(buf), False, False)
        if n < 0:
            raise TokenizationError(f"llama_tokenize needs {-n} token slots for {len(data)} bytes")
        return list(buf[:n])

    # --- the caches the shared KV-cache orchestration runs on ---

    def _scoring_cache(self) -> LlamaCache:
        return self._cache

    def _decoder(self, max_new_tokens: int) -> Decoder:
        if self.options.decode_kv == "streams":
            decoder: Decoder = StreamDecoder(self, max_new_tokens)
        else:
            decoder = super()._decoder(max_new_tokens)
        self._decoders.add(decoder)  # closing the backend frees the decoders' contexts too
        return decoder

    def decode_stream_settings(self, n_streams: int) -> ContextSettings:
        """Context settings of a StreamDecoder group of n_streams contexts (a step feeds one token per stream, so a
        micro-batch must hold them all)."""
        return dataclasses.replace(self.decode_settings, n_seq_max=n_streams,
                                   n_ubatch=max(self.decode_settings.n_ubatch, n_streams))

    def max_stream_cells(self) -> int:
        """KV cells (all streams together) one decoding context may hold within options.decode_memory_mb."""
        per_cell = kv_bytes_per_cell(self._L, self._model, self.options.kv_type)
        return max(int(self.options.decode_memory_mb * 2**20 // per_cell), 1)

    def _decode_cache(self, n_cells: int) -> LlamaCache:
        self._require_open()
        n_cells = -(-max(n_cells, 256) // 256) * 256
        ctx = new_context(self._L, self._model, n_cells, self.n_ctx, self.decode_settings)
        return LlamaCache(self._L, ctx, self._buffer, self.n_vocab, owns_ctx=True)

    # --- lifetime ---

    def _release(self) -> None:
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

