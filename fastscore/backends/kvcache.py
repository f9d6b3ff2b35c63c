"""Running trie plans on KV caches: the orchestration llama.cpp and the instrumented test fake share.

`KVCacheBackend` owns the group-budget policy, the stats and the progress bar of scoring, and greedy decoding via
`PlanDecoder`; a subclass supplies only its caches (`KVCache`s): the one scoring runs on, and fresh ones of a given
size for decoding. The plans themselves are pure (fastscore.engine.plan).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from fastscore.backends.base import Backend, Decoder, check_step
from fastscore.engine.plan import Batch, DecodePlan, Gather, ScoringPlan, step_batch
from fastscore.records import TokenRequest

# Scoring calls with fewer groups than this finish too fast for a progress bar to say anything.
MIN_GROUPS_FOR_PROGRESS = 4


class KVCache(Protocol):
    """One KV cache a plan runs on: forward() feeds a Batch and returns its flagged logits rows in batch order
    (valid until the next forward)."""

    def forward(self, batch: Batch) -> np.ndarray: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class MeteredCache:
    """A cache that counts forward calls and computed tokens into the backend's stats, and advances a bar."""

    def __init__(self, inner: KVCache, backend: Backend, bar=None) -> None:
        self.inner, self.backend, self.bar = inner, backend, bar

    def clear(self) -> None:
        self.inner.clear()

    def forward(self, batch: Batch) -> np.ndarray:
        rows = self.inner.forward(batch)
        self.backend.count_forward(batch.n_tokens)
        if self.bar is not None:
            self.bar.update(batch.n_tokens)
        return rows

    def close(self) -> None:
        self.inner.close()


def run_scoring(plan: ScoringPlan, cache: KVCache) -> Iterator[tuple[Gather, np.ndarray]]:
    """Each batch of the plan on one KV cache, emptied before each batch: (its Gather, its logits rows)."""
    try:
        for batch, gather in plan.batches():
            cache.clear()
            yield gather, cache.forward(batch)
    finally:
        cache.clear()


class KVCacheBackend(Backend):
    """A backend whose engine is a KV cache fed trie-shaped batches (llama.cpp; the test fake)."""

    n_seq_max: int

    def __init__(self, path: Path, n_threads: int | None = None, max_group_tokens: int | None = None,
                 progress: bool = False, max_decode_tokens: int | None = None) -> None:
        super().__init__(path, n_threads)
        self.max_group_tokens = max_group_tokens  # None: the whole context
        self.max_decode_tokens = max_decode_tokens  # None: the whole context
        self.progress = progress

    @abc.abstractmethod
    def _scoring_cache(self) -> KVCache:
        """The cache scoring runs on (at least n_ctx cells)."""

    @abc.abstractmethod
    def _decode_cache(self, n_cells: int) -> KVCache:
        """A new cache of at least n_cells cells for one decoding group, closed by the decoder."""

    def group_tokens(self, requests: Sequence[TokenRequest]) -> int:
        """Tokens of one scoring group (a KV cache filled from empty): the configured budget, raised to the longest
        request, at most the context."""
        longest = max(len(r.tokens) for r in requests)
        return min(self.n_ctx, max(self.max_group_tokens or self.n_ctx, longest))

    def decode_group_tokens(self) -> int:
        """Prefill tokens of one decoding cache: at least the context. Every step feeds one token per sequence of
        a cache, so the fewer caches the contexts need, the fuller each step's batch (one forward per cache)."""
        return max(self.n_ctx, self.max_decode_tokens or self.n_ctx)

    def _logits(self, requests: Sequence[TokenRequest]) -> Iterator[tuple[Gather, np.ndarray]]:
        plan = ScoringPlan(requests, self.group_tokens(requests), self.n_seq_max)
        self.stats.extra["packs"] = self.stats.extra.get("packs", 0) + len(plan.groups)
        show = self.progress and len(plan.groups) >= MIN_GROUPS_FOR_PROGRESS
        with tqdm(total=plan.computed_tokens, unit="tok", desc=self.name, leave=False, disable=not show) as bar:
            yield from run_scoring(plan, MeteredCache(self._scoring_cache(), self, bar if show else None))

    def _decoder(self, max_new_tokens: int) -> Decoder:
        return PlanDecoder(self, max_new_tokens)


