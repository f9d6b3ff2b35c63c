"""Turn token requests into trie-shared batches and the batches' logits back into per-request scores.

Backends run a plan without knowing trie details: for each `Batch` they feed the tokens (each tagged with its KV
sequence ids), return the logits rows of the positions flagged in `outputs` (in batch order), and the plan gathers
log-probs. The llama.cpp backend and the instrumented fake both use exactly this code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastscore.backends.base import Decoder
from fastscore.mathops import gather_logprobs, log_softmax_rows
from fastscore.records import TokenRequest, TokenScores
from fastscore.engine.trie import Group, Trie, all_owners, leaf_owners, pack

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Batch:
    """One forward pass over a KV cache emptied beforehand.

    runs: (begin, end, seq_ids): batch tokens [begin, end) belong to every KV sequence in seq_ids (int32, sorted).
    Tokens come parents first, so a split into micro-batches in batch order always has each prefix cached.
    """

    tokens: np.ndarray  # int32 [n]
    positions: np.ndarray  # int32 [n]
    outputs: np.ndarray  # bool [n]: logits wanted at this position
    runs: tuple[tuple[int, int, np.ndarray], ...]
    n_seqs: int

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return int(self.outputs.sum())

    def seq_ids_per_token(self) -> list[np.ndarray]:
        out: list[np.ndarray] = [None] * self.n_tokens  # type: ignore[list-item]
        for begin, end, ids in self.runs:
            for i in range(begin, end):
                out[i] = ids
        return out


def _layout(trie: Trie, group: Group) -> tuple[dict[int, int], np.ndarray, np.ndarray, tuple]:
    """Batch offsets of each node, tokens, positions and seq-id runs of a group."""
    base, offset = {}, 0
    for node in group.nodes:
        base[id(node)] = offset
        offset += len(node.tokens)
    tokens = np.concatenate([n.tokens for n in group.nodes]).astype(np.int32, copy=False)
    positions = np.concatenate([np.arange(n.start, n.end, dtype=np.int32) for n in group.nodes])
    seq_ids = group.seq_ids(trie)
    runs = tuple(
        (base[id(n)], base[id(n)] + len(n.tokens), np.asarray(seq_ids[id(n)], dtype=np.int32)) for n in group.nodes
    )
    return base, tokens, positions, runs


class ScoringPlan:
    """Score many TokenRequests with each distinct prefix computed once per group.

    Usage: for batch in plan.batches(): plan.collect(batch_logits_rows) ... then plan.results() (and, with
    keep_rows=True, plan.rows(): each request's full float64 log-softmax rows, for KL divergences).
    """

    def __init__(self, requests: Sequence[TokenRequest], max_tokens: int, max_seqs: int,
                 keep_rows: bool = False) -> None:
        self.requests = list(requests)
        self.keep_rows = keep_rows
        self._rows: list[np.ndarray | None] = [None] * len(self.requests)
        self.trie = Trie([r.tokens for r in self.requests])
        self.groups = pack(self.trie, max_tokens, max_seqs, owners_of=leaf_owners)
        # A request not given its own KV sequence (a prefix of another, or a duplicate) is scored in the first
        # group that holds its end node.
        first_group: dict[int, int] = {}
        for g, group in enumerate(self.groups):
            for node in group.nodes:
                first_group.setdefault(id(node), g)
        self.members: list[list[int]] = [[] for _ in self.groups]
        for i in range(len(self.requests)):
            self.members[first_group[id(self.trie.end_node[i])]].append(i)
        self._logprobs: list[np.ndarray | None] = [None] * len(self.requests)
        self._is_argmax: list[np.ndarray | None] = [None] * len(self.requests)
        self._pending: tuple[int, list[np.ndarray], list[np.ndarray]] | None = None

    @property
    def requested_tokens(self) -> int:
        return self.trie.requested_tokens

    @property
    def minimal_tokens(self) -> int:
        return self.trie.minimal_tokens

    @property
    def computed_tokens(self) -> int:
        return int(sum(g.n_tokens for g in self.groups))

    @property
    def scored_tokens(self) -> int:
        return int(sum(r.n_scored for r in self.requests))

    def batches(self) -> Iterator[Batch]:
        for g in range(len(self.groups)):
            yield self._batch(g)

    def _batch(self, g: int) -> Batch:
        group = self.groups[g]
        base, tokens, positions, runs = _layout(self.trie, group)
        outputs = np.zeros(len(tokens), dtype=bool)
        # Pieces per request: (batch index range of predicting positions, target tokens).
        pieces: list[list[tuple[np.ndarray, np.ndarray]]] = []
        for i in self.members[g]:
            req = self.requests[i]
            first, stop = req.score_from - 1, len(req.tokens) - 1  # positions whose logits predict a scored token
            mine = []
            path = self.trie.end_node[i].path()
            for k, node in enumerate(path):
                lo, hi = max(first, node.start), min(stop, node.end - 1)
                if lo < hi:  # inside the run: the next token is the run's own
                    idx = np.arange(base[id(node)] + lo - node.start, base[id(node)] + hi - node.start)
                    mine.append((idx, node.tokens[lo - node.start + 1 : hi - node.start + 1]))
                last = node.end - 1
                if first <= last < stop:  # the run's last position predicts the next node's first token
                    mine.append((np.array([base[id(node)] + last - node.start]), path[k + 1].tokens[:1]))
            for idx, _ in mine:
                outputs[idx] = True
            pieces.append(mine)
        row_of = np.cumsum(outputs) - 1
        rows, targets = [], []
        for mine in pieces:
            rows.append(np.concatenate([row_of[idx] for idx, _ in mine]) if mine else np.zeros(0, np.int64))
            targets.append(np.concatenate([t for _, t in mine]) if mine else np.zeros(0, np.int32))
        self._pending = (g, rows, targets)
        return Batch(tokens=tokens, positions=positions, outputs=outputs, runs=runs, n_seqs=len(group.owners))

    def collect(self, logits_rows: np.ndarray) -> None:
        """Logits rows [batch.n_outputs, n_vocab] of the batch last yielded, in batch order."""
        if self._pending is None:
            raise RuntimeError("collect() called without a pending batch")
        g, rows, targets = self._pending
        self._pending = None
        lengths = [len(r) for r in rows]
        logprobs, is_argmax = gather_logprobs(logits_rows, np.concatenate(targets), np.concatenate(rows))
        bounds = np.cumsum([0] + lengths)
        for k, i in enumerate(self.members[g]):
            self._logprobs[i] = logprobs[bounds[k] : bounds[k + 1]]
            self._is_argmax[i] = is_argmax[bounds[k] : bounds[k + 1]]
            if self.keep_rows:
                self._rows[i] = log_softmax_rows(logits_rows[rows[k]])

    def results(self) -> list[TokenScores]:
        out = []
        for i, req in enumerate(self.requests):
            lp, am = self._logprobs[i], self._is_argmax[i]
            if lp is None or am is None or len(lp) != req.n_scored:
                raise RuntimeError(f"request {i} was not fully scored (plan not run to the end)")
            out.append(TokenScores(logprobs=lp, is_argmax=am))
        return out

    def rows(self) -> list[np.ndarray]:
        """float64 [n_scored, n_vocab] log-softmax rows of each request (the plan must have keep_rows=True)."""
        if not self.keep_rows or any(r is None for r in self._rows):
            raise RuntimeError("rows() needs keep_rows=True and a plan run to the end")
        return list(self._rows)  # type: ignore[arg-type]


class DecodePlan:
    """Greedy-decoding prefill: every context gets its own KV sequence; contexts share prefix cells.

    Contexts are packed into groups (each one KV cache). `slot[i]` = (group, local sequence id) of context i.
    """

    def __init__(self, contexts: Sequence[Sequence[int]], max_tokens: int, max_seqs: int) -> None:
        self.trie = Trie(contexts)
        self.groups = pack(self.trie, max_tokens, max_seqs, owners_of=all_owners)
        self.slot: list[tuple[int, int]] = [(-1, -1)] * len(self.trie.sequences)
        for g, group in enumerate(self.groups):
            for local, owner in enumerate(group.owners):
                self.slot[owner] = (g, local)
        self.lengths = [len(s) for s in self.trie.sequences]

    @property
    def computed_tokens(self) -> int:
        return int(sum(g.n_tokens for g in self.groups))

    def batch(self, g: int) -> tuple[Batch, np.ndarray]:
        """The prefill batch of group g, and for each of its owners the output row holding its next-token logits."""
        group = self.groups[g]
        base, tokens, positions, runs = _layout(self.trie, group)
        outputs = np.zeros(len(tokens), dtype=bool)
        last = np.array([base[id(self.trie.end_node[o])] + len(self.trie.end_node[o].tokens) - 1
                         for o in group.owners], dtype=np.int64)
        outputs[last] = True
        row_of = np.cumsum(outputs) - 1
        batch = Batch(tokens=tokens, positions=positions, outputs=outputs, runs=runs, n_seqs=len(group.owners))
        return batch, row_of[last]


class Session(Protocol):
    """One KV cache a plan runs on: forward() feeds a Batch and returns its flagged logits rows in batch order."""

    def forward(self, batch: Batch) -> np.ndarray: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


def run_scoring(plan: ScoringPlan, session: Session) -> ScoringPlan:
    """Run every batch of the plan on one KV cache, emptied before each batch; results are in the plan."""
    for batch in plan.batches():
        session.clear()
        plan.collect(session.forward(batch))
    session.clear()
    return plan


def step_batch(seq_ids: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> Batch:
    """One new token per sequence, each wanting its logits."""
    n = len(seq_ids)
    runs = tuple((k, k + 1, np.array([s], dtype=np.int32)) for k, s in enumerate(seq_ids))
    return Batch(tokens=np.asarray(tokens, dtype=np.int32), positions=np.asarray(positions, dtype=np.int32),
                 outputs=np.ones(n, dtype=bool), runs=runs, n_seqs=n)


class PlanDecoder(Decoder):
    """Greedy-decoding support on any Session type: prefill shares prefixes, each step is one forward per KV cache.

    Contexts are grouped by at most max_tokens prefill tokens and max_seqs sequences; open_session(n_cells) opens
    one KV cache per group, sized for its prefill plus reserve_per_seq new tokens per sequence.
    check_context(tokens, index) may reject a context (e.g. too long) before anything runs.
    """

    def __init__(self, open_session: Callable[[int], Session], max_tokens: int, max_seqs: int,
                 reserve_per_seq: int, check_context: Callable[[Sequence[int], int], None] | None = None) -> None:
        self._open, self._check = open_session, check_context
        self.max_tokens, self.max_seqs, self.reserve = max_tokens, max_seqs, reserve_per_seq
        self.plan: DecodePlan | None = None
        self.sessions: list[Session] = []
        self.next_pos: list[int] = []
        self.n_vocab = 0

    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        self.close()
        if self._check is not None:
            for i, context in enumerate(contexts):
                self._check(context, i)
        self.plan = DecodePlan(contexts, self.max_tokens, self.max_seqs)
        out = np.zeros((0, 0), dtype=np.float32) if not contexts else None
        for g, group in enumerate(self.plan.groups):
            self.sessions.append(self._open(group.n_tokens + self.reserve * len(group.owners)))
            self.sessions[g].clear()
            batch, rows = self.plan.batch(g)
            logits = self.sessions[g].forward(batch)
            if out is None:
                out = np.empty((len(self.plan.slot), logits.shape[1]), dtype=np.float32)
            out[group.owners] = logits[rows]
        self.next_pos = list(self.plan.lengths)
        assert out is not None
        self.n_vocab = out.shape[1]
        return out

    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        if self.plan is None:
            raise RuntimeError("step() before start()")
        if len(active) != len(tokens) or len(set(active)) != len(active):
            raise ValueError("active must list distinct sequences, one token each")
        by_group: dict[int, list[int]] = {}
        for k, a in enumerate(active):
            by_group.setdefault(self.plan.slot[a][0], []).append(k)
        out = np.empty((len(active), self.n_vocab), dtype=np.float32)
        for g, ks in by_group.items():
            seqs = [active[k] for k in ks]
            batch = step_batch([self.plan.slot[a][1] for a in seqs], [tokens[k] for k in ks],
                               [self.next_pos[a] for a in seqs])
            out[ks] = self.sessions[g].forward(batch)
            for a in seqs:
                self.next_pos[a] += 1
        return out

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.sessions = []
        self.plan = None
