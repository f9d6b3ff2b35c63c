"""Stage 3 (optional): the harness-realism checks, a sensitivity check on the headline (does the inversion depend on
how the harness writes the failure record?); their candidate sets, appended per item to sensitivity.jsonl.

Two checks, each scored on the items' own candidate sets, in scorer calls of their own (the study's conditions are
scored exactly as without the check):

- record_role: the `after` record's error message in the other role (tools: a `user` message instead of the
  runtime's `tool` message; MBPP: a `tool` message instead of the test harness's `user` message). `before` is the
  study's own context, so only `after` is scored again.
- native_tools: the tools environment in the chat template's native tool format
  (fastscore.study.data.envs.tools.native): the schemas passed as `tools=`, the failed call as an assistant
  `tool_calls` message, the error as a `tool` message, every candidate written as the template writes that call.
  Both `before` and `after` are scored in it. Not applicable where the model's template renders neither tools nor
  tool calls (the embedded SmolLM2's), where the environment's actions are programs (MBPP), or where a candidate has
  no structured form (a syntax error).

Scoring only, no decoding, in calls of their own after the study's stages: the study's conditions are scored exactly
as in a run without the checks. Calls hold fixed chunks of the item list, as the scoring stage's do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from fastscore import chat
from fastscore.errors import RequestError
from fastscore.records import CandidateSet, CandidateSetResult, Message
from fastscore.study.data.conditions import record_messages
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.data.items import Item
from fastscore.study.stages.isolate import call_isolating, chunks, error_reason
from fastscore.study.stages.onpolicy import scored_candidates
from fastscore.study.stages.score import ITEMS_PER_SCORE_CALL
from fastscore.study.stages.store import StudyStore

CHECKS = ("record_role", "native_tools")
DESCRIPTIONS = {
    "record_role": "the error record as a user message instead of the runtime's tool message (tools), as a tool "
                   "message instead of the test harness's user message (MBPP)",
    "native_tools": "the tools passed as tools=, the failed call as an assistant tool_calls message, the error as a "
                    "tool message, each candidate written as the template writes that call (instead of the "
                    "text-schema prompt)",
}
NO_TOOLS_TEMPLATE = "the model's chat template does not accept tools= (it renders neither tools nor tool calls)"
# Absent keys of a check that applies to no item carry this key, never a number.
NOT_APPLICABLE = "not_applicable"


@dataclass(frozen=True)
class CheckRequests:
    """What one check scores for one item: candidate sets by context ("before" / "after")."""

    check: str
    sets: Mapping[str, CandidateSet]


def other_role(role: str) -> str:
    return "user" if role == "tool" else "tool"


def accepts_tools(template: str | None) -> bool:
    if not template:
        return False
    probe = Message("assistant", "", tool_calls=({"type": "function", "function": {"name": "f", "arguments": {}}},))
    try:
        chat.check_template_support(template, (probe,), ({"type": "function", "function": {"name": "f"}},))
    except RequestError:
        return False
    return True


def _set_id(item: Item, check: str, context: str) -> str:
    return f"{item.item_id}::{check}:{context}"


def _record_role(item: Item, env: StudyEnv) -> CheckRequests:
    attempt, record = record_messages(env, item, "after")
    flipped = Message(other_role(record.role), record.content)
    messages = env.context_messages(item) + (attempt, flipped)
    # The candidates as the study scores them (an on-policy failed action as its emitted ids), so the change is the
    # record's role alone.
    return CheckRequests("record_role", {"after": CandidateSet(_set_id(item, "record_role", "after"), messages,
                                                                scored_candidates(item))})


def _native_tools(item: Item, env: StudyEnv, scorer) -> CheckRequests:
    """ValueError with the reason where the check does not apply."""
    template = scorer.tokenizer.chat_template
    if not accepts_tools(template):
        raise ValueError(NO_TOOLS_TEMPLATE)
    native = env.native_tools(item)
    context = (Message("system", native.system), Message("user", item.task))
    render = dict(tools=native.tools, special_tokens=scorer.tokenizer.special_token_variables,
                  template_kwargs=scorer.chat_template_kwargs)
    try:
        texts = tuple(chat.tool_call_text(template, context, call, **render) for call in native.calls)
    except RequestError as exc:
        raise ValueError(f"the template rejected a tool call: {exc}") from None
    after = context + (Message("assistant", "", tool_calls=(native.calls[0],)),
                       Message("tool", env.failure_report(item)))
    sets = {name: CandidateSet(_set_id(item, "native_tools", name), messages, texts, native.tools)
            for name, messages in (("before", context), ("after", after))}
    return CheckRequests("native_tools", sets)


def check_requests(item: Item, env: StudyEnv, scorer) -> dict[str, CheckRequests | str]:
    """Each check's candidate sets for `item`, or the reason it does not apply."""
    out: dict[str, CheckRequests | str] = {"record_role": _record_role(item, env)}
    try:
        out["native_tools"] = _native_tools(item, env, scorer)
    except ValueError as exc:
        out["native_tools"] = str(exc)
    return out


# ---------------------------------------------------------------- the stage


def _set_record(result: CandidateSetResult) -> dict[str, Any]:
    return {"cand_lp": [r.logprob for r in result.results], "cand_n_tokens": [r.n_tokens for r in result.results]}


def _item_record(item: Item, plan: Mapping[str, CheckRequests | str], results: Sequence[CandidateSetResult],
                 error: Exception | None) -> dict[str, Any]:
    by_id = {r.id: r for r in results}
    checks: dict[str, Any] = {}
    for check, requests in plan.items():
        if isinstance(requests, str):
            checks[check] = {NOT_APPLICABLE: requests}
        elif error is not None:
            checks[check] = {NOT_APPLICABLE: f"not scored: {error_reason(error)}"}
        else:
            checks[check] = {"sets": {name: _set_record(by_id[s.id]) for name, s in requests.sets.items()},
                             "candidates": [getattr(c, "text", c)  # an emitted action: its decoded text
                                            for c in next(iter(requests.sets.values())).candidates]}
    return {"item_id": item.item_id, "env": item.env, "checks": checks}


def sensitivity_stage(store: StudyStore, scorer, envs: Mapping[str, StudyEnv], items: Sequence[Item], *,
                      progress: bool = False, after_item: Callable[[str, str], None] | None = None) -> None:
    """Append each scored item's check results (or the reason a check does not apply) to sensitivity.jsonl."""
    records = store.sensitivity()
    done = set(records.load())
    scored = set(store.logprobs().load())  # items the study could not score have no headline to compare with
    scored_items = [item for item in items if item.item_id in scored]
    with tqdm(total=len(scored_items), initial=sum(i.item_id in done for i in scored_items), desc="sensitivity checks",
              unit="item", disable=not progress) as bar:
        for chunk in chunks(scored_items, ITEMS_PER_SCORE_CALL):
            if all(item.item_id in done for item in chunk):
                continue
            plans = {item.item_id: check_requests(item, envs[item.env], scorer) for item in chunk}
            requests = {i: [s for r in plan.values() if not isinstance(r, str) for s in r.sets.values()]
                        for i, plan in plans.items()}
            results, failed = call_isolating(scorer.score_candidates, requests, lambda r: r.id)
            for item in chunk:
                if item.item_id in done:
                    continue
                records.append([_item_record(item, plans[item.item_id], results.get(item.item_id, []),
                                         failed.get(item.item_id))])
                bar.update(1)
                if after_item is not None:
                    after_item("sensitivity", item.item_id)
