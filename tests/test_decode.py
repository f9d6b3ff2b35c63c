"""Batched greedy decoding and banned completions (banned as text, whatever tokens spell them)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scorer_helpers import CountingFakeBackend, ScriptedDecoder

from fastscore.decode import ACTION_DONE, END_OF_TURN, MAX_TOKENS, greedy_decode
from fastscore.records import GreedyRequest, Message
from fastscore.scorer import Scorer

CONTEXTS = [(Message("user", "Write a haiku."),), (Message("user", "Name a colour."),), (Message("user", "Hi"),)]


def _id(tok, piece: str) -> int:
    token_id = tok._tok.token_to_id(piece)
    assert token_id is not None, piece
    return token_id


def _decode(tok, script, banned, max_new_tokens=8, n_contexts=1):
    decoder = ScriptedDecoder(tok.vocab_size, script, fallback=_id(tok, "."))
    return greedy_decode(
        decoder, [[1]] * n_contexts, token_bytes=tok.token_bytes, stop_ids=tok.stop_ids,
        max_new_tokens=max_new_tokens, banned=banned,
    )


def _text(tok, decoded) -> str:
    return tok.decode(decoded.token_ids)


def test_greedy_equals_sequential_argmax_and_is_batch_independent(smollm_tokenizer):
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer)
    requests = [GreedyRequest(f"g{i}", messages) for i, messages in enumerate(CONTEXTS)]
    together = scorer.greedy(requests, max_new_tokens=6)
    alone = [scorer.greedy([r], max_new_tokens=6)[0] for r in requests]
    model = scorer.backend.model
    for request, result in zip(requests, together):
        ids = scorer.context_ids(request.messages)
        expected = []
        for _ in range(6):
            token = int(model.reference_logits(ids + expected)[-1].argmax())
            if token in smollm_tokenizer.stop_ids:
                break
            expected.append(token)
        assert list(result.token_ids) == expected
        assert result.text == smollm_tokenizer.decode(expected)
        assert result.stopped_by == (MAX_TOKENS if len(expected) == 6 else END_OF_TURN)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


def test_banning_the_unconstrained_output_changes_it(smollm_tokenizer):
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer)
    free = scorer.greedy([GreedyRequest("g", CONTEXTS[0])], max_new_tokens=4)[0]
    assert free.banned_mass == 0.0 and free.banned_steps == 0
    banned = scorer.greedy([GreedyRequest("g", CONTEXTS[0], banned=(free.text,))], max_new_tokens=4)[0]
    print(repr(free.text), "->", repr(banned.text), banned.banned_mass, banned.banned_steps)
    assert banned.text.strip() != free.text.strip()
    assert banned.token_ids[:3] == free.token_ids[:3]  # only the token completing the banned text was blocked
    # The removed mass is at least the probability the model gave the token it chose unconstrained.
    ids = scorer.context_ids(CONTEXTS[0]) + list(free.token_ids[:3])
    logits = scorer.backend.model.reference_logits(ids)[-1].astype(np.float64)
    p_free = np.exp(logits - logits.max())
    p_free = p_free[free.token_ids[3]] / p_free.sum()
    print("mass removed", banned.banned_mass, "p(unconstrained choice)", p_free)
    assert banned.banned_mass >= p_free * (1 - 1e-4) and banned.banned_mass > 0  # float32 logits
    assert banned.banned_steps == 1


def test_end_of_turn_is_blocked_when_the_text_equals_a_banned_string(smollm_tokenizer):
    tok = smollm_tokenizer
    hello, world, bang, eot = _id(tok, "Hello"), _id(tok, "Ġworld"), _id(tok, "!"), tok.end_of_turn_id
    script = {(): [hello], (hello,): [world], (hello, world): [eot, bang], (hello, world, bang): [eot]}
    [free] = _decode(tok, script, None)
    assert (_text(tok, free), free.stopped_by) == ("Hello world", END_OF_TURN)
    [out] = _decode(tok, script, [["  Hello world \n"]])  # compared after stripping surrounding whitespace
    assert (_text(tok, out), out.stopped_by, out.banned_steps) == ("Hello world!", END_OF_TURN, 1)
    row = np.full(tok.vocab_size, -5.0)
    row[_id(tok, ".")], row[eot], row[bang] = -1.0, 10.0, 9.0
    expected_mass = np.exp(row[eot]) / np.exp(row).sum()
    print("mass removed", out.banned_mass, "by hand", expected_mass)
    assert out.banned_mass == pytest.approx(expected_mass, rel=1e-6)


def test_the_ban_holds_under_a_different_tokenisation_of_the_same_text(smollm_tokenizer):
    tok = smollm_tokenizer
    hel, lo, world, bang, eot = _id(tok, "Hel"), _id(tok, "lo"), _id(tok, "Ġworld"), _id(tok, "!"), tok.end_of_turn_id
    assert list(tok.encode("Hello world").ids) != [hel, lo, world]  # not the tokenizer's own spelling
    script = {(): [hel], (hel,): [lo], (hel, lo): [world], (hel, lo, world): [eot, bang], (hel, lo, world, bang): [eot]}
    [free] = _decode(tok, script, None)
    assert _text(tok, free) == "Hello world" and free.token_ids == (hel, lo, world)
    [out] = _decode(tok, script, [["Hello world"]])
    print(repr(_text(tok, out)), out.banned_mass, out.banned_steps)
    assert _text(tok, out) == "Hello world!" and out.banned_mass > 0 and out.banned_steps == 1


@pytest.mark.parametrize("last", ["Ġworld", "Ġ"])
def test_at_the_token_limit_any_token_completing_a_banned_text_is_blocked(smollm_tokenizer, last):
    """With 3 tokens allowed the third completes the reply: it may not make the text equal the banned one."""
    tok = smollm_tokenizer
    hel, lo, hello, world, wor = (_id(tok, p) for p in ("Hel", "lo", "Hello", "Ġworld", "Ġwor"))
    if last == "Ġworld":  # Hel + lo + " world" == "Hello world"
        script = {(): [hel], (hel,): [lo], (hel, lo): [world, wor]}
    else:  # Hello + " world" + " " strips to "Hello world"; so does stopping there
        script = {(): [hello], (hello,): [world], (hello, world): [_id(tok, "Ġ"), tok.end_of_turn_id, wor]}
    [free] = _decode(tok, script, None, max_new_tokens=3)
    assert _text(tok, free).strip() == "Hello world"
    [out] = _decode(tok, script, [["Hello world"]], max_new_tokens=3)
    print(repr(_text(tok, free)), "->", repr(_text(tok, out)), out.stopped_by, out.banned_mass)
    assert _text(tok, out).strip() != "Hello world"
    assert _text(tok, out).startswith("Hello wor") and out.stopped_by == MAX_TOKENS
    assert out.banned_mass > 0 and out.banned_steps == 1


def test_bans_are_per_sequence_and_absent_bans_cost_nothing(smollm_tokenizer):
    tok = smollm_tokenizer
    hello, world, bang, eot = _id(tok, "Hello"), _id(tok, "Ġworld"), _id(tok, "!"), tok.end_of_turn_id
    script = {(): [hello], (hello,): [world], (hello, world): [eot, bang], (hello, world, bang): [eot]}
    banned_first, other_ban, free = _decode(tok, script, [["Hello world"], ["Goodbye"], []], n_contexts=3)
    assert _text(tok, banned_first) == "Hello world!" and banned_first.banned_steps == 1
    for out in (other_ban, free):
        assert (_text(tok, out), out.banned_mass, out.banned_steps) == ("Hello world", 0.0, 0)


def test_an_empty_banned_string_forbids_an_empty_reply(smollm_tokenizer):
    tok = smollm_tokenizer
    bang = _id(tok, "!")
    script = {(): [tok.end_of_turn_id, bang], (bang,): [tok.end_of_turn_id]}
    [free] = _decode(tok, script, None)
    [out] = _decode(tok, script, [[""]])
    assert (_text(tok, free), _text(tok, out)) == ("", "!")


def test_token_bytes_spell_the_text_exactly(smollm_tokenizer):
    """Banned texts are compared on the bytes of the generated tokens: they must concatenate to the text."""
    text = "Héllo wörld ✓ 日本\n\tprint('x')  <|im_end|>"
    ids = smollm_tokenizer.encode(text).ids
    assert b"".join(smollm_tokenizer.token_bytes[i] for i in ids) == text.encode()


def test_each_context_stops_at_its_own_budget_and_the_ban_acts_at_its_own_last_step(smollm_tokenizer):
    """Budgets 3 and 8 in one call: the ban's last-step rule applies to each context at its own last step."""
    tok = smollm_tokenizer
    hel, lo, world, wor = (_id(tok, p) for p in ("Hel", "lo", "Ġworld", "Ġwor"))
    script = {(): [hel], (hel,): [lo], (hel, lo): [world, wor], (hel, lo, world): [tok.end_of_turn_id]}
    decoder = ScriptedDecoder(tok.vocab_size, script, fallback=_id(tok, "."))
    short, long_ = greedy_decode(decoder, [[1], [1]], token_bytes=tok.token_bytes, stop_ids=tok.stop_ids,
                                 max_new_tokens=[3, 8], banned=[["Hello world"], ["Hello world"]])
    # At its last step the short one may not complete the banned text; the long one may, then its end-of-turn is
    # blocked and it goes on until its own budget.
    assert (_text(tok, short), short.stopped_by, short.banned_steps) == ("Hello wor", MAX_TOKENS, 1)
    assert _text(tok, long_).startswith("Hello world") and long_.stopped_by == MAX_TOKENS
    assert len(long_.token_ids) == 8 and long_.banned_steps == 1
    [alone] = _decode(tok, script, [["Hello world"]], max_new_tokens=3)
    assert alone == short
    with pytest.raises(ValueError, match="budgets"):
        greedy_decode(decoder, [[1], [1]], token_bytes=tok.token_bytes, stop_ids=tok.stop_ids, max_new_tokens=[3])


