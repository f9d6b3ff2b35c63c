"""Batched greedy decoding over a backend `Decoder`, with banned completions enforced on text.

Many contexts advance together: one `Decoder.step` call per generated position for every still-active sequence.
With a decoder that refills (`Decoder.refills`) and a `width`, at most `width` sequences are live and a finished
one's slot goes at once to the next waiting context (`Decoder.join_step`), so the steps stay full until the waiting
contexts run out instead of each batch stepping on for its longest member alone. There, a greedy context that repeats
an earlier one under another ban (the study's `ban` condition repeats `after`) runs no sequence of its own while the
two write the same tokens: it reads the earlier one's logits and joins only where its ban makes it choose another
token (most never do), its stream a copy of the one it followed.

Banned strings are banned as TEXT, whatever tokens spell them. A completion is complete when the end-of-turn
token is emitted or the token limit is hit, so at each step the ban blocks exactly the tokens that would complete a
banned text:
- the stop tokens, whenever the text decoded so far equals a banned string;
- at the step that reaches the limit, also every token whose bytes appended to the text make it equal a banned string.
Texts are compared as UTF-8 bytes after stripping surrounding ASCII whitespace. With `ban_prefix`, a completion may
not even START with a banned text (the banned call followed by anything): every token that would complete the banned
text as a prefix is blocked at every step (`PrefixBan`). The probability mass the ban removed
(softmax mass of the blocked tokens, summed over steps) and the number of steps at which it blocked anything are
reported, so a caller can see how much the ban distorted the model's choice.

Each context may have its own token budget (a context leaves the batch at its own limit; the ban's "final step" is
that context's own last step) and an `action_done` rule: a predicate on the text generated so far saying the
action is written (e.g. a closed fenced program). Once it holds, exactly one more token decides the completion: a stop
token ends it as END_OF_TURN, as without the rule; any other token ends it as ACTION_DONE, since whatever the model
would write next changes neither the action nor whether it ended its turn right after it. Only while a ban could
still act on a longer text (the text, stripped, is still a prefix of a banned text) does decoding go on, so the
reported banned mass is the one decoding to the end would give.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fastscore.backends.base import Decoder
from fastscore.mathops import softmax, softmax_in_place


END_OF_TURN = "end_of_turn"
MAX_TOKENS = "max_tokens"
ACTION_DONE = "action_done"  # the action_done rule held and the next token was not a stop token

# A predicate on the text generated so far (UTF-8, an incomplete last character replaced) that, once true, stays
# true as the text grows: the action is written, what follows cannot change it.
ActionDone = Callable[[str], bool]


@dataclass(frozen=True)
class Decoded:
    """One greedy completion: its token ids (stop token excluded) and how the ban acted on it."""

    token_ids: tuple[int, ...]
    stopped_by: str  # END_OF_TURN, MAX_TOKENS or ACTION_DONE
    banned_mass: float
    banned_steps: int


class TextBan:
    """Which token ids would complete one of a set of banned texts, given the bytes generated so far."""

    def __init__(self, token_bytes: Sequence[bytes], stop_ids: Iterable[int], n_vocab: int) -> None:
        self.stop_ids = np.array(sorted(stop_ids), dtype=np.int64)
        stops = set(self.stop_ids.tolist())
        self._by_strip: dict[bytes, list[int]] = defaultdict(list)
        self._by_rstrip: dict[bytes, list[int]] = defaultdict(list)
        blank = []
        for token_id in range(n_vocab):
            if token_id in stops:
                continue
            piece = token_bytes[token_id] if token_id < len(token_bytes) else b""
            stripped = piece.strip()
            if stripped:
                self._by_strip[stripped].append(token_id)
                self._by_rstrip[piece.rstrip()].append(token_id)
            else:
                blank.append(token_id)
        self._blank = np.array(blank, dtype=np.int64)  # whitespace-only tokens: they leave the stripped text as is

    def blocked(self, text: bytes, banned: frozenset[bytes], final_step: bool) -> np.ndarray:
        """Token ids to block after `text`; `banned` holds stripped banned texts; `final_step`: this token is the last.

        Not at the final step, only a stop token can complete the text. At the final step any token does.
        """
        if not banned:
            return self.stop_ids[:0]
        matches_now = text.strip() in banned
        parts = [self.stop_ids] if matches_now else []
        if final_step:
            if matches_now:
                parts.append(self._blank)
            head = text.lstrip()
            for key in banned:
                if not head:  # only whitespace so far: the token alone must spell the banned text
                    parts.append(np.array(self._by_strip.get(key, ()), dtype=np.int64))
                elif len(key) > len(head) and key.startswith(head):
                    parts.append(np.array(self._by_rstrip.get(key[len(head) :], ()), dtype=np.int64))
        if not parts:
            return self.stop_ids[:0]
        return np.unique(np.concatenate(parts))


class PrefixBan:
    """Which token ids would make the text generated so far start with a banned text (after leading whitespace)."""

    def __init__(self, token_bytes: Sequence[bytes], stop_ids: Iterable[int], n_vocab: int) -> None:
        stops = set(int(i) for i in stop_ids)
        pieces = [(token_bytes[i] if i < len(token_bytes) else b"", i) for i in range(n_vocab) if i not in stops]
        # Sorted pieces: the tokens starting with some bytes are one contiguous run, found by bisection.
        self._pieces = sorted((piece, i) for piece, i in pieces if piece)
        self._leading = sorted((piece.lstrip(), i) for piece, i in pieces if piece.strip())

    @staticmethod
    def _starting_with(index: list[tuple[bytes, int]], prefix: bytes) -> list[int]:
        out, k = [], bisect.bisect_left(index, (prefix, -1))
        while k < len(index) and index[k][0].startswith(prefix):
            out.append(index[k][1])
            k += 1
        return out

    def blocked(self, text: bytes, banned: frozenset[bytes], final_step: bool) -> np.ndarray:
        head = text.lstrip()
        found: list[int] = []
        for key in banned:
            if not head:  # only whitespace so far: a token that (after its own whitespace) spells the key
                found += self._starting_with(self._leading, key)
            elif len(key) > len(head) and key.startswith(head):
                found += self._starting_with(self._pieces, key[len(head) :])
        return np.unique(np.array(found, dtype=np.int64))


@lru_cache(maxsize=4)
def prefix_ban(token_bytes: tuple[bytes, ...], stop_ids: frozenset[int], n_vocab: int) -> PrefixBan:
    return PrefixBan(token_bytes, stop_ids, n_vocab)


@lru_cache(maxsize=4)
def text_ban(token_bytes: tuple[bytes, ...], stop_ids: frozenset[int], n_vocab: int) -> TextBan:
    """The ban index of a vocabulary, built once per tokenizer (a pass over every token)."""
    return TextBan(token_bytes, stop_ids, n_vocab)


def _softmax_mass(logits: np.ndarray, ids: np.ndarray) -> float:
    return float(softmax(logits)[ids].sum())


def _choose(logits: np.ndarray, temperatures: Sequence[float],
            rngs: Sequence[np.random.Generator | None]) -> np.ndarray:
    """One token per row: its argmax where its temperature is 0, else drawn from softmax(row / temperature) by
    inverse CDF on the row's own uniform draw."""
    chosen = logits.argmax(axis=1)
    for row, (temperature, rng) in enumerate(zip(temperatures, rngs)):
        if temperature == 0:
            continue
        scaled = logits[row].astype(np.float64)
        if temperature != 1.0:  # x / 1.0 is x: the study's temperature skips a pass over the vocabulary
            scaled /= temperature
        cdf = np.cumsum(softmax_in_place(scaled))  # a banned token (-inf) gets 0
        chosen[row] = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)
    return chosen


