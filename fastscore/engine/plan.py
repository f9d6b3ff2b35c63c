"""Turn token requests into trie-shared batches, each with the Gather that maps its logits rows to requests.

Pure planning (numpy only, no backend): a KV-cache backend feeds each `Batch` (every token tagged with its KV
sequence ids) and returns the logits rows of the positions flagged in `outputs`, in batch order; the batch's
`Gather` says which of those rows predict which request's scored tokens. Execution lives in
fastscore.backends.kvcache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fastscore.engine.trie import Group, Trie, all_owners, leaf_owners, pack
from fastscore.mathops import gather_logprobs, log_softmax_rows, token_ranks, top_k_logprobs
from fastscore.records import TokenRequest, TokenScores


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

    def split(self, max_tokens: int) -> list["Batch"]:
        """Consecutive pieces of at most max_tokens tokens, in batch order (so every prefix is cached before it is
        needed); their output rows, concatenated, are this batch's."""
        if self.n_tokens <= max_tokens:
            return [self]
        pieces = []
        for lo in range(0, self.n_tokens, max_tokens):
            hi = min(lo + max_tokens, self.n_tokens)
            runs = tuple((max(b, lo) - lo, min(e, hi) - lo, ids) for b, e, ids in self.runs if b < hi and e > lo)
            pieces.append(Batch(tokens=self.tokens[lo:hi], positions=self.positions[lo:hi],
                                outputs=self.outputs[lo:hi], runs=runs, n_seqs=self.n_seqs))
        return pieces

    def seq_ids_per_token(self) -> list[np.ndarray]:
        out: list[np.ndarray] = [None] * self.n_tokens  # type: ignore[list-item]
        for begin, end, ids in self.runs:
            for i in range(begin, end):
                out[i] = ids
        return out


@dataclass(frozen=True, eq=False)
class Gather:
    """Which logits rows predict which request's scored tokens: members[k]'s targets[k] under rows rows[k]."""

    members: tuple[int, ...]  # request indices
    rows: tuple[np.ndarray, ...]  # int64 [n_scored] per member: indices into the logits rows
    targets: tuple[np.ndarray, ...]  # int32 [n_scored] per member: the scored tokens
    top_k: tuple[int, ...] = ()  # per member: alternatives wanted at each scored position (empty: none)

    @classmethod
    def whole(cls, index: int, request: TokenRequest) -> "Gather":
        """Rows [n_scored, V] computed for one request alone, row k predicting its k-th scored token."""
        return cls((index,), (np.arange(request.n_scored),), (np.asarray(request.tokens[request.score_from :]),),
                   (request.top_k,))

    def scores(self, logits_rows: np.ndarray) -> list[TokenScores]:
        """Each member's log-probs, ranks and wanted top-k; a row shared by several members (a trie node's last
        position) is normalised once."""
        bounds = np.cumsum([0] + [len(r) for r in self.rows])
        targets, rows = np.concatenate(self.targets), np.concatenate(self.rows)
        logprobs, is_argmax = gather_logprobs(logits_rows, targets, rows)
        ranks = token_ranks(logits_rows, targets, rows, is_argmax)
        out = []
        for k in range(len(self.members)):
            part = slice(bounds[k], bounds[k + 1])
            top_ids = top_logprobs = None
            if self.top_k and self.top_k[k] > 0:
                top_ids, top_logprobs = top_k_logprobs(logits_rows, targets[part], rows[part], logprobs[part],
                                                       self.top_k[k])
            out.append(TokenScores(logprobs=logprobs[part], is_argmax=is_argmax[part], ranks=ranks[part],
                                   top_ids=top_ids, top_logprobs=top_logprobs))
        return out

    def log_softmax(self, logits_rows: np.ndarray) -> list[np.ndarray]:
        """float64 [n_scored, n_vocab] log-softmax rows of each member."""
        return [log_softmax_rows(logits_rows[rows]) for rows in self.rows]


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

    `batches()` yields (Batch, Gather) pairs, one per group; a backend runs each batch on an emptied KV cache and
    maps the rows with its Gather. The plan keeps no state between batches.
    """

    def __init__(self, requests: Sequence[TokenRequest], max_tokens: int, max_seqs: int) -> None:
        self.requests = list(requests)
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

    def batches(self) -> Iterator[tuple[Batch, Gather]]:
        for g in range(len(self.groups)):
            yield self._batch(g)

    def _batch(self, g: int) -> tuple[Batch, Gather]:
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
        batch = Batch(tokens=tokens, positions=positions, outputs=outputs, runs=runs, n_seqs=len(group.owners))
        top_k = tuple(self.requests[i].top_k for i in self.members[g])
        return batch, Gather(tuple(self.members[g]), tuple(rows), tuple(targets), top_k)


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


def step_batch(seq_ids: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> Batch:
    """One new token per sequence, each wanting its logits."""
    n = len(seq_ids)
    runs = tuple((k, k + 1, np.array([s], dtype=np.int32)) for k, s in enumerate(seq_ids))
    return Batch(tokens=np.asarray(tokens, dtype=np.int32), positions=np.asarray(positions, dtype=np.int32),
                 outputs=np.ones(n, dtype=bool), runs=runs, n_seqs=n)
