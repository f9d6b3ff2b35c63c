"""The llama.cpp side of a trie plan: contexts (KV caches), one reusable llama_batch, logits rows as numpy views.

Only the low-level `llama_cpp` ctypes API is used; the caller passes the imported module in, so importing this
file never loads llama.cpp.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from fastscore.backends.llamacpp_abort import AbortOnInterrupt
from fastscore.backends.options import FLASH_ATTN_MODES, KV_CACHE_TYPES
from fastscore.errors import BackendError
from fastscore.engine.plan import Batch




@dataclass(frozen=True)
class ContextSettings:
    n_ubatch: int
    n_seq_max: int
    n_threads: int
    flash_attn: str
    kv_type: str


def new_context(L, model, n_ctx: int, n_batch: int, s: ContextSettings, unified: bool = True):
    """A llama context whose KV cache holds n_ctx cells shared by up to s.n_seq_max sequences (`unified`), or
    n_ctx / s.n_seq_max cells for each sequence in a stream of its own."""
    params = L.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = min(s.n_ubatch, n_batch)
    params.n_seq_max = s.n_seq_max
    # Scoring: one KV buffer for all sequences: a shared prefix cell belongs to many sequences at once (the whole
    # point), and no sequence is limited to n_ctx / n_seq_max cells. Decoding may ask for a stream per sequence.
    params.kv_unified = unified
    params.n_outputs_max = 0  # up to n_batch logits rows per decode
    params.n_outputs_max_per_seq = 0  # the default (1) would allow one output row per sequence
    params.n_threads = s.n_threads
    params.n_threads_batch = s.n_threads
    params.flash_attn_type = FLASH_ATTN_MODES[s.flash_attn]
    params.type_k = params.type_v = KV_CACHE_TYPES[s.kv_type].ggml_type
    params.no_perf = True
    ctx = L.llama_init_from_model(model, params)
    if not ctx:
        raise BackendError(f"llama.cpp could not create a context of {n_ctx} cells (out of memory?)")
    return ctx


class BatchBuffer:
    """A llama_batch allocated once (llama_batch_init) and refilled from trie Batches with numpy writes."""

    def __init__(self, L, capacity: int, n_seq_max: int) -> None:
        self.L, self.capacity, self.n_seq_max = L, capacity, n_seq_max
        self.batch = L.llama_batch_init(capacity, 0, n_seq_max)
        self.token = np.ctypeslib.as_array(self.batch.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(self.batch.pos, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(self.batch.n_seq_id, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(self.batch.logits, shape=(capacity,))
        # Each token's seq-id list is its own malloc'd array: keep the addresses, fill them with memmove.
        self.seq_addr = [ctypes.cast(self.batch.seq_id[i], ctypes.c_void_p).value for i in range(capacity)]

    def fill(self, batch: Batch) -> None:
        n = batch.n_tokens
        if n > self.capacity or batch.n_seqs > self.n_seq_max:
            raise BackendError(f"batch of {n} tokens / {batch.n_seqs} sequences exceeds the buffer "
                               f"({self.capacity} / {self.n_seq_max})")
        self.token[:n] = batch.tokens
        self.pos[:n] = batch.positions
        self.logits[:n] = batch.outputs
        memmove, addr = ctypes.memmove, self.seq_addr
        for begin, end, ids in batch.runs:
            self.n_seq_id[begin:end] = len(ids)
            src, nbytes = ids.ctypes.data, ids.nbytes
            for i in range(begin, end):
                memmove(addr[i], src, nbytes)
        self.batch.n_tokens = n

    def free(self) -> None:
        if self.batch is not None:
            self.L.llama_batch_free(self.batch)
            self.batch = None


class LlamaCache:
    """One llama context run as a trie-plan KV cache (fastscore.backends.kvcache.KVCache). Logits rows returned by
    forward() are views into llama.cpp's output buffer, valid until the next forward() on this context."""

    def __init__(self, L, ctx, buffer: BatchBuffer, n_vocab: int, owns_ctx: bool) -> None:
        self.L, self.ctx, self.buffer, self.owns_ctx = L, ctx, buffer, owns_ctx
        self.n_vocab = n_vocab
        self.abort = AbortOnInterrupt(L, ctx)

    def clear(self) -> None:
        # data=False: resetting the cell metadata is enough, stale K/V values are never attended to.
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), False)

    def forward(self, batch: Batch) -> np.ndarray:
        self.buffer.fill(batch)
        with self.abort.guard():
            rc = self.L.llama_decode(self.ctx, self.buffer.batch)
        if rc == 1:
            raise BackendError("llama.cpp's KV cache is full (more tokens than the context was sized for)")
        if rc != 0:
            raise BackendError(f"llama_decode failed with code {rc}")
        return self._rows(np.flatnonzero(batch.outputs))

    def _rows(self, index: np.ndarray) -> np.ndarray:
        """Logits rows of the flagged batch positions, as a [len(index), n_vocab] float32 array."""
        if len(index) == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        get = self.L.llama_get_logits_ith
        first, last = get(self.ctx, int(index[0])), get(self.ctx, int(index[-1]))
        a0, a1 = ctypes.cast(first, ctypes.c_void_p).value, ctypes.cast(last, ctypes.c_void_p).value
        if not a0 or not a1:
            raise BackendError("llama.cpp returned no logits for a flagged position")
        row_bytes = self.n_vocab * 4
        if a1 - a0 == (len(index) - 1) * row_bytes:  # rows stored contiguously in batch order: one view
            return np.ctypeslib.as_array(first, shape=(len(index), self.n_vocab))
        rows = []
        for i in index:
            ptr = get(self.ctx, int(i))
            if not ctypes.cast(ptr, ctypes.c_void_p).value:
                raise BackendError(f"llama.cpp returned no logits for batch position {i}")
            rows.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)))
        return np.stack(rows)

    def close(self) -> None:
        if self.owns_ctx and self.ctx is not None:
            self.L.llama_free(self.ctx)
        self.ctx = None
