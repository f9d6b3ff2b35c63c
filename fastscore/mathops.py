"""Log-softmax maths on logits rows: pure numpy, vectorised, float64 where it matters.

Rows are processed in blocks so a batch of thousands of vocab-sized rows never needs a float64 copy of the whole
matrix at once (4096 rows x 49152 vocab would be 1.6 GB in float64).
"""

from __future__ import annotations


import numpy as np


# Rows per block. A block's temporaries (32 x 49152 float32 = 6 MB) come back from the heap block after block;
# at 256 rows (50 MB) each was fresh memory, and the kernel zeroing its pages took 5.7% of the study's scoring
# stage (docs/performance.md, "The softmax cut at each row's last cell").
_BLOCK_ROWS = 32


def _as_rows(logits: np.ndarray) -> np.ndarray:
    rows = np.asarray(logits)
    if rows.ndim != 2:
        raise ValueError(f"expected a 2-D array of logits rows, got shape {rows.shape}")
    if rows.shape[1] == 0:
        raise ValueError("logits rows are empty (vocabulary of size 0)")
    if rows.dtype not in (np.float32, np.float64):
        rows = rows.astype(np.float64)
    return rows


def logsumexp_rows(logits: np.ndarray, exact_exp: bool = False) -> np.ndarray:
    """float64 [n_rows]: log(sum(exp(row))) per row, summed in float64 block by block.

    By default the shifted exponentials (all in (0, 1]) are taken in the input precision, float32 for llama.cpp
    logits, which is 2.5x faster and moves the result by < 1e-7 nats; exact_exp=True takes them in float64.
    """
    return _normalisers(_as_rows(logits), None, exact_exp, with_argmax=False)[0]