def test_mixed_budgets_in_one_call_equal_one_call_per_budget(smollm_tokenizer):
    """Per-request budgets change nothing but the batching: tokens, stop reasons and banned mass are those of
    decoding each budget's requests in their own call."""
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer)
    free = scorer.greedy([GreedyRequest(f"f{i}", m) for i, m in enumerate(CONTEXTS)], max_new_tokens=6)
    requests = []
    for k, budget in enumerate((2, 6, 4, 6, 3, 1)):
        i = k % len(CONTEXTS)
        # Ban the free completion's first `budget` tokens as text: the ban acts at the request's own last step.
        banned = (smollm_tokenizer.decode(free[i].token_ids[:budget]),) if k % 2 else ()
        requests.append(GreedyRequest(f"r{k}", CONTEXTS[i], banned=banned, max_new_tokens=budget))
    together = scorer.greedy(requests, max_new_tokens=6)
    separately = {}
    for budget in {r.max_new_tokens for r in requests}:
        group = [replace(r, max_new_tokens=None) for r in requests if r.max_new_tokens == budget]
        separately.update({r.id: r for r in scorer.greedy(group, max_new_tokens=budget)})
    assert any(r.banned_steps for r in together)
    for request, result in zip(requests, together, strict=True):
        alone = separately[request.id]
        print(request.id, request.max_new_tokens, repr(result.text), result.stopped_by, result.banned_mass)
        assert (result.token_ids, result.stopped_by, result.banned_mass, result.banned_steps) == \
               (alone.token_ids, alone.stopped_by, alone.banned_mass, alone.banned_steps)
        assert len(result.token_ids) <= request.max_new_tokens
    # Over several decoder calls (taken in budget order), the results are the same, in request order.
    small_calls = Scorer(CountingFakeBackend(), smollm_tokenizer, max_decode_batch=2).greedy(requests, max_new_tokens=6)
    assert small_calls == together
    # The call's max_new_tokens caps a request's own budget.
    [capped] = scorer.greedy([GreedyRequest("c", CONTEXTS[0], max_new_tokens=50)], max_new_tokens=2)
    assert capped.token_ids == free[0].token_ids[:2]


