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
  banned=(failed action,) (a model's own action the harness cut before its end-of-turn: no completion may start
  with it, since the harness would cut such a completion at the same place), and over the candidate set the failed candidate's probability is 0 and the others are
  renormalised (its log-probability is -inf, so the corrective gain is undefined for ban).

Every condition scores the item's fixed candidate set (the failed action first) and decodes greedily once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastscore.errors import DataError
from fastscore.records import CandidateSet, EmittedContinuation, GreedyRequest, Message
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.data.items import Item

# The study's vocabulary: every module (metrics, report, plots, runner, bench, quant check) reads it from here.
CONDITIONS = ("before", "after", "success", "neutral", "description", "dont_repeat", "clean_retry", "ban")
REFERENCE = "before"
REMEDIES = ("description", "dont_repeat", "clean_retry")
# Conditions whose context is `context` + the environment's record messages of the same name.
RECORD_CONDITIONS = ("after", "success", "neutral", "description", "dont_repeat")
BAN_CONTEXT = "after"  # the decoder ban acts on the harness that keeps the verbatim record
# The decoder ban makes the failed string unreachable: its lp is -inf by construction, so G is undefined.
GAIN_UNDEFINED = {"ban": "the decoder ban makes the failed action unreachable (lp = -inf by construction)"}
# Remedies whose messages are the reference's own: G = 0 and the whole inversion "removed" by construction, so no
# gain of theirs is reported. clean_retry is measured by sampled retries from the clean context instead, and only
# under on-policy failures (the failure came from that very context); with seeded failures it is not applicable.
SAME_AS_REFERENCE = {"clean_retry": "its messages are exactly `before`'s (the record is deleted), so G = 0 by "
                                    "construction; it is measured by k sampled retries (on-policy failures only)"}
GAIN_CONDITIONS = tuple(c for c in CONDITIONS
                        if c != REFERENCE and c not in GAIN_UNDEFINED and c not in SAME_AS_REFERENCE)
CLEAN_RETRY_SEEDED = ("not applicable under seeded failures: the failed action was not produced from the clean "
                      "context, so retrying from it tests nothing")


@dataclass(frozen=True)
class ConditionContext:
    """What one condition shows the model for one item, and which completions the decoder refuses."""

    item_id: str
    condition: str
    messages: tuple[Message, ...]
    banned: tuple[str, ...] = ()
    ban_prefix: bool = False  # no completion may start with a banned text (not only equal it)

    @property
    def request_id(self) -> str:
        return condition_request_id(self.item_id, self.condition)

    def candidate_set(self, candidates: tuple[str | EmittedContinuation, ...]) -> CandidateSet:
        return CandidateSet(id=self.request_id, messages=self.messages, candidates=candidates)

    def greedy_request(self) -> GreedyRequest:
        return GreedyRequest(id=self.request_id, messages=self.messages, banned=self.banned, ban_prefix=self.ban_prefix)


def condition_request_id(item_id: str, condition: str) -> str:
    """The id of an item's request under a condition; by_condition reads the condition back."""
    return f"{item_id}::{condition}"


def by_condition(results: Sequence[Any]) -> dict[str, Any]:
    """Results (anything with an `id` made by condition_request_id) keyed by their condition."""
    return {r.id.rsplit("::", 1)[1]: r for r in results}


def record_messages(env: StudyEnv, item: Item, kind: str) -> tuple[Message, ...]:
    """The messages after the (system, user) context under one record condition, from the environment's Records."""
    records = env.records
    attempt = Message("assistant", item.failed_action)
    if kind == "after":
        return attempt, Message(records.role, env.failure_report(item))
    if kind == "success":
        return attempt, Message(records.role, env.success_message(item))
    if kind == "neutral":
        return attempt, Message(records.role, records.neutral)
    if kind == "description":
        return (Message(records.role, item.description),)
    if kind == "dont_repeat":
        report = env.failure_report(item) + records.dont_repeat_separator + records.dont_repeat
        return attempt, Message(records.role, report)
    raise ValueError(f"unknown record kind {kind!r} (expected one of {', '.join(RECORD_CONDITIONS)})")


def render_conditions(
    item: Item, env: StudyEnv, conditions: Sequence[str] = CONDITIONS
) -> tuple[ConditionContext, ...]:
    """The contexts of `item` under each condition, in `conditions` order."""
    context = env.context_messages(item)
    records = {kind: record_messages(env, item, kind) for kind in RECORD_CONDITIONS}
    out = []
    for cond in conditions:
        if cond in ("before", "clean_retry"):
            out.append(ConditionContext(item.item_id, cond, context))
        elif cond in RECORD_CONDITIONS:
            out.append(ConditionContext(item.item_id, cond, context + records[cond]))
        elif cond == "ban":
            out.append(ConditionContext(item.item_id, cond, context + records[BAN_CONTEXT], (item.failed_action,),
                                        cut_before_end_of_turn(item)))
        else:
            raise DataError(f"unknown condition {cond!r} (expected one of {', '.join(CONDITIONS)})")
    return tuple(out)


def cut_before_end_of_turn(item: Item) -> bool:
    """Is the failed action the model's own, scored as emitted and cut by the harness before any end-of-turn?"""
    emitted = item.meta.get("emitted") if item.failure_kind == "model" else None
    return emitted is not None and not emitted["end_of_turn"]


def distinct(contexts: Sequence[ConditionContext], key) -> dict[str, str]:
    """condition -> the condition whose request stands for it (the first with an identical request): clean_retry
    renders to before's messages, and ban to after's candidate set."""
    first: dict[Any, str] = {}
    return {c.condition: first.setdefault(key(c), c.condition) for c in contexts}


def banned_candidate_lp(cand_lp: Sequence[float], banned_index: int = 0) -> tuple[float, ...]:
    """The candidate log-probs under a decoder ban: the banned candidate can never be emitted (-inf).

    Renormalising the rest is the softmax over the remaining candidates, which score_row.candidate_probabilities does.
    """
    return tuple(-math.inf if i == banned_index else float(x) for i, x in enumerate(cand_lp))