def _normalisers(rows: np.ndarray, which: np.ndarray | None, exact_exp: bool = False, with_argmax: bool = True
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """logsumexp and (with_argmax) argmax of rows[which] (all rows if None), block by block: no copy of the chosen
    rows at once."""
    n = rows.shape[0] if which is None else len(which)
    lse = np.empty(n, dtype=np.float64)
    argmax = np.empty(n, dtype=np.int64) if with_argmax else None
    for start in range(0, n, _BLOCK_ROWS):
        block = rows[start : start + _BLOCK_ROWS] if which is None else rows[which[start : start + _BLOCK_ROWS]]
        peak = block.max(axis=1, keepdims=True)
        if not np.all(np.isfinite(peak)):
            raise FloatingPointError("logits contain a row whose maximum is not finite")
        if argmax is not None:
            argmax[start : start + len(block)] = block.argmax(axis=1)
        shifted = block.astype(np.float64) - peak if exact_exp else block - peak
        np.exp(shifted, out=shifted)
        lse[start : start + len(block)] = peak[:, 0].astype(np.float64) + np.log(shifted.sum(axis=1, dtype=np.float64))
    return lse, argmax


def softmax(values) -> np.ndarray:
    """float64 probabilities proportional to exp(values) of one 1-D vector (a candidate set's log-probs, a logits
    row); -inf entries get probability 0."""
    return softmax_in_place(np.array(values, dtype=np.float64))


def softmax_in_place(x: np.ndarray) -> np.ndarray:
    """`x` (a float64 1-D vector) overwritten with softmax(x) and returned: the steps of softmax without its
    temporaries (sampling takes one per generated token, over the whole vocabulary)."""
    x -= x.max()
    np.exp(x, out=x)
    x /= x.sum()
    return x


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    """float64 [n_rows, n_vocab]: the log-softmax of each row."""
    rows = _as_rows(logits)
    return rows.astype(np.float64) - logsumexp_rows(rows, exact_exp=True)[:, None]


def gather_logprobs(
    logits_rows: np.ndarray, targets: np.ndarray, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Log-prob of targets[k] under row rows[k] (default: row k), and whether it is that row's argmax.

    Returns (float64 [n], bool [n]). Each row's normaliser is computed once however many targets share it
    (a trie node's last position predicts the first token of every child). The argmax is numpy's (first index
    on ties), the same rule greedy decoding uses, so a greedy token always has is_argmax True.
    """
    logits = _as_rows(logits_rows)
    targets = np.asarray(targets, dtype=np.int64)
    rows = np.arange(len(targets)) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows.shape != targets.shape or targets.ndim != 1:
        raise ValueError(f"targets {targets.shape} and rows {rows.shape} must be equal 1-D shapes")
    if len(targets) and (targets.min() < 0 or targets.max() >= logits.shape[1]):
        raise ValueError(f"target token ids must lie in [0, {logits.shape[1]})")
    if len(rows) and (rows.min() < 0 or rows.max() >= logits.shape[0]):
        raise ValueError(f"row indices must lie in [0, {logits.shape[0]})")
    used = np.unique(rows)
    # Normalise only the rows some target reads; `where` maps a row index to its place in `used`.
    every = len(used) == logits.shape[0]
    lse, argmax = _normalisers(logits, None if every else used)
    where = rows if every else np.searchsorted(used, rows)
    picked = logits[rows, targets].astype(np.float64)
    return picked - lse[where], argmax[where] == targets


def token_ranks(logits_rows: np.ndarray, targets: np.ndarray, rows: np.ndarray, is_argmax: np.ndarray) -> np.ndarray:
    """Each target's rank under its row: 1 + the number of strictly larger logits (ties share a rank).

    `is_argmax` is gather_logprobs' for the same targets: a row's argmax has no larger logit, so its rank is 1
    without reading the row (teacher-forced actions are mostly their model's argmax). The other targets compare
    their row against their own logit once, block by block.
    """
    logits = _as_rows(logits_rows)
    targets = np.asarray(targets, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    ranks = np.ones(len(targets), dtype=np.int64)
    todo = np.flatnonzero(~np.asarray(is_argmax, dtype=bool))
    for start in range(0, len(todo), _BLOCK_ROWS):
        block = todo[start : start + _BLOCK_ROWS]
        picked = logits[rows[block], targets[block]]
        ranks[block] += np.count_nonzero(logits[rows[block]] > picked[:, None], axis=1)
    return ranks


def top_k_logprobs(logits_rows: np.ndarray, targets: np.ndarray, rows: np.ndarray, logprobs: np.ndarray, k: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely token ids under each target's row with their log-probs, best first (int64 [n, k],
    float64 [n, k]).

    `logprobs` are gather_logprobs' for the same targets: each row's normaliser is read back from them
    (logit - logprob) instead of being computed a second time.
    """
    logits = _as_rows(logits_rows)
    targets = np.asarray(targets, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    k = min(int(k), logits.shape[1])
    if k <= 0:
        return np.zeros((len(targets), 0), np.int64), np.zeros((len(targets), 0), np.float64)
    lse = logits[rows, targets].astype(np.float64) - np.asarray(logprobs, dtype=np.float64)
    chosen = logits[rows]
    top = np.argpartition(-chosen, k - 1, axis=1)[:, :k] if k < logits.shape[1] else np.tile(
        np.arange(logits.shape[1]), (len(rows), 1))
    values = np.take_along_axis(chosen, top, axis=1).astype(np.float64)
    order = np.argsort(-values, axis=1, kind="stable")
    top, values = np.take_along_axis(top, order, axis=1), np.take_along_axis(values, order, axis=1)
    return top.astype(np.int64), values - lse[:, None]


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of `successes` in `n` trials (95% by default); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # Clamped at the exact ends: at 0 (n) successes the lower (upper) bound is 0 (1) up to rounding.
    lo = 0.0 if successes == 0 else max(0.0, float(centre - half))
    hi = 1.0 if successes == n else min(1.0, float(centre + half))
    return lo, hi
