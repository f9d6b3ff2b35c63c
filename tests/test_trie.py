"""Trie, packing and plans on crafted sequences, run end to end on the instrumented fake backend."""

from __future__ import annotations

import numpy as np
import pytest
from fake_backend import FakeBackend, FakeKV

from fastscore.errors import BackendError, ContextTooLongError, ModelLoadError
from fastscore.mathops import gather_logprobs, log_softmax_rows, logsumexp_rows
from fastscore.records import TokenRequest
from fastscore.engine.trie import Trie, all_owners, pack
from fastscore.engine.plan import ScoringPlan

A = (1, 2, 3, 4, 5)
B = (1, 2, 3, 6, 7)
C = (1, 2, 3, 4, 5)  # duplicate of A
D = (1, 2)  # prefix of A and B
E = (9, 9)
CRAFTED = [A, B, C, D, E]


def runs(trie: Trie) -> list[tuple[int, ...]]:
    return [tuple(n.tokens.tolist()) for n in trie.nodes()]


def test_crafted_trie_counts_and_shape():
    trie = Trie(CRAFTED)
    assert trie.requested_tokens == 19
    # distinct prefixes: 1, 12, 123, 1234, 12345, 1236, 12367, 9, 99
    assert trie.minimal_tokens == 9
    assert runs(trie) == [(1, 2), (3,), (4, 5), (6, 7), (9, 9)]
    assert trie.end_node[0] is trie.end_node[2]  # duplicates end on one node
    assert trie.end_node[3].children  # D ends on an inner node
    assert [len(n.owners) for n in trie.nodes()] == [1, 0, 2, 1, 1]


@pytest.mark.parametrize(
    ("max_tokens", "max_seqs", "group_tokens"),
    [
        (100, 8, [9]),  # everything fits: each distinct prefix once
        (100, 1, [5, 5, 2]),  # one leaf per group: 1 2 3 recomputed for the second branch (+3)
        (7, 8, [7, 2]),  # the 1-2-3 subtree (7 tokens) fits exactly; 9 9 does not join it
        (6, 8, [5, 5, 2]),  # the subtree is opened: its prefix 1 2 3 is computed twice
        (5, 2, [5, 5, 2]),
    ],
)
def test_packing_counts(max_tokens, max_seqs, group_tokens):
    trie = Trie(CRAFTED)
    groups = pack(trie, max_tokens, max_seqs)
    assert [g.n_tokens for g in groups] == group_tokens
    for g in groups:
        assert g.n_tokens <= max_tokens and len(g.owners) <= max_seqs
        assert g.n_tokens == sum(len(n.tokens) for n in g.nodes)
    leaves = sorted(o for g in groups for o in g.owners)
    assert len(leaves) == 3  # one KV sequence per leaf, never for the prefix D or the duplicate C


def test_decode_packing_gives_every_context_a_sequence():
    trie = Trie(CRAFTED)
    groups = pack(trie, 100, 8, owners_of=all_owners)
    assert len(groups) == 1 and sorted(groups[0].owners) == [0, 1, 2, 3, 4]
    seq_ids = groups[0].seq_ids(trie)
    first = trie.nodes()[0]  # 1 2: below it end A, B, C and D
    assert sorted(groups[0].owners[s] for s in seq_ids[id(first)]) == [0, 1, 2, 3]
    # seq budget 2 with 4 sequences on the 1-2 path: the subtree is opened and split over groups
    groups = pack(trie, 100, 2, owners_of=all_owners)
    assert sorted(o for g in groups for o in g.owners) == [0, 1, 2, 3, 4]
    assert all(len(g.owners) <= 2 for g in groups)


def test_scoring_plan_requests_logits_only_where_scored():
    reqs = [TokenRequest(A, 3), TokenRequest(B, 1), TokenRequest(D, 1)]
    plan = ScoringPlan(reqs, 100, 8)
    ((batch, gather),) = list(plan.batches())
    # rows: position 0 (D, B), 1 (B), 2 (predicts 4 for A and 6 for B: one row), 3 on each branch
    assert batch.n_outputs == 5
    assert batch.n_tokens == 7 and batch.n_seqs == 2
    assert plan.requested_tokens == 12 and plan.minimal_tokens == 7 and plan.scored_tokens == 2 + 4 + 1
    assert sorted(gather.members) == [0, 1, 2] and [len(r) for r in gather.rows] == [r.n_scored for r in reqs]


