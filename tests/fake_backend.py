"""An instrumented fake backend: the real trie plans and KV-cache orchestration on a tiny deterministic numpy "model" with a faithful KV cache.

The model's hidden state at a position is a hash of the WHOLE prefix up to it (token and position), chained
through the KV cache exactly as attention would read it: a token finds its predecessor as the one cell of its
sequence at position - 1. A batch that tags a token with the wrong sequences, feeds a child before its parent or
leaves a prefix out therefore fails loudly or changes the logits, so sharing mistakes show. Logits are a fixed
random projection of the state's bits. Counters: cells computed, forward calls, batch sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fastscore.backends.kvcache import KVCacheBackend
from fastscore.engine.plan import Batch
from fastscore.errors import BackendError
from fastscore.mathops import gather_logprobs
from fastscore.records import TokenRequest, TokenScores

_MASK = (1 << 64) - 1
ROOT_STATE = 0x9E3779B97F4A7C15


def mix(parent: int, token: int, position: int) -> int:
    """splitmix64 of the parent state combined with the token and its position."""
    z = (parent ^ ((token + 1) * 0xBF58476D1CE4E5B9) ^ ((position + 1) * 0x94D049BB133111EB)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class FakeModel:
    def __init__(self, n_vocab: int = 61, seed: int = 7) -> None:
        self.n_vocab = n_vocab
        self.weights = np.random.default_rng(seed).normal(scale=1.5, size=(64, n_vocab)).astype(np.float32)

    def logits(self, states: Sequence[int]) -> np.ndarray:
        bits = (np.array(states, dtype=np.uint64)[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
        # Summed in float64 and rounded once: a float32 matmul rounds differently with the number of rows (BLAS
        # kernels), and a row's logits must depend on its state alone, however many rows share the batch.
        return ((bits.astype(np.float64) * 2 - 1) @ self.weights.astype(np.float64)).astype(np.float32)

    def reference_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits after each prefix, computed alone and sequentially: the ground truth."""
        states, state = [], ROOT_STATE
        for p, t in enumerate(tokens):
            state = mix(state, int(t), p)
            states.append(state)
        return self.logits(states)


class FakeKV:
    """A KV cache of cells (position, sequence ids, state) with llama.cpp's sharing semantics."""

    def __init__(self, model: FakeModel, n_ctx: int, n_seq_max: int, counters: dict) -> None:
        self.model, self.n_ctx, self.n_seq_max, self.counters = model, n_ctx, n_seq_max, counters
        self.cells: list[tuple[int, frozenset, int]] = []

    def clear(self) -> None:
        self.cells = []

    def close(self) -> None:
        self.cells = []

    def _predecessor(self, seq: int, position: int) -> int:
        if position == 0:
            return ROOT_STATE
        found = [c for c in self.cells if seq in c[1] and c[0] == position - 1]
        if len(found) != 1:
            raise AssertionError(f"sequence {seq} has {len(found)} cells at position {position - 1}")
        return found[0][2]

    def forward(self, batch: Batch) -> np.ndarray:
        if len(self.cells) + batch.n_tokens > self.n_ctx:  # llama.cpp: llama_decode returns 1
            raise BackendError(f"KV cache full: {len(self.cells)} + {batch.n_tokens} > {self.n_ctx} cells")
        self.counters["forward_calls"] += 1
        self.counters["computed_tokens"] += batch.n_tokens
        self.counters["batch_sizes"].append(batch.n_tokens)
        out_states = []
        for i, (tok, pos, seqs) in enumerate(zip(batch.tokens, batch.positions, batch.seq_ids_per_token())):
            seqs = [int(s) for s in seqs]
            if not seqs or max(seqs) >= self.n_seq_max:
                raise AssertionError(f"token {i} has sequence ids {seqs} (n_seq_max {self.n_seq_max})")
            parents = {self._predecessor(s, int(pos)) for s in seqs}
            if len(parents) != 1:
                raise AssertionError(f"token {i} is shared by sequences with different prefixes")
            if any(c[0] == pos and set(seqs) & c[1] for c in self.cells):
                raise AssertionError(f"position {pos} of sequences {seqs} computed twice in one cache")
            state = mix(parents.pop(), int(tok), int(pos))
            self.cells.append((int(pos), frozenset(seqs), state))
            if batch.outputs[i]:
                out_states.append(state)
        self.counters["output_rows"] += len(out_states)
        return self.model.logits(out_states) if out_states else np.zeros((0, self.model.n_vocab), np.float32)


class FakeBackend(KVCacheBackend):
    """The fake model behind the real KV-cache orchestration (group budget, stats, plans, greedy decoding)."""

    name = "fake"

    def __init__(self, path: Path | None = None, n_threads: int | None = None, n_ctx: int = 256,
                 n_seq_max: int = 8, n_vocab: int = 61, max_group_tokens: int | None = None,
                 max_decode_tokens: int | None = None) -> None:
        super().__init__(Path(path or "fake"), n_threads, max_group_tokens, max_decode_tokens=max_decode_tokens)
        self.model = FakeModel(n_vocab)
        self.n_ctx, self.n_seq_max, self.n_vocab = n_ctx, n_seq_max, n_vocab
        self.counters = {"forward_calls": 0, "computed_tokens": 0, "output_rows": 0, "batch_sizes": [],
                         "caches_opened": 0}

    def _decode_cache(self, n_cells: int) -> FakeKV:
        self.counters["caches_opened"] += 1
        return FakeKV(self.model, n_cells, self.n_seq_max, self.counters)

    def _scoring_cache(self) -> FakeKV:
        return self._decode_cache(self.n_ctx)

    def score_alone(self, request: TokenRequest) -> TokenScores:
        """Ground truth without any trie or cache."""
        logits = self.model.reference_logits(request.tokens)
        rows = np.arange(request.score_from - 1, len(request.tokens) - 1)
        lp, am = gather_logprobs(logits[rows], np.asarray(request.tokens[request.score_from :]))
        return TokenScores(logprobs=lp, is_argmax=am)
