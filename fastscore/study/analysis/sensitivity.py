"""Harness realism as a sensitivity check on the headline: does the inversion depend on how the harness writes the
failure record?

Two checks, each scored on the items' own candidate sets, in scorer calls of their own (the study's conditions are
scored exactly as without the check):

- record_role: the `after` record's error message in the other role (tools: a `user` message instead of the
  runtime's `tool` message; MBPP: a `tool` message instead of the test harness's `user` message). `before` is the
  study's own context, so only `after` is scored again.
- native_tools: the tools environment in the chat template's native tool format (fastscore.study.data.envs.tools.native):
  the schemas passed as `tools=`, the failed call as an assistant `tool_calls` message, the error as a `tool`
  message, every candidate written as the template writes that call. Both `before` and `after` are scored in it.
  Not applicable where the model's template renders neither tools nor tool calls (the embedded SmolLM2's), where
  the environment's actions are programs (MBPP), or where a candidate has no structured form (a syntax error).

Each is reported as a change on the headline, paired per item on the items where the check applies: G per token of
the failed action, and the copy control ΔG per token = G(failed)/n(failed) - G(correct)/n(correct); each change also
as a share of the study's value on the same items (mean change / mean study value, bootstrap CI).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastscore import chat
from fastscore.errors import RequestError
from fastscore.records import CandidateSet, Message
from fastscore.study.data.conditions import record_messages
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.data.items import Item
from fastscore.study.analysis.metrics import POOLED
from fastscore.study.analysis.stats import bootstrap_ci, ratio_ci, resample_indices
from fastscore.study.stages.onpolicy import scored_candidates

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


# ---------------------------------------------------------------- metrics (pure numpy)


def _gains(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[float, float]:
    """(G per token of the failed action, ΔG per token = that minus the correct action's G per token)."""
    per = [(before["cand_lp"][k] - after["cand_lp"][k]) / after["cand_n_tokens"][k] for k in (0, 1)]
    return per[0], per[0] - per[1]


def _paired(default: Mapping[str, list[dict]], records: Sequence[dict], check: str
            ) -> tuple[np.ndarray, np.ndarray, Counter]:
    """Per applicable item: [default G/tok, check G/tok] and [default ΔG/tok, check ΔG/tok]; reasons of the rest."""
    gains, deltas, reasons = [], [], Counter()
    for record in records:
        entry = record["checks"][check]
        if NOT_APPLICABLE in entry:
            reasons[entry[NOT_APPLICABLE]] += 1
            continue
        conds = default[record["item_id"]][0]["conditions"]
        d_gain, d_delta = _gains(conds["before"], conds["after"])
        v_gain, v_delta = _gains(entry["sets"].get("before", conds["before"]), entry["sets"]["after"])
        gains.append((d_gain, v_gain))
        deltas.append((d_delta, v_delta))
    shape = (len(gains), 2)
    return np.asarray(gains, dtype=float).reshape(shape), np.asarray(deltas, dtype=float).reshape(shape), reasons


def _check_summary(gains: np.ndarray, deltas: np.ndarray, reasons: Counter, idx_seed: list[int], n_boot: int
                   ) -> dict[str, Any]:
    out: dict[str, Any] = {"n_items": len(gains), "n_not_applicable": sum(reasons.values()),
                           "not_applicable_reasons": dict(reasons)}
    if not len(gains):
        out[NOT_APPLICABLE] = "; ".join(sorted(reasons)) or "no item"
        return out
    idx = resample_indices(len(gains), n_boot, idx_seed)
    for name, pair in (("gain_per_token", gains), ("delta_gain_per_token", deltas)):
        change = pair[:, 1] - pair[:, 0]
        out[name] = {"default": bootstrap_ci(pair[:, 0], idx).to_dict(),
                     "check": bootstrap_ci(pair[:, 1], idx).to_dict(),
                     "change": bootstrap_ci(change, idx).to_dict()}
        # The change as a share of the study's value, quoted in the Reading: a ratio, so with its CI (same resamples).
        if pair[:, 0].mean() != 0.0:
            out[name]["relative_change"] = ratio_ci(change, pair[:, 0], idx).to_dict()
    return out


def summarize_sensitivity(default: Mapping[str, list[dict]], records: Sequence[dict], envs: Sequence[str],
                          seed: int, n_boot: int) -> dict[str, dict[str, Any]]:
    """{env or "pooled": {check: summary}} from the study's logprobs records and the checks' records."""
    by_env = {env: [r for r in records if r["env"] == env and r["item_id"] in default] for env in envs}
    by_env = {env: rs for env, rs in by_env.items() if rs}
    out: dict[str, dict[str, Any]] = {}
    groups = dict(by_env)
    if len(by_env) > 1:
        groups[POOLED] = [r for rs in by_env.values() for r in rs]
    for group, rs in groups.items():
        out[group] = {}
        for check in CHECKS:
            gains, deltas, reasons = _paired(default, rs, check)
            summary = _check_summary(gains, deltas, reasons, [seed, zlib.crc32(f"{group}:{check}".encode())], n_boot)
            out[group][check] = {"description": DESCRIPTIONS[check], **summary}
    return out