def test_scoring_plan_batches_carry_their_gathers():
    # Batches materialised before any is run: each keeps its own Gather (no state hidden in the plan).
    reqs = [TokenRequest(s, 1) for s in CRAFTED]
    plan = ScoringPlan(reqs, 6, 8)
    pairs = list(plan.batches())
    assert len(pairs) > 1 and sorted(i for _, g in pairs for i in g.members) == list(range(len(reqs)))
    model = FakeBackend().model
    for batch, gather in reversed(pairs):
        kv = FakeKV(model, 64, 8, {"forward_calls": 0, "computed_tokens": 0, "output_rows": 0, "batch_sizes": []})
        for i, scores in zip(gather.members, gather.scores(kv.forward(batch))):
            want = FakeBackend().score_alone(reqs[i])
            np.testing.assert_allclose(scores.logprobs, want.logprobs, atol=1e-5)


def test_closed_backend_and_decoder_misuse_are_uniform_errors():
    backend = FakeBackend(n_ctx=64)
    dec = backend.decoder(2)
    with pytest.raises(ValueError, match="before start"):
        dec.step([0], [1])
    dec.start([A, B])
    with pytest.raises(ValueError):
        dec.step([0, 0], [1, 2])
    with pytest.raises(ValueError):
        dec.step([0], [1, 2])
    backend.close()
    with pytest.raises(ModelLoadError, match="closed"):
        backend.score_tokens([TokenRequest(A, 1)])
    with pytest.raises(ModelLoadError, match="closed"):
        backend.decoder(2)