def _program_script(tok, then):
    """Script: a closed python block, then the tokens `then`, each the only scripted choice."""
    ids = list(tok.encode(PROGRAM).ids) + list(then)
    return ids, {tuple(ids[:k]): [ids[k]] for k in range(len(ids))}


PROGRAM = "```python\ndef f(x):\n    return x\n```"


def _decode_with_rule(tok, script, rules, banned=None, max_new_tokens=40):
    decoder = ScriptedDecoder(tok.vocab_size, script, fallback=_id(tok, "."))
    out = greedy_decode(decoder, [[1]] * len(rules), token_bytes=tok.token_bytes, stop_ids=tok.stop_ids,
                        max_new_tokens=max_new_tokens, banned=banned, action_done=rules)
    return out, decoder.steps


def test_after_a_closed_program_one_more_token_decides_action_done(smollm_tokenizer):
    """(a) block + a token that is not a stop token: ACTION_DONE right there, where the rule-less decode rambles to
    its end-of-turn; the same script decoded without the rule in the same call is untouched."""
    from fastscore.study.data.envs.mbpp.env import program_written

    tok = smollm_tokenizer
    ids, script = _program_script(tok, [_id(tok, "Ċ"), _id(tok, "This"), _id(tok, "Ġworks"), tok.end_of_turn_id])
    n_block = len(ids) - 4
    (ruled, free), steps = _decode_with_rule(tok, script, [program_written, None])
    assert (ruled.stopped_by, ruled.token_ids) == (ACTION_DONE, tuple(ids[: n_block + 1]))
    assert (free.stopped_by, free.token_ids) == (END_OF_TURN, tuple(ids[:-1]))
    [alone], alone_steps = _decode_with_rule(tok, script, [program_written])
    assert alone == ruled and alone_steps == n_block  # decoding stopped there: no step after the extra token
    print("steps with the rule", alone_steps, "without", steps)


