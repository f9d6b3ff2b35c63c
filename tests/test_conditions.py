"""The study's conditions render the intended contexts for real items of both environments (no model needed)."""

from __future__ import annotations

import math

import pytest

from fastscore.records import CandidateSet, GreedyRequest, Message
from fastscore.study.data.conditions import CONDITIONS, banned_candidate_lp, distinct, render_conditions
from fastscore.study.data.envs import ENVS, open_envs
from fastscore.study.analysis.metrics import candidate_probabilities


@pytest.fixture(scope="module")
def items(study_data):
    envs = open_envs(ENVS, study_data)
    return {name: (env, env.build_items(2, 0)[0]) for name, env in envs.items()}


def _cases(items):
    for env, env_items in items.values():
        for item in env_items:
            yield env, item, {c.condition: c for c in render_conditions(item, env)}


def _text(messages: tuple[Message, ...]) -> str:
    return "\n".join(m.content for m in messages)


def test_every_condition_is_rendered_once_in_order(items):
    for _, item, by_cond in _cases(items):
        assert tuple(by_cond) == CONDITIONS
        for cond in by_cond.values():
            assert all(isinstance(m, Message) for m in cond.messages)
            candidate_set = cond.candidate_set(item.candidates)
            assert isinstance(candidate_set, CandidateSet) and candidate_set.candidates[0] == item.failed_action
            assert isinstance(cond.greedy_request(), GreedyRequest)
            assert candidate_set.id == cond.greedy_request().id == f"{item.item_id}::{cond.condition}"


def test_before_is_the_context_without_any_record(items):
    for env, item, by_cond in _cases(items):
        before = by_cond["before"].messages
        assert [m.role for m in before] == ["system", "user"]
        assert before[1].content == item.task
        assert item.failed_action not in _text(before)
        assert item.error_message not in _text(before)


def test_after_holds_the_verbatim_failed_action_and_its_error(items):
    for env, item, by_cond in _cases(items):
        after = by_cond["after"].messages
        assert after[:2] == by_cond["before"].messages
        assert after[2] == Message("assistant", item.failed_action)  # verbatim, as the assistant's own turn
        assert item.error_message in after[3].content
        assert after[-1].role != "assistant"  # the model speaks next


def test_counterfactuals_keep_the_call_and_change_only_the_message(items):
    for env, item, by_cond in _cases(items):
        after = by_cond["after"].messages
        for cond in ("success", "neutral"):
            messages = by_cond[cond].messages
            assert messages[:3] == after[:3]
            assert item.error_message not in messages[3].content
            assert messages[3] != after[3]


def test_description_replaces_the_verbatim_action(items):
    for env, item, by_cond in _cases(items):
        messages = by_cond["description"].messages
        assert item.failed_action not in _text(messages)
        assert item.failed_action.strip() not in _text(messages)
        assert item.description in _text(messages[2:])
        assert all(m.role != "assistant" for m in messages)


def test_dont_repeat_adds_an_instruction_to_the_after_record(items):
    for env, item, by_cond in _cases(items):
        after, dont = by_cond["after"].messages, by_cond["dont_repeat"].messages
        assert dont[:3] == after[:3]
        assert dont[3].content.startswith(after[3].content) and len(dont[3].content) > len(after[3].content)
        assert "not repeat" in dont[3].content.lower()


def test_clean_retry_renders_to_before(items):
    for env, item, by_cond in _cases(items):
        assert by_cond["clean_retry"].messages == by_cond["before"].messages
        assert by_cond["clean_retry"].banned == ()


def test_ban_bans_the_failed_action_in_the_after_context(items):
    for env, item, by_cond in _cases(items):
        ban = by_cond["ban"]
        assert ban.banned == (item.failed_action,)
        assert ban.greedy_request().banned == (item.failed_action,)
        assert ban.messages == by_cond["after"].messages
        assert all(c.banned == () for name, c in by_cond.items() if name != "ban")


def test_identical_requests_are_sent_once(items):
    for env, item, by_cond in _cases(items):
        contexts = tuple(by_cond.values())
        sets = distinct(contexts, lambda c: c.messages)
        assert sets["clean_retry"] == "before" and sets["ban"] == "after"
        assert len(set(sets.values())) == 6
        decodes = distinct(contexts, lambda c: (c.messages, c.banned))
        assert decodes["clean_retry"] == "before" and decodes["ban"] == "ban"
        assert len(set(decodes.values())) == 7


def test_ban_zeroes_the_failed_candidate_and_renormalises_the_rest():
    cand_lp, n = (-1.0, -2.0, -3.0, -2.5), (4, 5, 6, 5)
    banned = banned_candidate_lp(cand_lp)
    assert banned[0] == -math.inf and banned[1:] == cand_lp[1:]
    p, p_norm = candidate_probabilities(banned, n)
    assert p == 0.0 and p_norm == 0.0
    rest = [math.exp(x) for x in cand_lp[1:]]
    # Candidate 1's share among the remaining ones is what the ban leaves it with.
    p1_banned = candidate_probabilities((banned[1], -math.inf, -math.inf, -math.inf), (1, 1, 1, 1))
    assert p1_banned == (1.0, 1.0)
    swapped = (banned[1], banned[0], banned[2], banned[3])
    p1, _ = candidate_probabilities(swapped, (n[1], n[0], n[2], n[3]))
    assert p1 == pytest.approx(rest[0] / sum(rest), rel=1e-12)