def test_fake_backend_computes_each_shared_prefix_once():
    backend = FakeBackend(n_ctx=64, n_seq_max=8)
    reqs = [TokenRequest(s, 1) for s in CRAFTED]
    got = backend.score_tokens(reqs)
    for r, g in zip(reqs, got):
        want = backend.score_alone(r)
        np.testing.assert_allclose(g.logprobs, want.logprobs, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(g.is_argmax, want.is_argmax)
    assert backend.counters["computed_tokens"] == 9 == backend.stats.trie_minimal_tokens
    assert backend.counters["forward_calls"] == 1
    assert backend.stats.requested_tokens == 19 and backend.stats.computed_tokens == 9
    # distinct predicting positions: 1 12 123 1234 1236 9 (the last token of each sequence predicts nothing)
    assert backend.counters["output_rows"] == 6


def test_fake_backend_small_budgets_recompute_exactly_what_packing_says():
    backend = FakeBackend(n_ctx=6, n_seq_max=8)
    got = backend.score_tokens([TokenRequest(s, 1) for s in CRAFTED])
    assert backend.counters["computed_tokens"] == 12 and backend.counters["forward_calls"] == 3
    for s, g in zip(CRAFTED, got):
        np.testing.assert_allclose(g.logprobs, backend.score_alone(TokenRequest(s, 1)).logprobs, atol=1e-5)


def test_the_group_budget_is_the_shared_kv_cache_policy():
    # The llama.cpp policy, run on the fake: groups of max_group_tokens, raised to the longest request.
    budget = FakeBackend(n_ctx=64, n_seq_max=8, max_group_tokens=6)
    got = budget.score_tokens([TokenRequest(s, 1) for s in CRAFTED])
    assert budget.counters["computed_tokens"] == 12 and budget.counters["forward_calls"] == 3
    assert budget.stats.extra["packs"] == 3 and budget.stats.computed_tokens == 12
    for s, g in zip(CRAFTED, got):
        np.testing.assert_allclose(g.logprobs, budget.score_alone(TokenRequest(s, 1)).logprobs, atol=1e-5)
    assert budget.group_tokens([TokenRequest(tuple(range(20)), 1)]) == 20  # never below the longest request
    assert FakeBackend(n_ctx=16, max_group_tokens=6).group_tokens([TokenRequest(tuple(range(20)), 1)]) == 16


def test_fake_logprob_rows_are_the_reference_distributions():
    backend = FakeBackend(n_ctx=6, n_seq_max=2)  # several packs, prefixes recomputed
    reqs = [TokenRequest(s, 1) for s in CRAFTED]
    rows = backend.logprob_rows(reqs)
    for r, got in zip(reqs, rows):
        want = log_softmax_rows(backend.model.reference_logits(r.tokens)[r.score_from - 1 : -1])
        assert got.dtype == np.float64 and got.shape == (r.n_scored, backend.n_vocab)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_fake_model_depends_on_the_whole_prefix():
    model = FakeBackend().model
    a = model.reference_logits([1, 2, 3, 4])
    b = model.reference_logits([5, 2, 3, 4])  # differs only in the first token
    assert np.abs(a[-1] - b[-1]).max() > 0.5


@pytest.mark.parametrize("seed", range(6))
def test_random_tries_match_scoring_alone(seed):
    rng = np.random.default_rng(seed)
    stems = [tuple(rng.integers(0, 61, size=rng.integers(1, 12)).tolist()) for _ in range(4)]
    seqs = []
    for _ in range(40):
        s = stems[rng.integers(len(stems))] + tuple(rng.integers(0, 61, size=rng.integers(0, 8)).tolist())
        if rng.random() < 0.3:  # branch off a previous sequence
            prev = seqs[rng.integers(len(seqs))] if seqs else s
            s = prev[: rng.integers(1, len(prev) + 1)] + s
        seqs.append(s if len(s) > 1 else s + (1,))
    reqs = [TokenRequest(s, int(rng.integers(1, len(s)))) for s in seqs]
    backend = FakeBackend(n_ctx=int(rng.integers(32, 80)), n_seq_max=int(rng.integers(1, 9)))
    order = rng.permutation(len(reqs))
    got = backend.score_tokens([reqs[i] for i in order])
    for k, i in enumerate(order):
        want = backend.score_alone(reqs[i])
        np.testing.assert_allclose(got[k].logprobs, want.logprobs, atol=1e-5)
        np.testing.assert_array_equal(got[k].is_argmax, want.is_argmax)
    assert backend.stats.computed_tokens >= backend.stats.trie_minimal_tokens
    assert backend.stats.computed_tokens <= backend.stats.requested_tokens


def test_too_long_request_is_a_typed_error():
    with pytest.raises(ContextTooLongError, match="20 tokens"):
        FakeBackend(n_ctx=16).score_tokens([TokenRequest(tuple(range(20)), 1)])


def test_fake_decoder_matches_reference_and_batches_steps():
    backend = FakeBackend(n_ctx=64, n_seq_max=3)
    contexts = [A, B, C, D, E]  # 5 contexts, 3 sequences per cache: two caches
    with backend.decoder(max_new_tokens=4) as dec:
        logits = dec.start(contexts)
        seqs = [list(c) for c in contexts]
        for _ in range(3):
            for k, s in enumerate(seqs):
                np.testing.assert_allclose(logits[k], backend.model.reference_logits(s)[-1], atol=1e-5)
            nxt = [int(np.argmax(row)) for row in logits]
            calls = backend.counters["forward_calls"]
            logits = dec.step(list(range(len(seqs))), nxt)
            assert backend.counters["forward_calls"] - calls == 2  # one forward per cache per step
            for s, t in zip(seqs, nxt):
                s.append(t)
    assert backend.counters["caches_opened"] == 2


def test_fake_decoder_fits_contexts_beyond_one_forward_into_one_cache():
    """A decoding cache may hold more prefill than one forward takes (n_ctx): it is prefilled in pieces of at most
    n_ctx tokens, parents first, and every step is then a single forward over all contexts."""
    rng = np.random.default_rng(3)
    contexts = [tuple(int(t) for t in rng.integers(0, 50, size=int(rng.integers(20, 40)))) for _ in range(6)]
    backend = FakeBackend(n_ctx=48, n_seq_max=8, max_decode_tokens=400)
    with backend.decoder(max_new_tokens=2) as dec:
        logits = dec.start(contexts)
        assert backend.counters["caches_opened"] == 1
        assert max(backend.counters["batch_sizes"]) <= 48 and backend.counters["forward_calls"] > 1
        for k, c in enumerate(contexts):
            np.testing.assert_allclose(logits[k], backend.model.reference_logits(c)[-1], atol=1e-5)
        calls = backend.counters["forward_calls"]
        nxt = [int(np.argmax(row)) for row in logits]
        logits = dec.step(list(range(len(contexts))), nxt)
        assert backend.counters["forward_calls"] == calls + 1
        for k, c in enumerate(contexts):
            np.testing.assert_allclose(logits[k], backend.model.reference_logits(c + (nxt[k],))[-1], atol=1e-5)


def test_batch_split_keeps_order_runs_and_outputs():
    reqs = [TokenRequest((1, 2, 3, 4, 5), 2), TokenRequest((1, 2, 3, 9, 8, 7), 3)]
    batch, _ = next(ScoringPlan(reqs, 64, 8).batches())
    pieces = batch.split(3)
    assert [p.n_tokens for p in pieces] == [3, 3, 2]
    assert np.concatenate([p.tokens for p in pieces]).tolist() == batch.tokens.tolist()
    assert np.concatenate([p.outputs for p in pieces]).tolist() == batch.outputs.tolist()
    whole = [ids.tolist() for ids in batch.seq_ids_per_token()]
    assert [ids.tolist() for p in pieces for ids in p.seq_ids_per_token()] == whole
    assert batch.split(8) == [batch]


def test_fake_decoder_reserves_room_for_the_new_tokens_only():
    backend = FakeBackend(n_ctx=64, n_seq_max=8)
    with backend.decoder(max_new_tokens=2) as dec:
        dec.start([A, B])  # 7 prefill cells + 2 x 2 reserved
        dec.step([0, 1], [3, 3])
        dec.step([0, 1], [3, 3])
        with pytest.raises(BackendError):
            dec.step([0, 1], [3, 3])
    with pytest.raises(ContextTooLongError, match="70 tokens"):
        backend.decoder(1).start([tuple(range(70))])


def test_fake_decoder_steps_a_subset():
    backend = FakeBackend(n_ctx=64, n_seq_max=8)
    dec = backend.decoder(max_new_tokens=2)
    dec.start([A, B])
    out = dec.step([1], [11])
    np.testing.assert_allclose(out[0], backend.model.reference_logits(B + (11,))[-1], atol=1e-5)
    dec.close()


def test_log_softmax_rows_normalises_in_float64():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(300, 5000)) * 8 + 1000).astype(np.float32)  # > one block, large offsets
    lsm = log_softmax_rows(logits)
    assert lsm.dtype == np.float64
    np.testing.assert_allclose(np.exp(lsm).sum(axis=1), 1.0, atol=1e-9)
    x = logits.astype(np.float64)
    want = x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
    assert np.abs(logsumexp_rows(logits) - want).max() < 1e-4


