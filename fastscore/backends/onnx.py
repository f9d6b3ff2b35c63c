"""ONNX Runtime backend: each shared prefix runs once, then all its continuations in one batch on its past.

Requests are sorted by their tokens so that those sharing a prefix (the K candidates of one context) are adjacent;
a greedy cost model cuts the sorted list into groups. A group's longest common prefix runs once, on the past of
whatever it shares with the previous group's prefix (sorted groups of one item's conditions share its system prompt
and task); its continuations then run right-padded in batches on that past repeated along the batch axis (right
padding needs no care beyond the attention mask: causal attention never lets a real token see a later pad).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fastscore.backends.base import Backend, Decoder, check_step
from fastscore.backends.onnx_session import DecoderSession
from fastscore.backends.options import OnnxOptions
from fastscore.engine.plan import Gather
from fastscore.engine.trie import common_prefix
from fastscore.errors import ContextTooLongError
from fastscore.records import TokenRequest


# The fixed cost of one more continuation batch, in tokens of compute (a session call, the past copied again).
CHUNK_OVERHEAD_TOKENS = 8


class PrefixCache:
    """The previous group's prefix and its past, so the next group runs only what it does not share with it."""

    def __init__(self) -> None:
        self.tokens: tuple[int, ...] = ()
        self.past: list[np.ndarray] | None = None

    def reusable(self, tokens: Sequence[int], logits_from: int) -> int:
        """Leading tokens whose past can be reused: shared with the cached prefix and needing no logits row."""
        if self.past is None:
            return 0
        return min(common_prefix(self.tokens, tokens), logits_from)

    def past_of(self, n_tokens: int) -> list[np.ndarray]:
        return [np.ascontiguousarray(p[:, :, :n_tokens]) for p in self.past]

    def keep(self, tokens: Sequence[int], past: list[np.ndarray] | None) -> None:
        self.tokens, self.past = tuple(tokens), past


@dataclass(frozen=True)
class Group:
    """Requests (indices) that share their first `prefix_len` tokens; each has at least one token after it."""

    members: tuple[int, ...]
    prefix_len: int


def plan_groups(sequences: Sequence[Sequence[int]]) -> list[Group]:
    """Cut the requests into groups that share a prefix, minimising an estimate of the tokens to compute.

    A group of one runs whole. A group of B runs its prefix P once plus B continuations padded to the longest:
    cost P + B * max(len - P). Requests join the current group (in sorted order) while that is no dearer than
    starting a new group with the newcomer, which costs one more session call and runs only what it does not share
    with the current group's prefix (the PrefixCache keeps that past).
    """
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))
    groups: list[Group] = []
    members: list[int] = []
    prefix = 0
    for index in order:
        length = len(sequences[index])
        if not members:
            members, prefix = [index], length
            continue
        shared = min(prefix, common_prefix(sequences[members[-1]], sequences[index]))
        shared = min(shared, length - 1, *(len(sequences[m]) - 1 for m in members))
        current = _group_cost(sequences, members, prefix)
        joined = _group_cost(sequences, [*members, index], shared)
        if joined <= current + length - shared + CHUNK_OVERHEAD_TOKENS:
            members.append(index)
            prefix = shared
        else:
            groups.append(_close(sequences, members, prefix))
            members, prefix = [index], length
    if members:
        groups.append(_close(sequences, members, prefix))
    return groups


def _group_cost(sequences, members: Sequence[int], prefix: int) -> int:
    if len(members) == 1:
        return len(sequences[members[0]])
    return prefix + len(members) * max(len(sequences[m]) - prefix for m in members)


def _close(sequences, members: list[int], prefix: int) -> Group:
    if len(members) == 1:
        return Group((members[0],), len(sequences[members[0]]))
    return Group(tuple(members), prefix)


