"""Greedy decoding on llama.cpp with one KV stream per context (`kv_unified = false`).

In a unified cache every step's tokens attend over the cells of all contexts in the cache (masked), so a step over
32 contexts costs about 32 single-context steps of attention. With one stream per sequence each token attends only
over its own stream, which is what lets batched steps approach the prefill rate (docs/performance.md).

A stream cannot share cells with another, so prefixes are shared by copying: each trie node is computed once, in the
stream of the first context below it, and a whole-stream copy (`llama_memory_seq_cp` across streams, run by
llama.cpp before the next decode) hands the finished prefix to every other branch. A token may belong to one stream
only, so each node is its own llama_decode call.

llama.cpp splits a multi-stream batch into micro-batches at every gap in the stream ids it holds, so when contexts
finish, the highest live streams are moved (copied) into the holes and every step runs on streams 0..k-1.

Refilling (`reserve_slots`, then `join_step`): one llama context of as many streams as slots, each sized for the
longest context; a context joining between steps takes a finished context's stream. Its prefix is not computed
again where some stream still holds it: that stream (or the whole-stream copy of another) is cut back to the shared
prefix (`llama_memory_seq_rm`), the rest but the last token is prefilled, and the last token runs in the step with
the others, so the step stays one micro-batch over streams 0..k-1.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastscore.backends.kvcache import GroupedDecoder, MeteredCache
from fastscore.backends.llamacpp_batch import ContextSettings, LlamaCache, new_context
from fastscore.backends.options import KV_CACHE_TYPES
from fastscore.engine.plan import Batch, step_batch
from fastscore.engine.trie import Node, Trie

log = logging.getLogger(__name__)

CELL_PAD = 256  # llama.cpp pads the attended cell count to 256; a stream's size is rounded the same way
# A whole-stream copy moves every cell of the stream: below this many shared tokens computing them again is as cheap.
MIN_COPIED_PREFIX = 32


def padded(n_cells: int) -> int:
    return -(-max(n_cells, 1) // CELL_PAD) * CELL_PAD


@dataclass(frozen=True)
class StreamGroup:
    """Contexts decoded in one llama context: `members` (indices into the start contexts), one stream each, every
    stream `cells` long."""

    members: tuple[int, ...]
    cells: int


def stream_groups(lengths: Sequence[int], order: Sequence[int], reserve: int, max_streams: int,
                  max_cells: int) -> list[StreamGroup]:
    """Consecutive runs of `order` (trie order keeps shared prefixes together) of at most `max_streams` contexts whose
    streams (each padded(longest + reserve) cells) fit `max_cells` cells in all; a context alone always fits."""
    groups: list[StreamGroup] = []
    members: list[int] = []
    longest = 0
    for i in order:
        wider = max(longest, lengths[i])
        if members and (len(members) >= max_streams or (len(members) + 1) * padded(wider + reserve) > max_cells):
            groups.append(StreamGroup(tuple(members), padded(longest + reserve)))
            members, wider = [], lengths[i]
        members.append(i)
        longest = wider
    if members:
        groups.append(StreamGroup(tuple(members), padded(longest + reserve)))
    return groups


def kv_cell_bytes(n_layer: int, n_head_kv: int, key_length: int, value_length: int, kv_type: str) -> float:
    """Bytes of K and V one cell holds over all layers, as the KV type stores them."""
    return n_layer * n_head_kv * (key_length + value_length) * KV_CACHE_TYPES[kv_type].bytes_per_value


def kv_bytes_per_cell(L, model, kv_type: str) -> float:
    """kv_cell_bytes of a loaded model: head sizes from GGUF key_length/value_length, else n_embd / n_head."""
    n_head = max(int(L.llama_model_n_head(model)), 1)
    default = int(L.llama_model_n_embd(model)) // n_head
    arch = _meta(L, model, "general.architecture")
    k_len = int(_meta(L, model, f"{arch}.attention.key_length") or default)
    v_len = int(_meta(L, model, f"{arch}.attention.value_length") or default)
    return kv_cell_bytes(int(L.llama_model_n_layer(model)), int(L.llama_model_n_head_kv(model)), k_len, v_len,
                         kv_type)


def _meta(L, model, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else ""


class _Stream:
    """One group's llama context, its KV memory and which stream each still-decoding member occupies."""

    def __init__(self, cache, memory, group: StreamGroup, n_batch: int, n_streams: int) -> None:
        self.cache, self.memory, self.group, self.n_batch = cache, memory, group, n_batch
        self.n_streams = n_streams
        self.stream_of = {member: k for k, member in enumerate(group.members)}
        self.held: dict[int, list[int]] = {}  # stream -> the tokens whose K/V it holds at positions 0, 1, ...


