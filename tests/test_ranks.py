"""Per-token ranks and top-k alternatives (fastscore.mathops) against a direct count over the whole row."""

from __future__ import annotations

import numpy as np

from fastscore.mathops import gather_logprobs, log_softmax_rows, token_ranks, top_k_logprobs


def _rows_with_ties(n_rows: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Few distinct values: many ties, also at the top of a row.
    return rng.integers(-4, 4, size=(n_rows, vocab)).astype(np.float32)


def test_ranks_count_the_strictly_larger_logits_of_each_target_s_row():
    logits = _rows_with_ties(300, 64, seed=1)  # more rows than one block
    rng = np.random.default_rng(2)
    rows = rng.integers(0, len(logits), size=700)  # rows shared by several targets, in any order
    targets = rng.integers(0, logits.shape[1], size=700)
    targets[:50] = logits[rows[:50]].argmax(axis=1)  # some targets are their row's argmax
    _, is_argmax = gather_logprobs(logits, targets, rows)
    assert is_argmax.sum() >= 50 and (~is_argmax).sum() > 300
    ranks = token_ranks(logits, targets, rows, is_argmax)
    expected = [1 + int((logits[r] > logits[r, t]).sum()) for r, t in zip(rows, targets, strict=True)]
    assert ranks.tolist() == expected
    # A target tied with its row's maximum but not the first of them is no argmax, and still has rank 1.
    tied = [k for k in range(len(targets)) if not is_argmax[k] and logits[rows[k], targets[k]] == logits[rows[k]].max()]
    assert tied and all(ranks[k] == 1 for k in tied)


def test_top_k_are_the_likeliest_tokens_with_their_log_probs_best_first():
    logits = np.random.default_rng(3).normal(size=(5, 40)).astype(np.float32)
    rows, targets = np.array([0, 1, 1, 4]), np.array([3, 0, 39, 7])
    logprobs, _ = gather_logprobs(logits, targets, rows)
    ids, lps = top_k_logprobs(logits, targets, rows, logprobs, 4)
    full = log_softmax_rows(logits)
    for k, r in enumerate(rows):
        best = np.argsort(-full[r], kind="stable")[:4]
        assert ids[k].tolist() == best.tolist()
        np.testing.assert_allclose(lps[k], full[r, best], atol=1e-6)
    assert top_k_logprobs(logits, targets, rows, logprobs, 0)[0].shape == (4, 0)
