"""Refilling decoding (one llama.cpp decoder session per greedy call, a finished sequence's stream handed at once to
the next waiting context) gives the results of fixed batches: the same tokens, texts, stop reasons and banned steps.

llama.cpp f32 steps are batch-invariant to the bit, but a context's first logits row comes out of whichever batch
computed its last context token (a prefill batch of some trie node in fixed batches, the step batch when it joins),
and those agree to float32 rounding only; so does the banned mass of a ban that acts at the first step. Fixed batches
of another width differ from each other in the same way: both differences are printed.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
import pytest

import fastscore
from fastscore.bench.lab.refill_decode import CountingDecoder
from fastscore.decode import greedy_decode
from fastscore.records import GreedyRequest, Message
from fastscore.scorer import Scorer

pytest.importorskip("llama_cpp")

SYSTEM = Message("system", "You are a careful assistant. Answer in one short sentence, then stop.")
QUESTIONS = ["Name a colour.", "Write a haiku about rain.", "What is 2 + 2?", "Hi", "Describe a cat.",
             "List three fruits.", "Say nothing.", "Translate 'bonjour'.", "Spell 'tree' backwards.",
             "Count to five.", "Why is the sky blue?", "Give a word that rhymes with 'light'."]


def _requests(n: int, budgets, banned=(), ban_prefix=(), rules=()) -> list[GreedyRequest]:
    """Contexts sharing the system prompt, some sharing a whole first turn (the study's conditions of one item)."""
    out = []
    for i in range(n):
        turns = (SYSTEM, Message("user", QUESTIONS[i % len(QUESTIONS)]))
        if i % 3 == 2:
            turns += (Message("assistant", "Sure."), Message("user", "Again, differently."))
        out.append(GreedyRequest(f"r{i}", turns, banned=tuple(banned[i]) if i < len(banned) else (),
                                 max_new_tokens=budgets[i % len(budgets)],
                                 ban_prefix=i < len(ban_prefix) and ban_prefix[i],
                                 action_done=rules[i] if i < len(rules) else None))
    return out


def _fields(results):
    return [(r.id, r.token_ids, r.text, r.stopped_by, r.banned_mass, r.banned_steps) for r in results]


def _differing(a, b) -> int:
    """Results differing in anything but the banned mass's float rounding."""
    key = lambda r: (r.id, r.token_ids, r.text, r.stopped_by, r.banned_steps)  # noqa: E731
    return sum(key(x) != key(y) for x, y in zip(a, b, strict=True))


def _mass_gap(a, b) -> float:
    """The largest relative difference of banned masses."""
    return max((abs(x.banned_mass - y.banned_mass) / max(x.banned_mass, 1e-30) for x, y in zip(a, b, strict=True)
                if x.banned_mass or y.banned_mass), default=0.0)


def _rngs(requests):
    return [np.random.default_rng([5, zlib.crc32(r.id.encode())]) for r in requests]


@pytest.fixture(scope="module")
def tiny(tiny_artefact):
    with fastscore.load(str(tiny_artefact("llama", "llamacpp", "f32").path), threads=2) as model:
        yield model.scorer


def _pair(scorer: Scorer, width: int) -> tuple[Scorer, Scorer]:
    make = lambda refill: Scorer(scorer.backend, scorer.tokenizer, max_decode_batch=width,  # noqa: E731
                                 refill_decode=refill)
    return make(False), make(True)


def test_refilling_equals_fixed_batches_with_budgets_bans_rules_and_sampling(tiny):
    chunked, refilled = _pair(tiny, width=4)
    narrow = Scorer(tiny.backend, tiny.tokenizer, max_decode_batch=1, refill_decode=False)
    free = chunked.greedy(_requests(12, [6]), max_new_tokens=6)
    # Bans that act: each request's own free completion (as text, as a prefix for some), or a prefix of it.
    banned = [[free[i].text] if i % 2 == 0 else [free[i].text[:3]] for i in range(12)]
    rules = [None, (lambda t: len(t) > 8), None, (lambda t: " " in t)] * 3
    requests = _requests(12, [3, 17, 9, 24, 1, 12], banned, [i % 4 == 1 for i in range(12)], rules)
    differing, gap, gap_fixed = 0, 0.0, 0.0
    for temperature in (0.0, 0.8):
        rngs = (lambda: None) if temperature == 0 else (lambda: _rngs(requests))
        a = chunked.greedy(requests, max_new_tokens=30, temperature=temperature, rngs=rngs())
        b = refilled.greedy(requests, max_new_tokens=30, temperature=temperature, rngs=rngs())
        c = narrow.greedy(requests, max_new_tokens=30, temperature=temperature, rngs=rngs())
        differing += _differing(a, b) + _differing(a, c)
        gap, gap_fixed = max(gap, _mass_gap(a, b)), max(gap_fixed, _mass_gap(a, c))
        assert sum(r.banned_steps for r in a) > 0, "the bans must act for this test to mean anything"
        assert len({len(r.token_ids) for r in a}) > 3, "the completions must end at different steps"
    print(f"{differing} of 48 results differ (refilled and batches of 1 vs batches of 4); banned mass, largest "
          f"relative difference: refilled {gap:.1e}, batches of 1 {gap_fixed:.1e}")
    assert differing == 0
    assert gap <= 1e-5


def test_the_loop_refills_freed_slots_and_keeps_steps_full(tiny):
    """At the decoder: every context joins, the batch stays at its width while contexts wait, fewer steps run."""
    requests = _requests(10, [2, 20, 5, 11])
    contexts = [tiny.context_ids(r.messages) for r in requests]
    budgets = [r.max_new_tokens for r in requests]
    kwargs = dict(token_bytes=tiny.tokenizer.token_bytes, stop_ids=tiny.tokenizer.stop_ids,
                  max_new_tokens=budgets)
    refill = CountingDecoder(tiny.backend.decoder(max(budgets)))
    together = greedy_decode(refill, contexts, width=3, **kwargs)
    assert sum(refill.joins) == len(contexts) - 3
    last_join = max(k for k, joined in enumerate(refill.joins) if joined)
    assert set(refill.rows[: last_join + 1]) == {3}  # full width until the last context has joined
    chunk_steps, chunked = 0, []
    for lo in range(0, len(contexts), 3):
        fixed = CountingDecoder(tiny.backend.decoder(max(budgets[lo:lo + 3])))
        chunked += greedy_decode(fixed, contexts[lo:lo + 3], **{**kwargs, "max_new_tokens": budgets[lo:lo + 3]})
        chunk_steps += len(fixed.rows)
    print(f"steps: fixed batches {chunk_steps}, refilled {len(refill.rows)}; "
          f"{sum(a.token_ids != b.token_ids for a, b in zip(chunked, together))} completions differ")
    assert [d.token_ids for d in together] == [d.token_ids for d in chunked]
    assert len(refill.rows) < chunk_steps


def test_a_decoder_that_cannot_refill_keeps_fixed_batches(fake_scorer):
    """The instrumented fake's (unified-cache) decoder declares no refilling: the scorer batches as before."""
    assert not fake_scorer.backend.decoder(4).refills
    requests = _requests(5, [3, 6])
    narrow = Scorer(fake_scorer.backend, fake_scorer.tokenizer, max_decode_batch=2)
    assert narrow.greedy(requests, max_new_tokens=6) == fake_scorer.greedy(requests, max_new_tokens=6)


@pytest.mark.slow  # 48 s with 8 requests on a loaded 2-core machine (the tiny model's tests hold the same claims)
def test_refilling_on_the_embedded_model_f32_gives_the_same_completions(smollm_artefact):
    with fastscore.load(threads=2) as model:
        chunked, refilled = _pair(model.scorer, width=3)
        rules = [None, (lambda t: "." in t)] * 3
        requests = _requests(6, [3, 9, 5], rules=rules)
        a = chunked.greedy(requests, max_new_tokens=9)
        b = refilled.greedy(requests, max_new_tokens=9)
    print(f"{_differing(a, b)} of {len(a)} results differ; lengths {[len(r.token_ids) for r in a]}, "
          f"stopped by {[r.stopped_by for r in a]}")
    assert _differing(a, b) == 0


def test_a_context_repeated_under_another_ban_follows_the_first_until_the_ban_parts_them(tiny):
    """The study decodes `after` and `ban` (the same messages, the failed action banned): the banned twin reads the
    free completion's logits and joins as a sequence of its own only where the ban makes it choose another token.
    Results equal fixed batches (which decode every context in its own sequence); a twin whose ban never acts costs
    no sequence, so fewer rows are stepped."""
    chunked, refilled = _pair(tiny, width=4)
    plain = _requests(6, [6, 12, 20])
    free = chunked.greedy(plain, max_new_tokens=20)
    never = "a text no completion here writes"
    # twins of each context: banned as its free text (parts where that text would end), as a prefix of its first
    # characters (parts at once), or as a text it never writes (follows to the end)
    bans = lambda i: [[free[i].text], [free[i].text[:2]], [never]][i % 3]  # noqa: E731
    twins = [GreedyRequest(f"{r.id}-ban", r.messages, banned=tuple(bans(i)), max_new_tokens=r.max_new_tokens,
                           ban_prefix=i % 3 == 1)
             for i, r in enumerate(plain)]
    requests = [x for pair in zip(plain, twins) for x in pair]
    a = chunked.greedy(requests, max_new_tokens=20)
    b = refilled.greedy(requests, max_new_tokens=20)
    print(f"{_differing(a, b)} of {len(a)} results differ; banned mass, largest relative difference "
          f"{_mass_gap(a, b):.1e}; banned steps {[r.banned_steps for r in a]}")
    assert _differing(a, b) == 0 and _mass_gap(a, b) <= 1e-5
    assert sum(r.banned_steps for r in a[1::2]) > 0 and any(x.token_ids != y.token_ids for x, y in
                                                             zip(a[::2], a[1::2])), "the bans must part some twins"
    assert [r.token_ids for r in a[5::6]] == [r.token_ids for r in a[4::6]]  # never acts: the twin's own text

    contexts = [tiny.context_ids(r.messages) for r in requests]
    kwargs = dict(token_bytes=tiny.tokenizer.token_bytes, stop_ids=tiny.tokenizer.stop_ids,
                  max_new_tokens=[r.max_new_tokens for r in requests], banned=[r.banned for r in requests],
                  ban_prefix=[r.ban_prefix for r in requests])
    followed = CountingDecoder(tiny.backend.decoder(20))
    together = greedy_decode(followed, contexts, width=len(contexts), **kwargs)
    alone = CountingDecoder(tiny.backend.decoder(20))
    separate = greedy_decode(alone, contexts, **kwargs)  # no width: every context in its own sequence
    print(f"rows stepped: each context its own sequence {sum(alone.rows)}, twins following {sum(followed.rows)}")
    assert [d.token_ids for d in together] == [d.token_ids for d in separate]
    assert sum(followed.rows) < sum(alone.rows)


def test_start_tokens_from_a_completion_give_that_completion_with_fewer_rows_decoded(tiny):
    """GreedyRequest.start_ids: tokens greedy decoding would write itself, taken as given and prefilled with the
    context. From none to all of a free completion's tokens, under budgets and action rules, the completions are the
    free ones; a completion its start already ends (its budget, its rule) runs no sequence; the decoder computes
    fewer step rows."""
    rules = [None, (lambda t: len(t) > 12), None, (lambda t: " " in t.strip())] * 3
    requests = _requests(12, [4, 17, 9, 24], rules=rules)
    free = tiny.greedy(requests, max_new_tokens=30)
    assert {r.stopped_by for r in free} >= {"max_tokens", "action_done"}, "budgets and rules must end some"
    begun = []
    for k, (request, result) in enumerate(zip(requests, free)):
        n = len(result.token_ids)
        begun.append(replace(request, start_ids=result.token_ids[: (0, 1, n // 2, n)[k % 4]]))
    contexts = [tiny.context_ids(r.messages) for r in requests]
    rows = {}
    for name, reqs in (("free", requests), ("begun", begun)):
        decoder = CountingDecoder(tiny.backend.decoder(30))
        decoded = greedy_decode(decoder, contexts, token_bytes=tiny.tokenizer.token_bytes,
                                stop_ids=tiny.tokenizer.stop_ids, max_new_tokens=[r.max_new_tokens for r in reqs],
                                action_done=[r.action_done for r in reqs], width=4,
                                starts=[r.start_ids for r in reqs])
        assert [(d.token_ids, d.stopped_by) for d in decoded] == [(r.token_ids, r.stopped_by) for r in free], name
        rows[name] = sum(decoder.rows)
    through_scorer = tiny.greedy(begun, max_new_tokens=30)
    print(f"rows stepped: free {rows['free']}, begun {rows['begun']}; "
          f"{_differing(free, through_scorer)} of {len(free)} differ through Scorer.greedy")
    assert _differing(free, through_scorer) == 0
    assert rows["begun"] < rows["free"]
    ended = [i for i, (r, b) in enumerate(zip(free, begun)) if r.stopped_by != "end_of_turn"
             and len(b.start_ids) == len(r.token_ids)]
    assert ended, "some completion must be ended by its start tokens alone"
    decoder = CountingDecoder(tiny.backend.decoder(30))
    alone = greedy_decode(decoder, [contexts[i] for i in ended], token_bytes=tiny.tokenizer.token_bytes,
                          stop_ids=tiny.tokenizer.stop_ids, max_new_tokens=[begun[i].max_new_tokens for i in ended],
                          action_done=[begun[i].action_done for i in ended], width=4,
                          starts=[begun[i].start_ids for i in ended])
    assert decoder.rows == [] and [d.token_ids for d in alone] == [free[i].token_ids for i in ended]


def test_a_ban_that_keeps_a_completion_going_past_where_its_start_ends_its_twin_decodes_it_alone(tiny):
    """Two requests of one context, budget, rule and start tokens follow each other while they write the same
    tokens. Where the start tokens end the first (its action rule armed, the next token not a stop) but a ban keeps
    the second going (it stops only once no ban can act), the second runs as a sequence of its own and gets what
    decoding it from its context gives; a stop token among the start tokens ends a completion there."""
    rule = lambda t: len(t) > 12  # noqa: E731
    [request] = _requests(1, [24], rules=[rule])
    [free] = tiny.greedy([request], max_new_tokens=30)
    assert free.stopped_by == "action_done", "the rule must end the free completion for this test to mean anything"
    twin = replace(request, id="twin", banned=(free.text + " and more",))
    [twin_free] = tiny.greedy([twin], max_new_tokens=30)
    begun = [replace(r, start_ids=free.token_ids) for r in (request, twin)]
    first, second = tiny.greedy(begun, max_new_tokens=30)
    print(f"free {free.text!r} ({free.stopped_by}); banned twin {twin_free.text!r} ({twin_free.stopped_by})")
    assert (first.token_ids, first.stopped_by) == (free.token_ids, free.stopped_by)
    assert (second.token_ids, second.stopped_by) == (twin_free.token_ids, twin_free.stopped_by)
    assert len(twin_free.token_ids) > len(free.token_ids)  # the ban kept it going
    stop = tiny.tokenizer.end_of_turn_id
    [ended] = tiny.greedy([replace(request, start_ids=free.token_ids[:2] + (stop, 7))], max_new_tokens=30)
    assert (ended.token_ids, ended.stopped_by) == (free.token_ids[:2], "end_of_turn")


def test_start_ids_outside_the_vocabulary_are_a_request_error(tiny):
    from fastscore.errors import RequestError

    [request] = _requests(1, [4])
    for bad in ((-1,), (tiny.backend.n_vocab,)):
        with pytest.raises(RequestError, match="start_ids") as raised:
            tiny.greedy([replace(request, start_ids=bad)], max_new_tokens=4)
        assert raised.value.request_id == request.id  # the study isolates the item it belongs to


def test_greedy_and_sampled_requests_in_one_call_give_what_separate_calls_give_and_share_prefill(tiny):
    """The study decodes an on-policy item's greedy completions and its samples of the same contexts in one call: each
    sampled request draws from its own generator at its own temperature, each greedy one takes the argmax (ban twins
    follow greedy leaders only, never a sample of the same context, budget and rule), and the results are those of a
    greedy call and a sampled call made apart, while the contexts they share are computed once."""
    rule = lambda t: len(t) > 10  # noqa: E731 (one rule object: samples could look like followers of the greedy)
    greedy = _requests(6, [8, 15], rules=[rule] * 6)
    free = tiny.greedy(greedy, max_new_tokens=20)
    greedy += [replace(greedy[0], id="r0-ban", banned=(free[0].text[:2],), ban_prefix=True)]
    sampled = [replace(r, id=f"{r.id}#{k}") for r in greedy[:6] for k in range(2)]
    for width in (4, 32):
        make = Scorer(tiny.backend, tiny.tokenizer, max_decode_batch=width)
        before = tiny.backend.stats.computed_tokens
        apart = (make.greedy(greedy, max_new_tokens=20)
                 + make.greedy(sampled, max_new_tokens=20, temperature=1.0, rngs=_rngs(sampled)))
        computed_apart = tiny.backend.stats.computed_tokens - before
        # in one call, greedy requests first (a sample could follow) and samples first (a sample could lead)
        for first, second in ((greedy, sampled), (sampled, greedy)):
            before = tiny.backend.stats.computed_tokens
            got = make.greedy(first + second, max_new_tokens=20,
                              temperature=[float(r in sampled) for r in first + second],
                              rngs=[_rngs([r])[0] if r in sampled else None for r in first + second])
            computed = tiny.backend.stats.computed_tokens - before
            mixed = sorted(got, key=lambda r: [x.id for x in greedy + sampled].index(r.id))
            print(f"width {width}, {'greedy' if first is greedy else 'samples'} first: {_differing(apart, mixed)} of "
                  f"{len(mixed)} differ; tokens computed apart {computed_apart}, in one call {computed}")
            assert _differing(apart, mixed) == 0 and _mass_gap(apart, mixed) <= 1e-5
            assert computed < computed_apart
    assert any(s.token_ids != free[i // 2].token_ids for i, s in enumerate(mixed[len(greedy):])), \
        "samples must differ from the greedy completions for this test to mean anything"
    with pytest.raises(ValueError, match="Generator"):
        tiny.greedy(sampled, temperature=[1.0] * len(sampled), rngs=[None] * len(sampled))
    with pytest.raises(ValueError, match="temperatures"):
        tiny.greedy(sampled, temperature=[1.0], rngs=_rngs(sampled))