def _per_context(value, n: int, what: str, cast: Callable) -> list:
    """One value for all n contexts, or one per context."""
    values = [cast(value)] * n if np.isscalar(value) else [cast(v) for v in value]
    if len(values) != n:
        raise ValueError(f"{len(values)} {what} for {n} contexts")
    return values


def per_context_temperatures(temperature: float | Sequence[float],
                             rngs: Sequence[np.random.Generator | None] | None, n: int) -> list[float]:
    """One temperature per context, each >= 0, with a generator wherever it is above 0 (`rngs`, where given, holds
    one entry per context)."""
    temperatures = _per_context(temperature, n, "temperatures", float)
    for t in temperatures:
        if t < 0:
            raise ValueError(f"temperature must be >= 0, not {t}")
    if rngs is not None and len(rngs) != n:
        raise ValueError(f"{len(rngs)} generators for {n} contexts")
    if any(t > 0 and (rngs is None or rngs[i] is None) for i, t in enumerate(temperatures)):
        raise ValueError("sampling (temperature > 0) needs a numpy Generator for each sampled context in `rngs`")
    return temperatures


def _budgets(max_new_tokens: int | Sequence[int], n: int) -> list[int]:
    budgets = _per_context(max_new_tokens, n, "token budgets", int)
    for budget in budgets:
        if budget < 1:
            raise ValueError(f"max_new_tokens must be >= 1, not {budget}")
    return budgets


