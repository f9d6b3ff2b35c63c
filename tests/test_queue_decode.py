"""Decoding from a queue (decode.queue_decode, Scorer.serve_greedy, the greedy stage's decode_queue.served): units
pulled one after another into one refilling session give each unit what a call of its own gives, hand each unit
back once, and keep the steps full until the queue is empty.

As in tests/test_refill_decode.py, a context's first logits row comes out of whichever batch computed its last context
token, so banned masses agree to float32 rounding only (printed); tokens, texts, stop reasons and banned steps agree.
"""

from __future__ import annotations

import threading
import zlib
from collections import deque
from dataclasses import replace

import numpy as np
import pytest

import fastscore
from fastscore.bench.lab.refill_decode import CountingDecoder
from fastscore.decode import greedy_decode, queue_decode
from fastscore.decode_units import decode_unit
from fastscore.errors import ContextTooLongError
from fastscore.records import GreedyRequest, Message
from fastscore.scorer import Scorer

pytest.importorskip("llama_cpp")

SYSTEM = Message("system", "You are a careful assistant. Answer in one short sentence, then stop.")
QUESTIONS = ["Name a colour.", "Write a haiku about rain.", "What is 2 + 2?", "Describe a cat.", "Count to five.",
             "Why is the sky blue?", "List three fruits."]


def _item(k: int, budget: int, rule) -> tuple[list[GreedyRequest], list[float]]:
    """One study item's requests: 3 greedy contexts (two sharing a first turn), a ban twin of the first, and 2 samples
    of each greedy context; with the temperature of each."""
    question = Message("user", QUESTIONS[k % len(QUESTIONS)])
    turns = [(SYSTEM, question), (SYSTEM, question, Message("assistant", "Sure."), Message("user", "Again.")),
             (SYSTEM, Message("user", QUESTIONS[(k + 3) % len(QUESTIONS)]))]
    greedy = [GreedyRequest(f"i{k}:c{c}", t, max_new_tokens=budget, action_done=rule) for c, t in enumerate(turns)]
    greedy.append(replace(greedy[0], id=f"i{k}:ban", banned=("Blue", "The"), ban_prefix=True))
    sampled = [replace(r, id=f"{r.id}#{s}") for r in greedy[:3] for s in range(2)]
    return greedy + sampled, [0.0] * len(greedy) + [1.0] * len(sampled)


def _rngs(requests, temperatures):
    return [np.random.default_rng([7, zlib.crc32(r.id.encode())]) if t else None
            for r, t in zip(requests, temperatures)]


def _key(r):
    return (r.id, r.token_ids, r.text, r.stopped_by, r.banned_steps)


@pytest.fixture(scope="module")
def tiny(tiny_artefact):
    with fastscore.load(str(tiny_artefact("llama", "llamacpp", "f32").path), threads=2) as model:
        yield model.scorer


@pytest.fixture(scope="module")
def items():
    rule = lambda text: len(text) > 12  # noqa: E731 (one rule object per item set, as the study shares one)
    return [_item(k, budget, rule) for k, budget in enumerate([6, 18, 10, 14, 4, 12])]


def test_units_served_from_a_queue_get_what_their_own_calls_give(tiny, items):
    expected = {k: tiny.greedy(reqs, max_new_tokens=20, temperature=temps, rngs=_rngs(reqs, temps))
                for k, (reqs, temps) in enumerate(items)}
    assert any(r.banned_steps for results in expected.values() for r in results), "a ban must act for this test"
    for width in (3, 32):
        scorer = Scorer(tiny.backend, tiny.tokenizer, max_decode_batch=width)
        assert scorer.can_serve_greedy()
        units = deque(scorer.greedy_unit(k, reqs, 20, temperature=temps, rngs=_rngs(reqs, temps))
                      for k, (reqs, temps) in enumerate(items))
        longest = max(unit.longest for unit in units)
        got: dict[int, list] = {}

        def done(key, results):
            assert key not in got, "a unit is handed back once"
            got[key] = results

        scorer.serve_greedy(lambda: units.popleft() if units else None, done, longest)
        assert sorted(got) == sorted(expected)
        differ = sum(_key(a) != _key(b) for k in got for a, b in zip(got[k], expected[k], strict=True))
        gap = max(abs(a.banned_mass - b.banned_mass) / max(a.banned_mass, 1e-30)
                  for k in got for a, b in zip(got[k], expected[k]) if a.banned_mass or b.banned_mass)
        print(f"width {width}: {differ} of {sum(map(len, got.values()))} completions differ; "
              f"banned mass relative gap {gap:.2e}")
        # Where steps give a prefill's bits (the study's condition for a queue) the masses are the same bits too.
        assert differ == 0 and gap <= (0.0 if tiny.backend.steps_match_prefill else 1e-5)


