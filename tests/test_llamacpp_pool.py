"""The stream decoder's contexts are kept from one greedy call for the next (fastscore.backends.llamacpp_pool): a call
on a context of an earlier, larger call (its cells holding that call's K/V) gives the results of a fresh context,
and contexts are made only when a call needs a larger one."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import fastscore
from fastscore.records import GreedyRequest, Message

pytest.importorskip("llama_cpp")

SYSTEM = Message("system", "You are a careful assistant. Answer briefly.")
QUESTIONS = ["Name a colour.", "Write a long story about a lighthouse keeper and the sea, in detail.", "Hi",
             "What is 2 + 2?", "Describe a cat.", "List three fruits and say why each is good to eat."]


def _requests(n: int, budget: int, tag: str) -> list[GreedyRequest]:
    return [GreedyRequest(f"{tag}{i}", (SYSTEM, Message("user", QUESTIONS[i % len(QUESTIONS)] * (1 + i % 3))),
                          max_new_tokens=budget, banned=("The",) if i % 2 else ())
            for i in range(n)]


# (requests, budget): small, then larger in streams and cells (the kept context grows), then small again (reused)
CALLS = [(3, 6), (9, 24), (4, 8)]


def _run(scorer, calls, fresh: bool):
    results = []
    for n, (count, budget) in enumerate(calls):
        if fresh:
            scorer.backend.stream_contexts.release()
        requests = _requests(count, budget, f"c{n}-")
        rngs = [np.random.default_rng([3, zlib.crc32(r.id.encode())]) for r in requests]
        greedy = scorer.greedy(requests, max_new_tokens=budget)
        sampled = scorer.greedy(requests, max_new_tokens=budget, temperature=1.0, rngs=rngs)
        results.append([(r.id, r.token_ids, r.stopped_by, r.banned_mass) for r in greedy + sampled])
    return results


@pytest.fixture(scope="module")
def tiny_f32(tiny_artefact):
    with fastscore.load(str(tiny_artefact("llama", "llamacpp", "f32").path), threads=1) as model:
        yield model.scorer


def test_a_kept_context_gives_the_results_of_a_fresh_one(tiny_f32):
    pool = tiny_f32.backend.stream_contexts
    pool.release()
    made = pool.created
    kept = _run(tiny_f32, CALLS, fresh=False)
    shapes_made = pool.created - made
    grown = pool.kept
    fresh = _run(tiny_f32, CALLS, fresh=True)
    differing = sum(a != b for call_a, call_b in zip(kept, fresh) for a, b in zip(call_a, call_b, strict=True))
    print(f"contexts made: {shapes_made} for {2 * len(CALLS)} decoder calls kept, "
          f"{pool.created - made - shapes_made} fresh; {differing} results differ")
    assert differing == 0  # token ids, stop reasons and banned masses, to the bit
    assert shapes_made == 2  # the first call's, then one grown for the second; the rest reuse it
    assert grown is not None and grown.n_streams >= 9  # the last, small call ran on the second call's context


def test_closing_the_backend_frees_the_kept_context(tiny_artefact):
    model = fastscore.load(str(tiny_artefact("llama", "llamacpp", "f32").path), threads=1)
    with model:
        model.scorer.greedy(_requests(2, 4, "x"), max_new_tokens=4)
        pool = model.scorer.backend.stream_contexts
        assert pool.kept is not None
    assert pool.closed and pool.kept is None
