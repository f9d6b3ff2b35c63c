"""What a decoding session takes: one caller's contexts with their budgets, bans, temperatures, generators, action
rules and start tokens (DecodeUnit), checked and given one entry per context; and which greedy contexts follow an
identical earlier one (see fastscore.decode)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# A predicate on the text generated so far (UTF-8, an incomplete last character replaced) that, once true, stays
# true as the text grows: the action is written, what follows cannot change it.
ActionDone = Callable[[str], bool]


@dataclass(frozen=True)
class DecodeUnit:
    """Contexts that enter a decoding session together and whose completions are handed back together (one item's
    requests), one entry per context in every field; made by `decode_unit`, which checks them."""

    key: Hashable
    contexts: Sequence[Sequence[int]]
    budgets: Sequence[int]
    banned: Sequence[frozenset[bytes]]  # stripped UTF-8 banned texts
    ban_prefix: Sequence[bool]
    temperatures: Sequence[float]
    rngs: Sequence[np.random.Generator | None]
    action_done: Sequence[ActionDone | None]
    starts: Sequence[Sequence[int]]

    @property
    def longest(self) -> int:
        """The most tokens any of its sequences holds: its context and its whole budget."""
        return max((len(c) + b for c, b in zip(self.contexts, self.budgets)), default=0)


def decode_unit(key: Hashable, contexts: Sequence[Sequence[int]], *, max_new_tokens: int | Sequence[int],
                banned: Sequence[Iterable[str]] | None = None, ban_prefix: bool | Sequence[bool] = False,
                temperature: float | Sequence[float] = 0.0,
                rngs: Sequence[np.random.Generator | None] | None = None,
                action_done: Sequence[ActionDone | None] | None = None,
                starts: Sequence[Sequence[int]] | None = None) -> DecodeUnit:
    """The arguments of fastscore.decode.greedy_decode as a DecodeUnit (ValueError where they do not fit)."""
    n = len(contexts)
    budgets = _budgets(max_new_tokens, n)
    temperatures = per_context_temperatures(temperature, rngs, n)
    if action_done is not None and len(action_done) != n:
        raise ValueError(f"{len(action_done)} action_done rules for {n} contexts")
    if starts is not None and len(starts) != n:
        raise ValueError(f"{len(starts)} start token lists for {n} contexts")
    keys = [frozenset(text.encode().strip() for text in (banned[i] if banned else ())) for i in range(n)]
    prefix = [bool(ban_prefix)] * n if isinstance(ban_prefix, bool) else [bool(p) for p in ban_prefix]
    return DecodeUnit(key, contexts, budgets, keys, prefix, temperatures,
                      [None] * n if rngs is None else list(rngs),
                      [None] * n if action_done is None else list(action_done),
                      [()] * n if starts is None else [tuple(int(t) for t in s) for s in starts])


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