class StreamDecoder(GroupedDecoder):
    """Greedy decoding with one KV stream per context: prefixes computed once and copied, steps attend per stream.

    `backend` supplies the model (`_L`, `_model`, `_buffer`, `n_vocab`), `decode_stream_settings(n)` and
    `max_stream_cells()`; `reserve` is the most tokens any context will generate.
    """

    refills = True

    def __init__(self, backend, reserve: int) -> None:
        super().__init__(backend, reserve)
        self.groups: list[_Stream] = []
        self.room: tuple[int, int] | None = None  # refilling: (streams, cells per stream) of the one group

    def reserve_slots(self, slots: int, longest: int) -> int:
        cells = padded(longest)
        fit = max(self.backend.max_stream_cells() // cells, 1)
        self.room = (max(1, min(slots, self.backend.n_seq_max, fit)), cells)
        return self.room[0]

    # --- prefill ---

    def start(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        self._begin(contexts)
        backend = self.backend
        self.n_vocab = backend.n_vocab
        out = np.empty((len(contexts), self.n_vocab), dtype=np.float32)
        if not contexts:
            return out
        lengths = [len(c) for c in contexts]
        if self.room is not None:  # refilling: one group of room[0] streams; members in trie order as below
            if len(contexts) > self.room[0]:
                raise ValueError(f"{len(contexts)} contexts for {self.room[0]} reserved slots")
            members = tuple(sorted(range(len(contexts)), key=lambda i: tuple(contexts[i])))
            plan, n_streams = [StreamGroup(members, self.room[1])], self.room[0]
        else:
            order = sorted(range(len(contexts)), key=lambda i: tuple(contexts[i]))
            plan = stream_groups(lengths, order, self.reserve, backend.n_seq_max, backend.max_stream_cells())
            n_streams = 0
        self.group_of = [-1] * len(contexts)
        for g, group in enumerate(plan):
            for member in group.members:
                self.group_of[member] = g
            self.groups.append(self._open(group, n_streams or len(group.members)))
            self._prefill(self.groups[-1], [contexts[i] for i in group.members], out)
            self.groups[-1].held = {k: list(contexts[m]) for k, m in enumerate(group.members)}
        self.next_pos = lengths
        return out

    def _open(self, group: StreamGroup, n_streams: int) -> _Stream:
        backend, L = self.backend, self.backend._L
        settings: ContextSettings = backend.decode_stream_settings(n_streams)
        n_batch = settings.n_ubatch  # at least one token per stream: a step is one micro-batch
        ctx = new_context(L, backend._model, group.cells * n_streams, n_batch, settings, unified=False)
        cache = MeteredCache(LlamaCache(L, ctx, backend._buffer, self.n_vocab, owns_ctx=True), backend)
        cache.clear()
        return _Stream(cache, L.llama_get_memory(ctx), group, n_batch, n_streams)

    def _prefill(self, stream: _Stream, contexts: Sequence[Sequence[int]], out: np.ndarray) -> None:
        """Every trie node once, in the stream of the first context below it (members are in trie order, so that is
        the lowest local index); its stream copied to each child branch and each other context ending there."""
        trie = Trie(contexts)
        first: dict[int, int] = {}
        for node in reversed(trie.nodes()):  # children before parents
            below = [first[id(c)] for c in node.children] + list(node.owners)
            first[id(node)] = min(below)
        L, members = self.backend._L, stream.group.members
        piece = stream.n_batch
        for node in trie.nodes():  # parents before children: a node's prefix is in its stream when it runs
            s = first[id(node)]
            for lo in range(0, len(node.tokens), piece):
                hi = min(lo + piece, len(node.tokens))
                last = hi == len(node.tokens) and bool(node.owners)
                rows = stream.cache.forward(_run_batch(node, lo, hi, s, want_last=last))
                if last:
                    out[[members[o] for o in node.owners]] = rows[-1]
            # Copies are queued and run before the next decode, i.e. before anything else enters stream s.
            for target in [first[id(c)] for c in node.children] + list(node.owners):
                if target != s:
                    L.llama_memory_seq_cp(stream.memory, s, target, -1, -1)

    # --- steps ---

    def step(self, active: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        by_group = self._by_group(active, tokens)
        out = np.empty((len(active), self.n_vocab), dtype=np.float32)
        for g, ks in by_group.items():
            stream = self.groups[g]
            self._compact(stream, [active[k] for k in ks])
            ks = sorted(ks, key=lambda k: stream.stream_of[active[k]])  # ascending stream ids: one micro-batch
            batch = step_batch([stream.stream_of[active[k]] for k in ks], [tokens[k] for k in ks],
                               [self.next_pos[active[k]] for k in ks])
            out[ks] = stream.cache.forward(batch)
            for k in ks:
                self.next_pos[active[k]] += 1
                stream.held[stream.stream_of[active[k]]].append(int(tokens[k]))
        return out

    # --- refilling ---

    def join_step(self, active: Sequence[int], tokens: Sequence[int],
                  joining: Sequence[Sequence[int]]) -> np.ndarray:
        if self.room is None or not self.groups:
            raise ValueError("join_step() needs reserve_slots() and start() first")
        self._by_group(active, tokens)  # the misuse checks of step()
        if len(active) + len(joining) > self.room[0]:
            raise ValueError(f"{len(active)} live and {len(joining)} joining sequences for {self.room[0]} slots")
        self.backend.check_context(joining)
        stream = self.groups[0]
        new = list(range(len(self.group_of), len(self.group_of) + len(joining)))
        self.group_of += [0] * len(joining)
        self.next_pos += [len(c) - 1 for c in joining]  # the last context token runs in the step
        self._join(stream, active, dict(zip(new, joining)))
        return self.step([*active, *new], [*tokens, *(c[-1] for c in joining)])

    def _join(self, stream: _Stream, active: Sequence[int], joining: dict[int, Sequence[int]]) -> None:
        """Give each joining context a free stream holding all of it but its last token: the stream keeps (or
        receives a copy of) the longest prefix any stream holds, then the rest is prefilled."""
        L, mem = self.backend._L, stream.memory
        live = set(active)
        gone = [m for m in live if m not in stream.stream_of]
        if gone:
            raise ValueError(f"sequence {gone[0]} finished (it was left out of an earlier step) and cannot resume")
        for member in [m for m in stream.stream_of if m not in live]:
            stream.stream_of.pop(member)  # finished: its stream is free, what it holds may still be shared
        free = sorted(set(range(stream.n_streams)) - set(stream.stream_of.values()))
        for member, context in joining.items():
            want = list(context[:-1])
            shared = {k: _common_prefix(held, want) for k, held in stream.held.items()}
            target = max(free, key=lambda k: (shared.get(k, 0), -k))
            source = max(shared, key=lambda k: (shared[k], -k), default=target)
            keep = shared.get(target, 0)
            # A completion that parted from the one it followed (greedy_decode) finds all of its context in that
            # one's stream: copied whatever its length, so its K/V are the very ones its own steps computed.
            whole = shared.get(source, 0) == len(want) > keep
            if source != target and (shared[source] >= max(keep + MIN_COPIED_PREFIX, 1) or whole):
                # Queued: llama.cpp copies the stream before the next decode, before anything else writes to it.
                L.llama_memory_seq_cp(mem, source, target, -1, -1)
                keep = shared[source]
            L.llama_memory_seq_rm(mem, target, keep if keep else -1, -1)
            free.remove(target)
            stream.stream_of[member] = target
            stream.held[target] = want[:keep]
            self._prefill_rest(stream, target, want, keep)

    def _prefill_rest(self, stream: _Stream, target: int, want: Sequence[int], keep: int) -> None:
        """Tokens keep.. of `want` into stream `target` (no logits: the context's last token runs in the step)."""
        for lo in range(keep, len(want), stream.n_batch):
            hi = min(lo + stream.n_batch, len(want))
            n = hi - lo
            stream.cache.forward(Batch(tokens=np.asarray(want[lo:hi], dtype=np.int32),
                                       positions=np.arange(lo, hi, dtype=np.int32), outputs=np.zeros(n, dtype=bool),
                                       runs=((0, n, np.array([target], dtype=np.int32)),), n_seqs=target + 1))
        stream.held[target] = list(want)

    def _compact(self, stream: _Stream, live: Sequence[int]) -> None:
        """Move the live contexts on streams >= len(live) into the free streams below, so the live ones are exactly
        0..len(live)-1; finished contexts' streams are emptied."""
        L, mem = self.backend._L, stream.memory
        gone = [m for m in live if m not in stream.stream_of]
        if gone:  # its stream was emptied when it first sat out a step
            raise ValueError(f"sequence {gone[0]} finished (it was left out of an earlier step) and cannot resume")
        used = {stream.stream_of[m] for m in live}
        still = set(live)
        for member in [m for m in stream.stream_of if m not in still]:
            k = stream.stream_of.pop(member)
            L.llama_memory_seq_rm(mem, k, -1, -1)
            stream.held.pop(k, None)
        holes = sorted(set(range(len(live))) - used)
        movers = sorted((m for m in live if stream.stream_of[m] >= len(live)), key=stream.stream_of.get)
        for hole, member in zip(holes, movers):
            src = stream.stream_of[member]
            L.llama_memory_seq_cp(mem, src, hole, -1, -1)  # queued; the data stays until overwritten
            L.llama_memory_seq_rm(mem, src, -1, -1)
            stream.stream_of[member] = hole
            stream.held[hole] = stream.held.pop(src)

    def close(self) -> None:
        for stream in self.groups:
            stream.cache.close()
        self.groups, self.group_of = [], []


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def _run_batch(node: Node, lo: int, hi: int, stream: int, want_last: bool) -> Batch:
    """Tokens [lo, hi) of one trie node, all in one stream; logits only at the last if wanted."""
    n = hi - lo
    outputs = np.zeros(n, dtype=bool)
    outputs[-1] = want_last
    return Batch(tokens=np.asarray(node.tokens[lo:hi], dtype=np.int32),
                 positions=np.arange(node.start + lo, node.start + hi, dtype=np.int32), outputs=outputs,
                 runs=((0, n, np.array([stream], dtype=np.int32)),), n_seqs=stream + 1)