def _ban_may_act(text: bytes, banned: frozenset[bytes]) -> bool:
    """Could a ban still block a token after `text` or any longer text? Only while the stripped text is a prefix of
    a banned text: every later text, stripped, starts with this one stripped."""
    head = text.strip()
    return any(key.startswith(head) for key in banned)


def followers(contexts: Sequence[Sequence[int]], budgets: Sequence[int],
              rules: Sequence[ActionDone | None], starts: Sequence[Sequence[int]] | None = None) -> dict[int, int]:
    """{follower: leader}: a context identical to an earlier one, with the same budget, action rule and start tokens
    (bans may differ). Greedy decoding writes the same tokens for both until a ban makes them differ, so the follower
    reads its leader's logits instead of running a sequence of its own, and leaves it only where they part."""
    first: dict[tuple, int] = {}
    out = {}
    for i, context in enumerate(contexts):
        # The rule by identity: the same rule object (the study shares one per call); equal but distinct rules,
        # or unhashable ones, only cost a sequence each.
        start = tuple(starts[i]) if starts is not None else ()
        leader = first.setdefault((tuple(context), start, budgets[i], id(rules[i])), i)
        if leader != i:
            out[i] = leader
    return out


def greedy_followers(contexts: Sequence[Sequence[int]], budgets: Sequence[int], rules: Sequence[ActionDone | None],
                     starts: Sequence[Sequence[int]] | None, temperatures: Sequence[float]) -> dict[int, int]:
    """`followers` among the greedy contexts (temperature 0): a sample draws its own tokens, so it neither follows
    another context nor leads one."""
    greedy = [i for i, t in enumerate(temperatures) if t == 0]

    def pick(values: Sequence) -> list:
        return [values[i] for i in greedy]

    found = followers(pick(contexts), pick(budgets), pick(rules), None if starts is None else pick(starts))
    return {greedy[f]: greedy[leader] for f, leader in found.items()}


