"""Batched greedy decoding over a backend `Decoder`, with banned completions enforced on text.

Many contexts advance together: one `Decoder.step` call per generated position for every still-active sequence.
With a decoder that refills (`Decoder.refills`) and a `width`, at most `width` sequences are live and a finished
one's slot goes at once to the next waiting context (`Decoder.join_step`), so the steps stay full until the waiting
contexts run out instead of each batch stepping on for its longest member alone. There, a greedy context that repeats
an earlier one under another ban (the study's `ban` condition repeats `after`) runs no sequence of its own while the
two write the same tokens: it reads the earlier one's logits and joins only where its ban makes it choose another
token (most never do), its stream a copy of the one it followed. A session may also take its contexts from a queue
(`queue_decode`): units of contexts (DecodeUnit, e.g. one item's requests) pulled whenever no context waits for a
free slot, each unit's completions handed back as its last one ends, so one session's steps stay full from its first
unit to its last.

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

from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fastscore.backends.base import Decoder
from fastscore.bans import ban_may_act, prefix_ban, softmax_mass, text_ban
from fastscore.decode_units import ActionDone, DecodeUnit, decode_unit, greedy_followers
from fastscore.mathops import softmax_in_place


END_OF_TURN = "end_of_turn"
MAX_TOKENS = "max_tokens"
ACTION_DONE = "action_done"  # the action_done rule held and the next token was not a stop token


@dataclass(frozen=True)
class Decoded:
    """One greedy completion: its token ids (stop token excluded) and how the ban acted on it."""

    token_ids: tuple[int, ...]
    stopped_by: str  # END_OF_TURN, MAX_TOKENS or ACTION_DONE
    banned_mass: float
    banned_steps: int


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
    if width is not None and width < 1:
        raise ValueError(f"width must be >= 1, not {width}")
    unit = decode_unit(None, contexts, max_new_tokens=max_new_tokens, banned=banned, ban_prefix=ban_prefix,
                       temperature=temperature, rngs=rngs, action_done=action_done, starts=starts)
    n = len(contexts)
    if n == 0:
        return []
    session = _Session(token_bytes, stop_ids)
    refilling = width is not None and decoder.refills
    own = session.add(unit, follow=refilling)  # completions that start as sequences of their own
    if not own:  # every completion is known from its start tokens: nothing to decode
        decoder.close()
        return session.results(0)
    with decoder:
        slots = n
        if refilling and (width < len(own) or session.following):
            slots = decoder.reserve_slots(min(width, n), unit.longest)
        session.run(decoder, own, slots, more=None)
    return session.results(0)


def queue_decode(decoder: Decoder, pull: Callable[[], DecodeUnit | None],
                 on_done: Callable[[Hashable, list[Decoded]], None], *, token_bytes: Sequence[bytes],
                 stop_ids: Iterable[int], width: int, longest: int) -> None:
    """The completions of units taken one after another from `pull` (None: no more), in one session of a refilling
    decoder: at most `width` sequences live, and a finished one's slot goes at once to the next waiting context,
    pulling the next unit when none waits (at most one a step while sequences go on). So the session's steps stay
    full from its first unit to its last, where separate calls would each end in steps of a few rows. Within a
    unit as greedy_decode (followers, start tokens, bans, samples). `on_done(key, completions)` as the last
    completion of a unit ends, in the calling thread (at once for a unit of no contexts). `longest`: the most tokens
    any unit's sequence will hold (DecodeUnit.longest), which sizes the decoder's slots.

    A completion's tokens depend on which others share its steps only where the backend's results depend on the
    batch: callers pull units from one queue in several sessions only on an exact type whose steps give a
    prefill's bits (Backend.steps_match_prefill)."""
    if not decoder.refills:
        raise ValueError(f"{type(decoder).__name__} cannot take sequences between steps: no queue to decode")
    session = _Session(token_bytes, stop_ids, on_done)

    def more() -> list[int] | None:
        unit = pull()
        if unit is None:
            return None
        if unit.longest > longest:
            raise ValueError(f"unit {unit.key!r} holds {unit.longest} tokens, more than the session's {longest}")
        return session.add(unit, follow=True)

    with decoder:
        slots = decoder.reserve_slots(width, longest)
        own: list[int] = []
        while not own:  # the first unit that decodes anything; the rest join a unit a step (_Session.run)
            got = more()
            if got is None:
                return
            own += got
        session.run(decoder, own, slots, more=more)


