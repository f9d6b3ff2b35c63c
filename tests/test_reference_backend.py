"""The transformers reference backend: a proper distribution per token, argmax flags, stats, decoding, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastscore.backends import load
from fastscore.errors import ArtefactUnavailableError, ContextTooLongError
from fastscore.records import TokenRequest
from fastscore.variants import BATCH_INVARIANCE_TOL

SMALL_VOCAB = 64


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory) -> Path:
    """A seeded random Llama with a 64-token vocabulary, so every possible next token can be scored."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=SMALL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3, bos_token_id=None,
        eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("small-vocab")
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def small(small_vocab_dir):
    with load("reference", small_vocab_dir, n_threads=1) as backend:
        yield backend


def test_logprobs_are_a_distribution_and_argmax_is_flagged(small):
    context = (5, 17, 3, 42, 8)
    requests = [TokenRequest(context + (token,), len(context)) for token in range(SMALL_VOCAB)]
    scores = small.score_tokens(requests)
    logprobs = np.array([s.logprobs[0] for s in scores])
    flags = np.array([s.is_argmax[0] for s in scores])
    total = np.exp(logprobs).sum()
    print(f"sum over the vocabulary of p(next token) = {total:.12f}")
    assert abs(total - 1.0) < 1e-6  # mathops takes the shifted exponentials in float32 (1e-7 relative each)
    assert flags.sum() == 1 and flags[np.argmax(logprobs)]
    assert all(s.logprobs.dtype == np.float64 and s.is_argmax.dtype == bool for s in scores)


def test_multi_token_scores_match_per_position_requests(small):
    tokens = (1, 9, 33, 2, 60, 7, 7, 12)
    whole = small.score_tokens([TokenRequest(tokens, 3)])[0]
    pieces = [small.score_tokens([TokenRequest(tokens[: end + 1], end)])[0] for end in range(3, len(tokens))]
    assert whole.logprobs.shape == (5,)
    np.testing.assert_allclose(whole.logprobs, [p.logprobs[0] for p in pieces], atol=BATCH_INVARIANCE_TOL)
    assert whole.is_argmax.tolist() == [bool(p.is_argmax[0]) for p in pieces]
    assert whole.total == pytest.approx(whole.logprobs.sum())


def test_stats_count_every_token_fed(small):
    small.stats.reset()
    requests = [TokenRequest((1, 2, 3, 4), 2), TokenRequest((1, 2, 3, 4, 5, 6), 3)]
    small.score_tokens(requests)
    stats = small.stats
    assert (stats.requested_tokens, stats.computed_tokens, stats.scored_tokens, stats.forward_calls) == (10, 10, 5, 2)


def test_decoder_logits_match_scoring(small):
    contexts = [[4, 8, 15, 16], [23, 42], [4, 8, 15, 16]]
    decoder = small.decoder(8)
    with decoder:
        first = decoder.start(contexts)
        second = decoder.step([0, 1], [int(first[0].argmax()), 7])
        third = decoder.step([1], [int(second[1].argmax())])
    assert first.shape == (3, SMALL_VOCAB) and first.dtype == np.float32
    np.testing.assert_allclose(first[0], first[2])
    greedy = small.score_tokens([TokenRequest(tuple(contexts[0]) + (int(first[0].argmax()),), 4)])[0]
    assert greedy.is_argmax.all()
    sequence = (23, 42, 7, int(second[1].argmax()))
    rescored = small.score_tokens([TokenRequest(sequence, 3)])[0]
    assert rescored.is_argmax.all()
    log_softmax = third[0] - np.log(np.exp(third[0].astype(np.float64)).sum())
    later = small.score_tokens([TokenRequest(sequence + (5,), 4)])[0]
    assert abs(later.logprobs[0] - log_softmax[5]) < 1e-4
    with small.decoder(8) as again:
        again.start([[1, 2]])
        with pytest.raises(ValueError, match="not started"):
            again.step([3], [1])


def test_n_threads_sets_torch_threads(small_vocab_dir):
    import torch

    before = torch.get_num_threads()
    try:
        with load("reference", small_vocab_dir, n_threads=1):
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_errors_are_typed(small, tmp_path):
    with pytest.raises(ArtefactUnavailableError, match="config.json"):
        load("reference", tmp_path / "no-such-model")
    with pytest.raises(ContextTooLongError):
        small.score_tokens([TokenRequest(tuple([1] * (small.n_ctx + 1)), 1)])
