"""One KV-stream decoding context kept from a decoder call for the next one.

Creating a context of 32 streams × 1,024 cells costs ≈ 0.6–1.5 s on this kind of machine (llama.cpp allocates and
zeroes ≈ 1.5 GB of f32 KV, and the kernel faults the pages in); a study makes a decoder call per chunk of items
and environment, each its own context. A context at least as large in both streams and cells per stream serves the
next call as well: a stream attends over its own used cells (padded to 64), never over the rest of its room, and
cells left over from the last call are masked like a finished sequence's cells within one call (their weights are
exact zeros), so results do not depend on which context a call gets (tests/test_llamacpp_pool.py).

Only llama.cpp calls and sizes here; the caller passes the llama_cpp module in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from fastscore.backends.llamacpp_batch import ContextSettings, new_context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamContext:
    """A llama context of `n_streams` KV streams of `cells` cells each, made with `settings`."""

    ctx: object
    n_streams: int
    cells: int
    settings: ContextSettings

    def compatible(self, settings: ContextSettings) -> bool:
        """Made with the attention and KV type `settings` asks for (the thread count is set per call)."""
        return (self.settings.flash_attn, self.settings.kv_type) == (settings.flash_attn, settings.kv_type)

    def holds(self, n_streams: int, cells: int, settings: ContextSettings) -> bool:
        """Can this context run a call of n_streams streams of `cells` cells made with `settings`? Its micro-batch
        may be larger: the decoder feeds prefill pieces of its own size, each one micro-batch as before."""
        return self.compatible(settings) and self.n_streams >= n_streams and self.cells >= cells and \
            self.settings.n_ubatch >= settings.n_ubatch


class StreamContextPool:
    """Hands out stream contexts, keeping the one returned last (the larger, if two come back) for reuse.

    `max_cells` bounds a context grown to hold both the kept context's and a new call's shape; beyond it the
    call gets a context of its own shape.
    """

    def __init__(self, L, model, max_cells: int) -> None:
        self.L, self.model, self.max_cells = L, model, max_cells
        self.kept: StreamContext | None = None
        self.closed = False
        self.created = 0  # contexts made, and the seconds making them took (for tests and benchmarks)
        self.creating_seconds = 0.0

    def take(self, n_streams: int, cells: int, settings: ContextSettings) -> StreamContext:
        """A context for n_streams streams of `cells` cells, its KV emptied, on settings.n_threads threads."""
        kept, self.kept = self.kept, None
        if kept is not None and kept.holds(n_streams, cells, settings):
            self.L.llama_memory_clear(self.L.llama_get_memory(kept.ctx), False)
            self.L.llama_set_n_threads(kept.ctx, settings.n_threads, settings.n_threads)
            return kept
        if kept is not None:  # too small (or other settings): grow to hold both shapes where the budget allows
            grown = (max(n_streams, kept.n_streams), max(cells, kept.cells))
            if kept.compatible(settings) and grown[0] * grown[1] <= self.max_cells:
                n_streams, cells = grown
                settings = replace(settings, n_seq_max=n_streams, n_ubatch=max(settings.n_ubatch, n_streams,
                                                                               kept.settings.n_ubatch))
            self._free(kept)
        started = time.perf_counter()
        ctx = new_context(self.L, self.model, cells * n_streams, settings.n_ubatch, settings, unified=False)
        self.creating_seconds += time.perf_counter() - started
        self.created += 1
        log.debug("new decoding context: %d streams x %d cells", n_streams, cells)
        return StreamContext(ctx, n_streams, cells, settings)

    def give_back(self, context: StreamContext) -> None:
        """Keep `context` for the next take() (the larger of it and the one kept; the other is freed)."""
        if self.closed:
            self._free(context)
            return
        if self.kept is None:
            self.kept = context
            return
        small, large = sorted((self.kept, context), key=lambda c: c.n_streams * c.cells)
        self._free(small)
        self.kept = large

    def release(self) -> None:
        """Free the kept context (its memory back now; the next call makes a new one)."""
        if self.kept is not None:
            self._free(self.kept)
            self.kept = None

    def close(self) -> None:
        self.closed = True
        self.release()

    def _free(self, context: StreamContext) -> None:
        self.L.llama_free(context.ctx)