def greedy_decode(
    decoder: Decoder,
    contexts: Sequence[Sequence[int]],
    *,
    token_bytes: Sequence[bytes],
    stop_ids: Iterable[int],
    max_new_tokens: int | Sequence[int],
    banned: Sequence[Iterable[str]] | None = None,
    ban_prefix: bool | Sequence[bool] = False,
    temperature: float | Sequence[float] = 0.0,
    rngs: Sequence[np.random.Generator | None] | None = None,
    action_done: Sequence[ActionDone | None] | None = None,
    width: int | None = None,
    starts: Sequence[Sequence[int]] | None = None,
) -> list[Decoded]:
    """Greedy completions of all `contexts` at once, each until a stop token or its token budget.

    `max_new_tokens`: one budget for all, or one per context. `banned[i]` lists texts completion i may never
    equal (with `ban_prefix`, one flag for all or one per context: never start with). `action_done[i]` (optional):
    completion i's action rule (see the module docstring). The decoder is closed when done.
    With `temperature` > 0 (one for all, or one per context) a completion is sampled instead, from
    softmax(logits / temperature), drawing from its own generator `rngs[i]` (one uniform draw per generated token), so
    it does not depend on which other contexts share the batch; greedy and sampled completions may share a call
    (rngs[i] None where temperature[i] is 0), and then share what their contexts have in common.
    `width`: with a decoder that refills (`Decoder.refills`), at most this many sequences are live at once and a
    finished one's slot goes at once to the next waiting context, in the order given; without it, or with a decoder
    that cannot refill, every context starts at once. With a refilling decoder and `width`, a greedy context that
    repeats an earlier one under another ban follows it (see `followers`): it joins as a sequence of its own (a copy
    of the earlier one's stream) only at the step where the ban makes it choose another token, if it ever does.
    `starts[i]` (optional): token ids completion i begins with, taken as given (GreedyRequest.start_ids): they count
    against its budget and its action rule reads them, they are prefilled with its context, and a completion they
    already end (a stop token, its budget, its action rule) runs no sequence at all.
    """
    n = len(contexts)
    budgets = _budgets(max_new_tokens, n)
    temperatures = per_context_temperatures(temperature, rngs, n)
    if action_done is not None and len(action_done) != n:
        raise ValueError(f"{len(action_done)} action_done rules for {n} contexts")
    if width is not None and width < 1:
        raise ValueError(f"width must be >= 1, not {width}")
    if starts is not None and len(starts) != n:
        raise ValueError(f"{len(starts)} start token lists for {n} contexts")
    if n == 0:
        return []
    stop_set = set(int(i) for i in stop_ids)
    banned_keys = [
        frozenset(text.encode().strip() for text in (banned[i] if banned else ())) for i in range(n)
    ]
    rules = list(action_done) if action_done is not None else [None] * n
    armed = [False] * n  # the action_done rule held after an earlier token
    generated: list[list[int]] = [[] for _ in range(n)]
    texts = [b""] * n
    mass = [0.0] * n
    steps_banned = [0] * n
    stopped = [MAX_TOKENS] * n
    prefix = [bool(ban_prefix)] * n if isinstance(ban_prefix, bool) else [bool(p) for p in ban_prefix]

    def advance(i: int, token: int) -> bool:
        """Completion i takes `token`; True while it goes on."""
        if token in stop_set:
            stopped[i] = END_OF_TURN
            return False
        generated[i].append(token)
        texts[i] += token_bytes[token] if token < len(token_bytes) else b""
        if armed[i] and not _ban_may_act(texts[i], banned_keys[i]):
            stopped[i] = ACTION_DONE
            return False
        if rules[i] is not None and not armed[i]:
            armed[i] = rules[i](texts[i].decode("utf-8", errors="replace"))
        return len(generated[i]) < budgets[i]

    def apply_ban(i: int, row: np.ndarray) -> None:
        """Block, in `row` (completion i's next-token logits), the tokens that would complete a banned text."""
        if ban is None or not banned_keys[i]:
            return
        blocked = ban[prefix[i]].blocked(texts[i], banned_keys[i], len(generated[i]) + 1 == budgets[i])
        if blocked.size:
            mass[i] += _softmax_mass(row, blocked)
            steps_banned[i] += 1
            row[blocked] = -np.inf

    ended = set()  # completions already ended by their start tokens
    for i, start in enumerate(starts or ()):
        for token in start:
            if not advance(i, int(token)):
                ended.add(i)
                break
    refilling = width is not None and decoder.refills
    following = greedy_followers(contexts, budgets, rules, starts, temperatures) if refilling else {}
    # A ban can keep a completion going where the same start tokens end its leader's (an armed action rule stops only
    # once no ban can act): such a follower runs as a sequence of its own.
    following = {f: leader for f, leader in following.items() if f not in ended and leader not in ended}
    followed_by: dict[int, list[int]] = defaultdict(list)
    for follower, leader in following.items():
        followed_by[leader].append(follower)
    # completions that start as sequences of their own
    own = [i for i in range(n) if i not in following and i not in ended]
    if not own:  # every completion is known from its start tokens: nothing to decode
        decoder.close()
        return [Decoded(tuple(generated[i]), stopped[i], mass[i], steps_banned[i]) for i in range(n)]
    with decoder:
        slots = n
        if refilling and (width < len(own) or following):
            slots = decoder.reserve_slots(min(width, n), max(len(c) + b for c, b in zip(contexts, budgets)))
        started = own[:slots]
        waiting = deque(own[slots:])
        parted: deque[int] = deque()  # followers whose leader chose another token, waiting for a slot
        seq_of = {i: k for k, i in enumerate(started)}  # completion -> the decoder's sequence number
        logits = np.asarray(decoder.start([list(contexts[i]) + generated[i] for i in started]))
        bans = {kind: make(tuple(token_bytes), frozenset(stop_set), logits.shape[1])
                for kind, make in ((False, text_ban), (True, prefix_ban))
                if any(keys and p == kind for keys, p in zip(banned_keys, prefix))}
        ban = bans or None
        active = list(started)
        while active:
            # A leader's logits as the model gave them, for its followers (its own ban must not act on theirs).
            shared = {i: np.array(logits[row], dtype=np.float32) for row, i in enumerate(active) if followed_by[i]}
            if ban is not None:  # blocked entries are overwritten: never write into the decoder's buffer
                logits = np.array(logits, dtype=np.float32, copy=True)
                for row, i in enumerate(active):
                    apply_ban(i, logits[row])
            chosen = _choose(logits, [temperatures[i] for i in active],
                             [None] * len(active) if rngs is None else [rngs[i] for i in active])
            still_active, next_tokens = [], []
            for i, token in zip(active, chosen.tolist()):
                if advance(i, token):
                    still_active.append(i)
                    next_tokens.append(token)
            going_on = set(still_active)
            for leader, row in shared.items():
                leader_token = int(chosen[active.index(leader)])
                for follower in list(followed_by[leader]):
                    mine = row.copy()
                    apply_ban(follower, mine)
                    token = int(mine.argmax())
                    goes_on = advance(follower, token)
                    if token == leader_token and goes_on and leader in going_on:
                        continue  # the same token, both go on: still the leader's completion
                    followed_by[leader].remove(follower)  # ended with it, or parts from it here
                    if goes_on:
                        parted.append(follower)
            joining = []
            while (parted or waiting) and len(still_active) + len(joining) < slots:
                joining.append(parted.popleft() if parted else waiting.popleft())
            # A completion that parted from its leader joins with the tokens it wrote: its stream starts as a copy
            # of the longest prefix a live stream holds (the leader's), so nothing already computed is computed again.
            for i in joining:  # the decoder numbers joining sequences on after every one started so far
                seq_of[i] = len(seq_of)
            active = still_active + joining
            if not active:
                break
            seqs = [seq_of[i] for i in still_active]
            if joining:
                logits = decoder.join_step(seqs, next_tokens,
                                           [list(contexts[i]) + generated[i] for i in joining])
            else:
                logits = decoder.step(seqs, next_tokens)
    return [Decoded(tuple(generated[i]), stopped[i], mass[i], steps_banned[i]) for i in range(n)]
