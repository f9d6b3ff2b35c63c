"""Prefix sharing: a compressed prefix tree of token sequences, packed into KV-cache-sized groups.

Backend-independent. Each trie node is a run of tokens computed once and tagged with the KV sequence ids of every
sequence below it, so one forward pass attends along each root-to-leaf path as if it were alone. `pack` splits the
tree into groups that fit a token budget (the KV cache) and a sequence budget (llama.cpp's n_seq_max); a subtree too
big for one group is split and its prefix is then recomputed in every group that needs it (counted).
The scoring and decoding plans built on this live in fastscore.engine.plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Node:
    """A run of tokens at depths [start, start + len(tokens)); `owners` are the sequences ending exactly here."""

    start: int
    tokens: np.ndarray
    parent: Node | None
    children: list[Node] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def path(self) -> list[Node]:
        """Ancestors then self, root excluded, top-down."""
        out, node = [], self
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (the one helper every sharing engine uses)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def distinct_prefix_positions(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """0-based position of every node token of the trie of `sequences`: each distinct prefix once.

    Its size is the trie-minimal token count, the fewest tokens any prefix-sharing engine must compute.
    """
    ordered = sorted(tuple(s) for s in sequences)
    positions: list[np.ndarray] = []
    previous: tuple[int, ...] = ()
    for seq in ordered:
        positions.append(np.arange(common_prefix(previous, seq), len(seq)))
        previous = seq
    return np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)


def distinct_prefix_count(sequences: Sequence[Sequence[int]]) -> int:
    """Tokens of the trie of `sequences` (see distinct_prefix_positions)."""
    return int(distinct_prefix_positions(sequences).size)


class Trie:
    """A radix tree of `sequences` (each non-empty); `end_node[i]` is the node where sequence i ends.

    Built from the sequences in sorted order: each one shares exactly its longest common prefix with its sorted
    predecessor, so the tree is assembled along one stack of the previous path (no per-token dict walks).
    """

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        self.sequences = [np.asarray(s, dtype=np.int32) for s in sequences]
        if any(s.ndim != 1 or len(s) == 0 for s in self.sequences):
            raise ValueError("every sequence must be a non-empty 1-D run of token ids")
        self.root = Node(start=0, tokens=np.zeros(0, dtype=np.int32), parent=None)
        self.end_node: list[Node] = [self.root] * len(self.sequences)
        order = sorted(range(len(self.sequences)), key=lambda i: tuple(self.sequences[i].tolist()))
        stack, previous = [self.root], None
        for i in order:
            seq = self.sequences[i]
            shared = 0 if previous is None else common_prefix(previous, seq)
            while len(stack) > 1 and stack[-1].start >= shared:
                stack.pop()
            top = stack[-1]
            if top.end > shared:
                self._split(top, shared)
            if len(seq) > shared:
                child = Node(start=shared, tokens=seq[shared:], parent=top)
                top.children.append(child)
                stack.append(child)
                top = child
            top.owners.append(i)
            self.end_node[i] = top
            previous = seq

    def _split(self, node: Node, at: int) -> None:
        """Cut node at depth `at`: node keeps [start, at), a new child takes the rest, children and owners."""
        tail = Node(start=at, tokens=node.tokens[at - node.start :], parent=node, children=node.children,
                    owners=node.owners)
        for child in tail.children:
            child.parent = tail
        for owner in tail.owners:
            self.end_node[owner] = tail
        node.tokens, node.children, node.owners = node.tokens[: at - node.start], [tail], []

    def nodes(self) -> list[Node]:
        """All nodes but the root, in preorder (every parent before its children)."""
        out, stack = [], list(reversed(self.root.children))
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    @property
    def requested_tokens(self) -> int:
        return int(sum(len(s) for s in self.sequences))

    @property
    def minimal_tokens(self) -> int:
        """Distinct prefixes: the least any prefix-sharing engine must compute."""
        return int(sum(len(n.tokens) for n in self.nodes()))

    @property
    def max_length(self) -> int:
        return max((len(s) for s in self.sequences), default=0)


def leaf_owners(node: Node) -> list[int]:
    """Scoring: one KV sequence per leaf; sequences ending above a leaf, or duplicates, ride along for free."""
    return [] if node.children else node.owners[:1]


def all_owners(node: Node) -> list[int]:
    """Decoding: every sequence gets its own KV sequence, since each will grow independently."""
    return list(node.owners)


@dataclass
class Group:
    """One KV-cache load: nodes in preorder and the sequences given a KV sequence id, in id order."""

    nodes: list[Node]
    owners: list[int]
    n_tokens: int

    def seq_ids(self, trie: Trie) -> dict[int, list[int]]:
        """id(node) -> the group-local sequence ids of every owner at or below it."""
        member = {id(n) for n in self.nodes}
        out: dict[int, list[int]] = {id(n): [] for n in self.nodes}
        for local, owner in enumerate(self.owners):
            node = trie.end_node[owner]
            while node.parent is not None:
                if id(node) not in member:
                    raise AssertionError("a group holds a sequence but not its whole path")
                out[id(node)].append(local)
                node = node.parent
        return out


class _GroupBuilder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.member: set[int] = set()
        self.owners: list[int] = []
        self.tokens = 0
        self.reserved = 0

    def missing_path(self, node: Node | None) -> list[Node]:
        """Ancestors of node (inclusive) not yet in the group, top-down."""
        out = []
        while node is not None and node.parent is not None and id(node) not in self.member:
            out.append(node)
            node = node.parent
        return out[::-1]

    def add_path(self, node: Node | None) -> None:
        for n in self.missing_path(node):
            self.nodes.append(n)
            self.member.add(id(n))
            self.tokens += len(n.tokens)

    def group(self) -> Group:
        return Group(nodes=self.nodes, owners=self.owners, n_tokens=self.tokens)


def pack(
    trie: Trie,
    max_tokens: int,
    max_seqs: int,
    owners_of: Callable[[Node], list[int]] = leaf_owners,
    reserve_per_seq: int = 0,
) -> list[Group]:
    """Split the trie into groups of at most max_tokens tokens (plus reserve_per_seq per owner) and max_seqs owners.

    Greedy over subtrees in preorder: a whole subtree joins the current group if it fits, else starts a new group
    if it fits in an empty one, else it is opened up (each child subtree tried in turn, then the sequences ending
    on the node itself), which is the only case where a prefix is computed in more than one group.
    """
    if max_seqs < 1 or max_tokens < 1:
        raise ValueError("the token and sequence budgets must be positive")
    longest = trie.max_length + reserve_per_seq
    if longest > max_tokens:
        raise ValueError(f"a sequence needs {longest} tokens but a group holds only {max_tokens}")
    sub_tokens: dict[int, int] = {}
    sub_owners: dict[int, int] = {}
    for node in reversed(trie.nodes()):
        sub_tokens[id(node)] = len(node.tokens) + sum(sub_tokens[id(c)] for c in node.children)
        sub_owners[id(node)] = len(owners_of(node)) + sum(sub_owners[id(c)] for c in node.children)

    groups: list[Group] = []
    cur = _GroupBuilder()

    def fits(extra_tokens: int, extra_owners: int) -> bool:
        return (cur.tokens + cur.reserved + extra_tokens <= max_tokens
                and len(cur.owners) + extra_owners <= max_seqs)

    def close() -> None:
        nonlocal cur
        if cur.nodes:
            groups.append(cur.group())
        cur = _GroupBuilder()

    def add_subtree(node: Node) -> None:
        cur.add_path(node.parent)
        stack = [node]
        while stack:
            n = stack.pop()
            cur.nodes.append(n)
            cur.member.add(id(n))
            cur.tokens += len(n.tokens)
            own = owners_of(n)
            cur.owners.extend(own)
            cur.reserved += reserve_per_seq * len(own)
            stack.extend(reversed(n.children))

    # Entries: (node, True) = place the whole subtree; (node, False) = place only the sequences ending on node.
    stack: list[tuple[Node, bool]] = [(c, True) for c in reversed(trie.root.children)]
    while stack:
        node, whole = stack.pop()
        if not whole:
            for owner in owners_of(node):
                if not fits(sum(len(n.tokens) for n in cur.missing_path(node)) + reserve_per_seq, 1):
                    close()
                cur.add_path(node)
                cur.owners.append(owner)
                cur.reserved += reserve_per_seq
            continue
        cost = sub_tokens[id(node)] + reserve_per_seq * sub_owners[id(node)]
        path_cost = sum(len(n.tokens) for n in cur.missing_path(node.parent))
        if fits(path_cost + cost, sub_owners[id(node)]):
            add_subtree(node)
            continue
        if node.start + cost <= max_tokens and sub_owners[id(node)] <= max_seqs:
            close()
            add_subtree(node)
            continue
        # Too big for any group: open it. Its children go first; the sequences ending on the node itself need no
        # token beyond its path, so they fill in afterwards wherever that path already is.
        stack.append((node, False))
        stack.extend((c, True) for c in reversed(node.children))
    close()
    return groups