def test_a_closed_program_then_end_of_turn_is_end_of_turn(smollm_tokenizer):
    """(b) block + the stop token: the same END_OF_TURN completion as without the rule."""
    from fastscore.study.data.envs.mbpp.env import program_written

    tok = smollm_tokenizer
    ids, script = _program_script(tok, [tok.end_of_turn_id])
    (ruled, free), _ = _decode_with_rule(tok, script, [program_written, None])
    assert ruled == free and (ruled.stopped_by, ruled.token_ids) == (END_OF_TURN, tuple(ids[:-1]))


def test_no_rule_never_stops_early_and_the_budget_still_binds(smollm_tokenizer):
    """(c) without a rule (the tools environment's case) a closed block is just text; with one, a budget reached
    before the block closes is MAX_TOKENS as before."""
    from fastscore.study.data.envs.mbpp.env import program_written

    tok = smollm_tokenizer
    ids, script = _program_script(tok, [_id(tok, "Ċ"), _id(tok, "This"), tok.end_of_turn_id])
    [free], _ = _decode_with_rule(tok, script, [None])
    assert free.stopped_by == END_OF_TURN and free.token_ids == tuple(ids[:-1])
    [cut], _ = _decode_with_rule(tok, script, [program_written], max_new_tokens=5)
    assert cut.stopped_by == MAX_TOKENS and cut.token_ids == tuple(ids[:5])


def test_the_rule_waits_while_a_ban_can_still_act_so_the_banned_mass_is_unchanged(smollm_tokenizer):
    """Banned: the program itself. After it, whitespace keeps the text equal to the banned one, so the ban blocks
    end-of-turn again; decoding stops only once the ban cannot act any more, with the mass of decoding to the end."""
    from fastscore.study.data.envs.mbpp.env import program_written

    tok = smollm_tokenizer
    tail = [_id(tok, "Ċ"), _id(tok, "Ċ"), _id(tok, "This"), _id(tok, "Ġworks"), tok.end_of_turn_id]
    ids, script = _program_script(tok, tail)
    n_block = len(ids) - len(tail)
    (ruled, free), _ = _decode_with_rule(tok, script, [program_written, None], banned=[[PROGRAM], [PROGRAM]])
    print(ruled, free)
    assert free.banned_steps == 3  # end-of-turn blocked after the block and after each newline
    assert (ruled.banned_mass, ruled.banned_steps) == (free.banned_mass, free.banned_steps)
    assert (ruled.stopped_by, ruled.token_ids) == (ACTION_DONE, tuple(ids[: n_block + 3]))