def test_a_session_pulls_units_as_its_slots_free_and_keeps_its_steps_full(tiny, items):
    """At the decoder: the session pulls a unit only when no context waits, every step is full until the queue is
    empty, and it takes fewer steps than one greedy_decode per unit."""
    kwargs = dict(token_bytes=tiny.tokenizer.token_bytes, stop_ids=tiny.tokenizer.stop_ids)
    units = []
    for k, (reqs, temps) in enumerate(items):
        units.append(decode_unit(k, [tiny.context_ids(r.messages) for r in reqs],
                                 max_new_tokens=[r.max_new_tokens for r in reqs], temperature=temps,
                                 rngs=_rngs(reqs, temps), action_done=[r.action_done for r in reqs],
                                 banned=[r.banned for r in reqs], ban_prefix=[r.ban_prefix for r in reqs]))
    longest = max(unit.longest for unit in units)
    decoder = CountingDecoder(tiny.backend.decoder(longest))
    queue, pulled_at, got = deque(units), [], {}

    def pull():
        pulled_at.append(len(decoder.rows))
        return queue.popleft() if queue else None

    queue_decode(decoder, pull, lambda key, decoded: got.setdefault(key, decoded), width=4, longest=longest,
                 **kwargs)
    emptied = pulled_at[len(units)]  # the step at which the session found the queue empty
    print(f"pulls before steps {pulled_at}; rows per step {decoder.rows}")
    assert sorted(got) == list(range(len(units)))
    assert set(decoder.rows[:emptied]) == {4}  # full until the queue is empty
    assert len(pulled_at) == len(units) + 1 and pulled_at[0] == 0 and pulled_at[-2] > 0  # pulled along the way
    apart = 0
    for unit in units:
        own = CountingDecoder(tiny.backend.decoder(longest))
        fresh = [np.random.default_rng([7, zlib.crc32(r.id.encode())]) if t else None
                 for r, t in zip(items[unit.key][0], unit.temperatures)]
        alone = greedy_decode(own, unit.contexts, max_new_tokens=unit.budgets, temperature=unit.temperatures,
                              rngs=fresh, action_done=unit.action_done, banned=[r.banned for r in items[unit.key][0]],
                              ban_prefix=unit.ban_prefix, width=4, **kwargs)
        assert [d.token_ids for d in alone] == [d.token_ids for d in got[unit.key]]
        apart += len(own.rows)
    print(f"steps: one call per unit {apart}, one queue {len(decoder.rows)}")
    assert len(decoder.rows) < apart


def test_a_unit_longer_than_the_session_and_a_decoder_that_cannot_refill_are_refused(tiny, fake_scorer, items):
    reqs, temps = items[0]
    unit = tiny.greedy_unit("u", reqs, 20, temperature=temps, rngs=_rngs(reqs, temps))
    with pytest.raises(ValueError, match="more than the session"):
        tiny.serve_greedy(deque([unit, None]).popleft, lambda *a: None, unit.longest - 1)
    assert not fake_scorer.can_serve_greedy()
    with pytest.raises(ValueError, match="cannot take sequences between steps"):
        queue_decode(fake_scorer.backend.decoder(4), lambda: None, lambda *a: None, token_bytes=[], stop_ids=[],
                     width=2, longest=8)
    assert not Scorer(tiny.backend, tiny.tokenizer, refill_decode=False).can_serve_greedy()


def test_a_rejected_request_fails_when_its_unit_is_made_before_any_decoding(tiny):
    long_turn = Message("user", "word " * (tiny.backend.n_ctx + 10))
    with pytest.raises(ContextTooLongError):
        tiny.greedy_unit("u", [GreedyRequest("too-long", (SYSTEM, long_turn))], 8)


def test_two_sessions_pulling_from_one_queue_give_each_unit_what_its_own_call_gives(tiny_artefact, items):
    """Two lanes (each its own copy of the model, in a thread of its own) pull from one queue: which session decodes
    a unit, and beside which others, depends on timing; on f32 the completions do not."""
    path = str(tiny_artefact("llama", "llamacpp", "f32").path)
    with fastscore.load(path, threads=1) as one, fastscore.load(path, threads=1) as two:
        expected = {k: one.scorer.greedy(reqs, max_new_tokens=20, temperature=temps, rngs=_rngs(reqs, temps))
                    for k, (reqs, temps) in enumerate(items)}
        units = deque(one.scorer.greedy_unit(k, reqs, 20, temperature=temps, rngs=_rngs(reqs, temps))
                      for k, (reqs, temps) in enumerate(items))
        longest = max(unit.longest for unit in units)
        lock, got, served_by = threading.Lock(), {}, {}

        def lane(scorer: Scorer, name: str) -> None:
            def pull():
                with lock:
                    return units.popleft() if units else None

            def done(key, results):
                with lock:
                    got[key], served_by[key] = results, name
            Scorer(scorer.backend, scorer.tokenizer, max_decode_batch=4).serve_greedy(pull, done, longest)

        threads = [threading.Thread(target=lane, args=(m.scorer, name)) for m, name in ((one, "a"), (two, "b"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(f"units per lane: {sorted(served_by.values())}")
    assert sorted(got) == sorted(expected)
    assert all(_key(a) == _key(b) for k in got for a, b in zip(got[k], expected[k], strict=True))