class _Session:
    """The completions of one decoding session: per-context state, contexts added unit by unit, and the loop that
    steps every live sequence at once."""

    def __init__(self, token_bytes: Sequence[bytes], stop_ids: Iterable[int],
                 on_done: Callable[[Hashable, list[Decoded]], None] | None = None) -> None:
        self.token_bytes = token_bytes
        self.stop_set = set(int(i) for i in stop_ids)
        self.on_done = on_done
        self.units: list[tuple[Hashable, int, int]] = []  # (key, index of its first context, contexts)
        self.left: list[int] = []  # per unit: completions not ended yet
        self.unit_of: list[int] = []
        self.contexts: list[Sequence[int] | None] = []
        self.budgets: list[int] = []
        self.temperatures: list[float] = []
        self.rngs: list[np.random.Generator | None] = []
        self.keys: list[frozenset[bytes]] = []
        self.prefix: list[bool] = []
        self.rules: list[ActionDone | None] = []
        self.armed: list[bool] = []  # the action_done rule held after an earlier token
        self.generated: list[list[int]] = []
        self.texts: list[bytes] = []
        self.mass: list[float] = []
        self.steps_banned: list[int] = []
        self.stopped: list[str] = []
        self.following: dict[int, int] = {}  # follower -> leader, while it follows
        self.followed_by: dict[int, list[int]] = defaultdict(list)
        self.n_vocab: int | None = None
        self.bans: dict[bool, object] = {}  # ban_prefix -> the vocabulary's index (TextBan or PrefixBan)

    def add(self, unit: DecodeUnit, follow: bool) -> list[int]:
        """Takes in a unit's contexts; returns those that start as sequences of their own (not following another,
        not already ended by their start tokens). `follow`: greedy contexts may follow an identical earlier one."""
        base, n = len(self.contexts), len(unit.contexts)
        self.units.append((unit.key, base, n))
        self.left.append(n)
        self.unit_of += [len(self.units) - 1] * n
        self.contexts += list(unit.contexts)
        self.budgets += list(unit.budgets)
        self.temperatures += list(unit.temperatures)
        self.rngs += list(unit.rngs)
        self.keys += list(unit.banned)
        self.prefix += list(unit.ban_prefix)
        self.rules += list(unit.action_done)
        self.armed += [False] * n
        self.generated += [[] for _ in range(n)]
        self.texts += [b""] * n
        self.mass += [0.0] * n
        self.steps_banned += [0] * n
        self.stopped += [MAX_TOKENS] * n
        ended = set()  # completions ended by their start tokens
        for k, start in enumerate(unit.starts):
            for token in start:
                if not self.advance(base + k, int(token)):
                    ended.add(base + k)
                    break
        if follow:
            found = greedy_followers(unit.contexts, unit.budgets, unit.action_done, unit.starts, unit.temperatures)
            # A ban can keep a completion going where the same start tokens end its leader's (an armed action rule
            # stops only once no ban can act): such a follower runs as a sequence of its own.
            for f, leader in found.items():
                if base + f not in ended and base + leader not in ended:
                    self.following[base + f] = base + leader
                    self.followed_by[base + leader].append(base + f)
        if n == 0:
            self._finish(len(self.units) - 1)
        return [i for i in range(base, base + n) if i not in self.following and i not in ended]

    def results(self, unit: int) -> list[Decoded]:
        _key, first, n = self.units[unit]
        return [Decoded(tuple(self.generated[i]), self.stopped[i], self.mass[i], self.steps_banned[i])
                for i in range(first, first + n)]

    def _ended(self, i: int) -> None:
        unit = self.unit_of[i]
        self.left[unit] -= 1
        if self.left[unit] == 0:
            self._finish(unit)

    def _finish(self, unit: int) -> None:
        """A queue session hands a finished unit's completions back and keeps none of its tokens."""
        if self.on_done is None:
            return
        key, first, n = self.units[unit]
        self.on_done(key, self.results(unit))
        for i in range(first, first + n):
            self.contexts[i], self.generated[i], self.texts[i], self.rngs[i] = None, [], b"", None

    def advance(self, i: int, token: int) -> bool:
        """Completion i takes `token`; True while it goes on."""
        going_on = self._advance(i, token)
        if not going_on:
            self._ended(i)
        return going_on

    def _advance(self, i: int, token: int) -> bool:
        if token in self.stop_set:
            self.stopped[i] = END_OF_TURN
            return False
        self.generated[i].append(token)
        self.texts[i] += self.token_bytes[token] if token < len(self.token_bytes) else b""
        if self.armed[i] and not ban_may_act(self.texts[i], self.keys[i]):
            self.stopped[i] = ACTION_DONE
            return False
        if self.rules[i] is not None and not self.armed[i]:
            self.armed[i] = self.rules[i](self.texts[i].decode("utf-8", errors="replace"))
        return len(self.generated[i]) < self.budgets[i]

    def apply_ban(self, i: int, row: np.ndarray) -> None:
        """Block, in `row` (completion i's next-token logits), the tokens that would complete a banned text."""
        if not self.keys[i]:
            return
        ban = self.bans.get(self.prefix[i])
        if ban is None:  # one index per vocabulary and kind (cached across sessions)
            make = prefix_ban if self.prefix[i] else text_ban
            ban = self.bans[self.prefix[i]] = make(tuple(self.token_bytes), frozenset(self.stop_set), self.n_vocab)
        blocked = ban.blocked(self.texts[i], self.keys[i], len(self.generated[i]) + 1 == self.budgets[i])
        if blocked.size:
            self.mass[i] += softmax_mass(row, blocked)
            self.steps_banned[i] += 1
            row[blocked] = -np.inf

    def context(self, i: int) -> list[int]:
        return list(self.contexts[i]) + self.generated[i]

    def run(self, decoder: Decoder, own: list[int], slots: int, more: Callable[[], list[int] | None] | None) -> None:
        """Step the first `slots` of `own` and, as slots free up, the completions that parted from their leaders,
        the rest of `own`, then those `more` adds (None: no more)."""
        started = own[:slots]
        waiting = deque(own[slots:])
        parted: deque[int] = deque()  # followers whose leader chose another token, waiting for a slot
        seq_of = {i: k for k, i in enumerate(started)}  # completion -> the decoder's sequence number
        logits = np.asarray(decoder.start([self.context(i) for i in started]))
        self.n_vocab = logits.shape[1]
        active = list(started)
        while active:
            # A leader's logits as the model gave them, for its followers (its own ban must not act on theirs).
            shared = {i: np.array(logits[row], dtype=np.float32) for row, i in enumerate(active)
                      if self.followed_by.get(i)}
            if any(self.keys[i] for i in active):  # blocked entries are overwritten: never the decoder's buffer
                logits = np.array(logits, dtype=np.float32, copy=True)
                for row, i in enumerate(active):
                    self.apply_ban(i, logits[row])
            chosen = _choose(logits, [self.temperatures[i] for i in active], [self.rngs[i] for i in active])
            still_active, next_tokens = [], []
            for i, token in zip(active, chosen.tolist()):
                if self.advance(i, token):
                    still_active.append(i)
                    next_tokens.append(token)
            going_on = set(still_active)
            for leader, row in shared.items():
                leader_token = int(chosen[active.index(leader)])
                for follower in list(self.followed_by[leader]):
                    mine = row.copy()
                    self.apply_ban(follower, mine)
                    token = int(mine.argmax())
                    goes_on = self.advance(follower, token)
                    if token == leader_token and goes_on and leader in going_on:
                        continue  # the same token, both go on: still the leader's completion
                    self.followed_by[leader].remove(follower)  # ended with it, or parts from it here
                    del self.following[follower]
                    if goes_on:
                        parted.append(follower)
            joining, pulled = [], False
            while len(still_active) + len(joining) < slots:
                if parted or waiting:
                    joining.append(parted.popleft() if parted else waiting.popleft())
                    continue
                # One unit a step while sequences go on: sessions pulling from one queue then take its units in
                # turn instead of the first one filling all its slots from it.
                if more is None or (pulled and (still_active or joining)):
                    break
                added, pulled = more(), True
                if added is None:
                    more = None
                    break
                waiting.extend(added)
            # A completion that parted from its leader joins with the tokens it wrote: its stream starts as a copy
            # of the longest prefix a live stream holds (the leader's), so nothing already computed is computed again.
            for i in joining:  # the decoder numbers joining sequences on after every one started so far
                seq_of[i] = len(seq_of)
            active = still_active + joining
            if not active:
                break
            seqs = [seq_of[i] for i in still_active]
            if joining:
                logits = decoder.join_step(seqs, next_tokens, [self.context(i) for i in joining])
            else:
                logits = decoder.step(seqs, next_tokens)