class OnnxBackend(Backend):
    name = "onnx"

    def __init__(self, path: Path, n_threads: int | None = None, options: OnnxOptions | None = None,
                 progress: bool = False) -> None:
        super().__init__(path, n_threads)
        options = options or OnnxOptions()
        self.progress = progress
        self.session = DecoderSession(self.path, n_threads)
        self.n_ctx = self.session.n_ctx
        self.n_vocab = self.session.n_vocab
        self.max_batch_bytes = options.max_batch_bytes
        self.prefix_chunk = options.prefix_chunk
        self.share_prefixes = options.share_prefixes

    def _logits(self, requests: Sequence[TokenRequest]):
        sequences = [r.tokens for r in requests]
        if self.share_prefixes:
            groups = plan_groups(sequences)
        else:
            groups = [Group((i,), len(s)) for i, s in enumerate(sequences)]
        cache = PrefixCache() if self.share_prefixes else None
        with tqdm(total=len(requests), desc="onnx scoring", unit="req", disable=not self.progress, leave=False) as bar:
            for group in groups:
                for index, rows in self._group_logits(requests, group, cache):
                    yield Gather.whole(index, requests[index]), rows
                bar.update(len(group.members))

    def _group_logits(self, requests: Sequence[TokenRequest], group: Group, cache: PrefixCache | None = None):
        """Yield (request index, logits rows predicting its scored tokens [n_scored, V])."""
        prefix_len = group.prefix_len
        first_row = min(requests[m].score_from for m in group.members) - 1
        anchor = requests[group.members[0]].tokens
        prefix_logits, past = self._run_prefix(anchor[:prefix_len], min(first_row, prefix_len), cache)
        if len(group.members) == 1:
            yield group.members[0], prefix_logits[: len(anchor) - 1 - first_row]
            return
        by_length = sorted(group.members, key=lambda m: len(requests[m].tokens))
        for chunk in self._chunks(requests, by_length, prefix_len):
            yield from self._run_continuations(requests, chunk, prefix_len, first_row, prefix_logits, past)

    def _run_prefix(self, tokens: Sequence[int], logits_from: int, cache: PrefixCache | None = None
                    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """Run tokens in pieces, after what `cache` already holds of them; logits of positions >= logits_from, and
        the past of all tokens."""
        if not tokens:
            return np.zeros((0, self.n_vocab), dtype=np.float32), None
        done = cache.reusable(tokens, logits_from) if cache is not None else 0
        past = cache.past_of(done) if done else None
        pieces = [np.zeros((0, self.n_vocab), dtype=np.float32)]
        while done < len(tokens):
            piece = tokens[done : done + self.prefix_chunk]
            start = min(max(logits_from - done, 0), len(piece))
            logits, past = self.session.run_sequence(piece, start, past, past_len=done)
            self.count_forward(len(piece))
            pieces.append(logits)
            done += len(piece)
        if cache is not None:
            cache.keep(tokens, past)
        return np.concatenate(pieces, axis=0), past

    def _chunks(self, requests, members: list[int], prefix_len: int) -> list[list[int]]:
        """Cut members (sorted by length) into batches: least padded compute, each within max_batch_bytes.

        Every batch pads to its longest continuation, so mixed lengths waste compute; a batch costs
        size * longest + CHUNK_OVERHEAD_TOKENS, minimised over contiguous cuts (small dynamic programme).
        """
        lengths = [len(requests[m].tokens) - prefix_len for m in members]
        kv = self.session.kv_bytes_per_token

        def fits(size: int, longest: int) -> bool:
            per_row = longest * self.n_vocab * 4 + 2 * (prefix_len + longest) * kv  # logits, past and present
            return size == 1 or size * per_row <= self.max_batch_bytes

        best = [0.0] + [float("inf")] * len(members)
        cut = [0] * (len(members) + 1)
        for end in range(1, len(members) + 1):
            for begin in range(end - 1, -1, -1):
                size = end - begin
                if not fits(size, lengths[end - 1]):
                    break
                cost = best[begin] + size * lengths[end - 1] + CHUNK_OVERHEAD_TOKENS
                if cost < best[end]:
                    best[end], cut[end] = cost, begin
        chunks, end = [], len(members)
        while end:
            chunks.append(members[cut[end] : end])
            end = cut[end]
        return chunks[::-1]

    def _run_continuations(self, requests, chunk, prefix_len, first_row, prefix_logits, past):
        batch = len(chunk)
        suffixes = [requests[m].tokens[prefix_len:] for m in chunk]
        width = max(map(len, suffixes))
        ids = np.zeros((batch, width), dtype=np.int64)
        mask = np.zeros((batch, prefix_len + width), dtype=np.int64)
        mask[:, :prefix_len] = 1
        for row, suffix in enumerate(suffixes):
            ids[row, : len(suffix)] = suffix
            mask[row, prefix_len : prefix_len + len(suffix)] = 1
        positions = np.broadcast_to(np.arange(prefix_len, prefix_len + width, dtype=np.int64), (batch, width))
        repeated = None if past is None else [np.repeat(p, batch, axis=0) for p in past]
        start = max(0, min(requests[m].score_from for m in chunk) - 1 - prefix_len)
        logits, _ = self.session.run(ids, mask, positions, repeated, logits_start=start, want_present=False)
        self.count_forward(ids.size)
        padding = int(ids.size - sum(map(len, suffixes)))
        self.stats.extra["padding_tokens"] = self.stats.extra.get("padding_tokens", 0) + padding
        prefix_first = min(first_row, prefix_len)
        for row, m in enumerate(chunk):
            request = requests[m]
            wanted = np.arange(request.score_from - 1, len(request.tokens) - 1)  # absolute positions of the rows
            from_prefix = prefix_logits[wanted[wanted < prefix_len] - prefix_first]
            from_suffix = logits[row, wanted[wanted >= prefix_len] - prefix_len - start]
            yield m, np.concatenate([from_prefix, from_suffix], axis=0)

    def _decoder(self, max_new_tokens: int) -> "OnnxDecoder":
        return OnnxDecoder(self)

    def _release(self) -> None:
        self.session = None


class OnnxDecoder(Decoder):
    """Greedy-decoding state: every sequence's past in one batch, left-aligned, holes masked out."""

    def __init__(self, backend: OnnxBackend) -> None:
        self.backend = backend
        self.session = backend.session
        self.ids: list[int] = []  # start-context index of each batch row
        self.past: list[np.ndarray] = []
        self.mask = np.zeros((0, 0), dtype=np.int64)
        self.lengths = np.zeros(0, dtype=np.int64)  # real tokens so far = the next token's position

    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        self.backend._require_open()
        self.backend.check_context(contexts)
        contexts = [tuple(c) for c in contexts]
        unique = {context: None for context in contexts}
        for context in unique:  # identical contexts (e.g. several bans of one prompt) run once
            logits, past = self.backend._run_prefix(context, len(context) - 1)
            unique[context] = (logits[-1], past)
        width = max(map(len, contexts))
        session = self.session
        shape = (len(contexts), session.n_kv_heads, width, session.head_dim)
        self.past = [np.zeros(shape, dtype=session.kv_dtype) for _ in session.past_names]
        self.mask = np.zeros((len(contexts), width), dtype=np.int64)
        for row, context in enumerate(contexts):
            for target, source in zip(self.past, unique[context][1]):
                target[row, :, : len(context)] = source[0]
            self.mask[row, : len(context)] = 1
        self.ids = list(range(len(contexts)))
        self.lengths = np.array([len(c) for c in contexts], dtype=np.int64)
        return np.stack([unique[c][0] for c in contexts]).astype(np.float32, copy=False)

    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        check_step(active, tokens)
        if not len(active):
            return np.zeros((0, self.backend.n_vocab), dtype=np.float32)
        if list(active) != self.ids:
            self._keep(active)
        if int(self.lengths.max()) >= self.backend.n_ctx:
            raise ContextTooLongError(f"decoding ran past the model's context of {self.backend.n_ctx}")
        batch = len(active)
        ids = np.asarray(tokens, dtype=np.int64).reshape(batch, 1)
        mask = np.concatenate([self.mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        logits, self.past = self.session.run(ids, mask, self.lengths[:, None], self.past)
        self.backend.count_forward(batch)
        self.mask = mask
        self.lengths = self.lengths + 1
        return logits[:, -1].astype(np.float32, copy=False)

    def _keep(self, active: Sequence[int]) -> None:
        """Select the rows of the still-active sequences and drop past columns no row uses any more."""
        where = {seq: row for row, seq in enumerate(self.ids)}
        missing = [a for a in active if a not in where]
        if missing:
            raise ValueError(f"sequences {missing} are not active in this decoder")
        rows = np.array([where[a] for a in active])
        mask = self.mask[rows]
        used = np.flatnonzero(mask.any(axis=0))
        self.mask = np.ascontiguousarray(mask[:, used])
        self.past = [np.ascontiguousarray(p[rows][:, :, used]) for p in self.past]
        self.lengths = self.lengths[rows]
        self.ids = list(active)

    def close(self) -> None:
        self.past = []
