"""The study's conditions: for one item, the chat context (and decoder ban) each condition scores under.

What each condition renders to (`context` = the environment's [system, user] messages):

- before: `context`. No failure record: the reference every corrective gain is measured against.
- after: `context` + the verbatim failed action as the assistant turn + the error message, as a harness records it.
- success / neutral: the same verbatim action followed by a success message / a neutral acknowledgement instead
  of the error (counterfactuals that separate the call's surface form from the meaning of "it failed").
- description: `context` + a runtime-generated description of the failure in place of the verbatim action.
- dont_repeat: the `after` record plus an explicit instruction not to repeat the failed action.
- clean_retry: the failed attempt and its error are deleted and the model retries from the clean context, so the
  messages are exactly `before`'s: the harness restores the context that produced the failure.
- ban: the `after` messages, with the failed action made unreachable at the decoder: greedy decoding runs with
  banned=(failed action,), and over the candidate set the failed candidate's probability is 0 and the others are
  renormalised (its log-probability is -inf, so the corrective gain is undefined for ban).

Every condition scores the item's fixed candidate set (the failed action first) and decodes greedily once.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from fastscore.errors import DataError
from fastscore.records import CandidateSet, GreedyRequest, Message
from fastscore.study.items import Item
from fastscore.study.metrics import CONDITIONS, ENVS

log = logging.getLogger(__name__)

# Conditions whose context is `context` + the environment's record messages of the same name.
RECORD_CONDITIONS = ("after", "success", "neutral", "description", "dont_repeat")
BAN_CONTEXT = "after"  # the decoder ban acts on the harness that keeps the verbatim record
ENV_MODULES = {"tools": "fastscore.study.envs.tools.env", "mbpp": "fastscore.study.envs.mbpp.env"}


class StudyEnv(Protocol):
    """What the study needs from an environment module (fastscore.study.envs.tools.env / mbpp_env)."""

    def context_messages(self, item: Item) -> Sequence[Message | Mapping[str, str]]: ...

    def record_messages(self, item: Item, kind: str) -> Sequence[Message | Mapping[str, str]]: ...


def env_module(env: str) -> ModuleType:
    if env not in ENV_MODULES:
        raise DataError(f"unknown environment {env!r} (expected one of {', '.join(ENVS)})")
    return importlib.import_module(ENV_MODULES[env])


@dataclass(frozen=True)
class ConditionContext:
    """What one condition shows the model for one item, and which completions the decoder refuses."""

    item_id: str
    condition: str
    messages: tuple[Message, ...]
    banned: tuple[str, ...] = ()

    @property
    def request_id(self) -> str:
        return condition_request_id(self.item_id, self.condition)

    def candidate_set(self, candidates: tuple[str, ...]) -> CandidateSet:
        return CandidateSet(id=self.request_id, messages=self.messages, candidates=candidates)

    def greedy_request(self) -> GreedyRequest:
        return GreedyRequest(id=self.request_id, messages=self.messages, banned=self.banned)


def condition_request_id(item_id: str, condition: str) -> str:
    """The id of an item's request under a condition; by_condition reads the condition back."""
    return f"{item_id}::{condition}"


def by_condition(results: Sequence[Any]) -> dict[str, Any]:
    """Results (anything with an `id` made by condition_request_id) keyed by their condition."""
    return {r.id.rsplit("::", 1)[1]: r for r in results}


def as_messages(messages: Sequence[Message | Mapping[str, str]]) -> tuple[Message, ...]:
    """Environments may return {role, content} dicts; the scorer takes Message records."""
    return tuple(m if isinstance(m, Message) else Message(role=m["role"], content=m["content"]) for m in messages)


def render_conditions(
    item: Item, env: StudyEnv, conditions: Sequence[str] = CONDITIONS
) -> tuple[ConditionContext, ...]:
    """The contexts of `item` under each condition, in `conditions` order."""
    context = as_messages(env.context_messages(item))
    records = {kind: as_messages(env.record_messages(item, kind)) for kind in RECORD_CONDITIONS}
    out = []
    for cond in conditions:
        if cond in ("before", "clean_retry"):
            out.append(ConditionContext(item.item_id, cond, context))
        elif cond in RECORD_CONDITIONS:
            out.append(ConditionContext(item.item_id, cond, context + records[cond]))
        elif cond == "ban":
            out.append(ConditionContext(item.item_id, cond, context + records[BAN_CONTEXT], (item.failed_action,)))
        else:
            raise DataError(f"unknown condition {cond!r} (expected one of {', '.join(CONDITIONS)})")
    return tuple(out)


def banned_candidate_lp(cand_lp: Sequence[float], banned_index: int = 0) -> tuple[float, ...]:
    """The candidate log-probs under a decoder ban: the banned candidate can never be emitted (-inf).

    Renormalising the rest is the softmax over the remaining candidates, which metrics.candidate_probabilities does.
    """
    return tuple(-math.inf if i == banned_index else float(x) for i, x in enumerate(cand_lp))