class GroupedDecoder(Decoder):
    """What the KV-cache decoders share: contexts started in groups (one KV cache each), each step's sequences routed
    to their group. A subclass sets `group_of` (context -> group index) in start()."""

    def __init__(self, backend, reserve: int) -> None:
        self.backend, self.reserve = backend, reserve  # reserve: the most tokens any context will generate
        self.group_of: list[int] = []
        self.next_pos: list[int] = []
        self.n_vocab = 0

    def _begin(self, contexts: Sequence[Sequence[int]]) -> None:
        self.close()
        self.backend._require_open()
        self.backend.check_context(contexts)

    def _by_group(self, active: Sequence[int], tokens: Sequence[int]) -> dict[int, list[int]]:
        """Positions in `active` of each group's sequences (misuse raises ValueError, as the Decoder contract says)."""
        if not self.group_of:
            raise ValueError("step() before start()")
        check_step(active, tokens)
        by_group: dict[int, list[int]] = {}
        for k, a in enumerate(active):
            if not 0 <= a < len(self.group_of):
                raise ValueError(f"sequence {a} was not started in this decoder")
            by_group.setdefault(self.group_of[a], []).append(k)
        return by_group


class PlanDecoder(GroupedDecoder):
    """Greedy decoding on a KVCacheBackend: prefill shares prefixes, each step is one forward per KV cache.

    Contexts are grouped by at most decode_group_tokens() prefill tokens and n_seq_max sequences; each group gets
    its own cache, sized for its prefill plus max_new_tokens per sequence, and is prefilled in forwards of at most
    n_ctx tokens (one forward's limit).
    """

    def __init__(self, backend: KVCacheBackend, max_new_tokens: int) -> None:
        super().__init__(backend, max_new_tokens)
        self.plan: DecodePlan | None = None
        self.caches: list[KVCache] = []

    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        self._begin(contexts)
        backend = self.backend
        self.plan = DecodePlan(contexts, backend.decode_group_tokens(), backend.n_seq_max)
        self.group_of = [g for g, _ in self.plan.slot]
        out = np.zeros((0, 0), dtype=np.float32) if not contexts else None
        for g, group in enumerate(self.plan.groups):
            cells = group.n_tokens + self.reserve * len(group.owners)
            self.caches.append(MeteredCache(backend._decode_cache(cells), backend))
            self.caches[g].clear()
            batch, rows = self.plan.batch(g)
            # A piece's rows are a view valid until the next forward: copied before the next piece runs.
            pieces = [np.array(self.caches[g].forward(piece)) for piece in batch.split(backend.n_ctx)]
            logits = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            if out is None:
                out = np.empty((len(self.plan.slot), logits.shape[1]), dtype=np.float32)
            out[group.owners] = logits[rows]
        self.next_pos = list(self.plan.lengths)
        assert out is not None
        self.n_vocab = out.shape[1]
        return out

    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        by_group = self._by_group(active, tokens)
        assert self.plan is not None
        out = np.empty((len(active), self.n_vocab), dtype=np.float32)
        for g, ks in by_group.items():
            seqs = [active[k] for k in ks]
            batch = step_batch([self.plan.slot[a][1] for a in seqs], [tokens[k] for k in ks],
                               [self.next_pos[a] for a in seqs])
            out[ks] = self.caches[g].forward(batch)
            for a in seqs:
                self.next_pos[a] += 1
        return out

    def close(self) -> None:
        for cache in self.caches:
            cache.close()
        self.caches = []
        self.plan = None
        self.group_of = []