def test_gather_logprobs_over_many_blocks_gives_each_row_its_own_bits():
    """The normalisers are taken block by block over the rows some target reads (every row, or a subset spread over
    several blocks): each equals the row's own computation alone, to the bit, and so does its argmax."""
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(150, 3000)) * 6).astype(np.float32)
    logits[7, :] = logits[7, 0]  # a row of ties: the argmax is the first index
    for rows in (np.arange(150), np.array([149, 3, 3, 7, 40, 41, 100, 7])):
        targets = rng.integers(0, 3000, len(rows))
        lp, am = gather_logprobs(logits, targets, rows=rows)
        for k, (r, t) in enumerate(zip(rows, targets)):
            row = logits[r : r + 1]
            peak = row.max(axis=1, keepdims=True)
            shifted = row - peak
            np.exp(shifted, out=shifted)
            lse = peak[0, 0].astype(np.float64) + np.log(shifted.sum(axis=1, dtype=np.float64))[0]
            assert lp[k] == np.float64(logits[r, t]) - lse
            assert am[k] == (int(row.argmax()) == t)


def test_gather_logprobs_rows_and_argmax():
    logits = np.array([[0.0, 1.0, 1.0, -2.0], [3.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    lp, am = gather_logprobs(logits, np.array([1, 2, 0, 3]), rows=np.array([0, 0, 1, 1]))
    full = log_softmax_rows(logits)
    np.testing.assert_allclose(lp, [full[0, 1], full[0, 2], full[1, 0], full[1, 3]])
    assert am.tolist() == [True, False, True, False]  # ties: the first index is the argmax, as greedy picks it
    with pytest.raises(ValueError):
        gather_logprobs(logits, np.array([4]))
