"""Measurements made inside one benchmark worker process, on one opened Scorer.

Each function runs its warm-up (not counted), then `repeats` timed runs, and returns the median time with the
engine counters of the last timed run. Loading the model is never timed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from fastscore.bench.roofline import median
from fastscore.bench.workload import Workload, all_positions, context_ids, requests_digest
from fastscore.engine.trie import distinct_prefix_positions
from fastscore.records import ScoreRequest, TokenRequest


def timed(fn: Callable[[], object], repeats: int, warmup: Callable[[], object] | None = None) -> tuple[float, list[float], object]:
    """(median seconds, every timed run, the last run's result); `warmup` (default: fn) runs once first."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1 (got {repeats})")
    (warmup or fn)()
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return median(times), times, result


def _cpu_timed(fn: Callable[[], object], cpu: list[float]) -> Callable[[], object]:
    """`fn`, appending the CPU seconds of this process (every thread) it took to `cpu`: on a machine shared with
    other work a step gets a varying share of a core, which moves its wall time but hardly its CPU time."""
    def run():
        started = time.process_time()
        result = fn()
        cpu.append(time.process_time() - started)
        return result
    return run


def flat_requests(workload: Workload) -> list[ScoreRequest]:
    return [request for s in workload.sets for request in s.score_requests()]


def token_requests(scorer, workload: Workload) -> list[TokenRequest]:
    return [scorer.prepare(r).token_request for r in flat_requests(workload)]


def _stats(backend) -> dict:
    return dataclasses.asdict(backend.stats)


def _run_counted(backend, fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        backend.stats.reset()
        return fn()
    return run


def prefill_request(requests: Sequence[TokenRequest], n_tokens: int) -> TokenRequest:
    """One `n_tokens` sequence of real workload tokens (the longest request, repeated if short); one scored row."""
    longest = max(requests, key=lambda r: len(r.tokens)).tokens
    tokens = tuple((longest * (n_tokens // len(longest) + 1))[:n_tokens])
    return TokenRequest(tokens=tokens, score_from=n_tokens - 1)


def measure_backend(scorer, workload: Workload, repeats: int, pp_tokens: int = 512,
                    per_request_repeats: int = 1, per_request_limit: int | None = None) -> dict:
    """Shared scoring of every request in one call, each request alone, and raw prefill, on the same backend.

    `per_request_limit`: time only the first N requests one at a time (their own throughput is reported; the
    no-sharing run is the slowest part of the benchmark)."""
    backend = scorer.backend
    requests = token_requests(scorer, workload)
    warm = requests[: len(workload.sets[0].candidates)]
    sequences = [r.tokens for r in requests]

    shared_s, shared_runs, shared = timed(_run_counted(backend, lambda: backend.score_tokens(requests)), repeats,
                                          warmup=lambda: backend.score_tokens(warm))
    shared_stats = _stats(backend)

    alone_requests = requests[:per_request_limit] if per_request_limit else requests

    def one_at_a_time():
        return [backend.score_tokens([r])[0] for r in alone_requests]

    alone_s, alone_runs, alone = timed(_run_counted(backend, one_at_a_time), per_request_repeats,
                                       warmup=lambda: backend.score_tokens(warm[:1]))
    alone_stats = _stats(backend)

    pp = prefill_request(requests, pp_tokens)
    pp_s, pp_runs, _ = timed(_run_counted(backend, lambda: backend.score_tokens([pp])), repeats)
    pp_stats = _stats(backend)

    shared_totals = np.array([s.total for s in shared])
    alone_totals = np.array([s.total for s in alone])
    alone_sequences = [r.tokens for r in alone_requests]
    trie_positions = distinct_prefix_positions(sequences)
    return {
        "digest": requests_digest(requests),
        "n_requests": len(requests),
        "requested_tokens": int(sum(map(len, sequences))),
        "trie_minimal_tokens": int(trie_positions.size),
        "scored_tokens": int(sum(r.n_scored for r in requests)),
        "mean_trie_position": float(trie_positions.mean()),
        "mean_request_position": float(all_positions(sequences).mean()),
        "shared": {"seconds": shared_s, "runs": shared_runs, "stats": shared_stats},
        "per_request": {"seconds": alone_s, "runs": alone_runs, "stats": alone_stats, "requests": len(alone_requests),
                        "requested_tokens": int(sum(map(len, alone_sequences))),
                        "mean_position": float(all_positions(alone_sequences).mean())},
        "prefill": {"tokens": pp_tokens, "seconds": pp_s, "runs": pp_runs, "stats": pp_stats,
                    "mean_position": (pp_tokens - 1) / 2.0},
        "shared_vs_per_request_max_abs_diff": float(np.max(np.abs(shared_totals[: len(alone)] - alone_totals))),
        "totals": [float(x) for x in shared_totals],
    }


def measure_rates(scorer, workload: Workload, repeats: int, pp_tokens: int = 512) -> dict:
    """Shared scoring of every request in one call and raw prefill: the two rates `bench scale` projects from,
    with short warm-ups (one request; a 32-token prefill) so a large model spends its time on the timed runs."""
    backend = scorer.backend
    requests = token_requests(scorer, workload)
    shared_cpu, pp_cpu = [], []
    shared_s, shared_runs, _ = timed(_cpu_timed(_run_counted(backend, lambda: backend.score_tokens(requests)), shared_cpu),
                                     repeats, warmup=lambda: backend.score_tokens(requests[:1]))
    shared_stats = _stats(backend)
    pp = prefill_request(requests, pp_tokens)
    pp_s, pp_runs, _ = timed(_cpu_timed(_run_counted(backend, lambda: backend.score_tokens([pp])), pp_cpu), repeats,
                             warmup=lambda: backend.score_tokens([prefill_request(requests, 32)]))
    return {
        "digest": requests_digest(requests),
        "n_requests": len(requests),
        "requested_tokens": int(sum(len(r.tokens) for r in requests)),
        "trie_minimal_tokens": int(distinct_prefix_positions([r.tokens for r in requests]).size),
        "scored_tokens": int(sum(r.n_scored for r in requests)),
        "shared": {"seconds": shared_s, "runs": shared_runs, "cpu_seconds": median(shared_cpu), "stats": shared_stats},
        "prefill": {"tokens": pp_tokens, "seconds": pp_s, "runs": pp_runs, "cpu_seconds": median(pp_cpu),
                    "stats": _stats(backend)},
    }


E2E_MODES = ("shared", "one_request_per_call", "prefix_kv")


def measure_end_to_end(scorer, workload: Workload, repeats: int, mode: str) -> dict:
    """Text in, scores out: rendering, tokenization and scoring of every candidate of every context.

    mode: "shared" (fastscore: every request in one call), "one_request_per_call" (the plain reference), or
    "prefix_kv" (transformers reusing each context's KV for its candidates: fastscore.bench.prefix_kv)."""
    if mode == "one_request_per_call":
        requests = flat_requests(workload)

        def run():
            return [scorer.score([r])[0].logprob for r in requests]

        warm = lambda: scorer.score(requests[:1])  # noqa: E731
    elif mode == "prefix_kv":
        from fastscore.bench.prefix_kv import score_with_prefix_kv

        def run():
            return score_with_prefix_kv(scorer, workload.sets)

        warm = lambda: score_with_prefix_kv(scorer, workload.sets[:1])  # noqa: E731
    elif mode == "shared":
        def run():
            return [r.logprob for res in scorer.score_candidates(workload.sets) for r in res.results]

        warm = lambda: scorer.score_candidates(workload.sets[:1])  # noqa: E731
    else:
        raise ValueError(f"unknown end-to-end mode {mode!r}; known: {', '.join(E2E_MODES)}")
    seconds, runs, logprobs = timed(run, repeats, warmup=warm)
    return {"seconds": seconds, "runs": runs, "logprobs": [float(x) for x in logprobs], "mode": mode,
            "one_request_per_call": mode == "one_request_per_call", "weights": scorer.weights_note}


def _decode(backend, contexts: Sequence[Sequence[int]], new_tokens: int) -> tuple[float, float, float, float]:
    """(prefill seconds, decode seconds, prefill CPU seconds, decode CPU seconds) of `new_tokens` argmax steps for
    every context in one decoder."""
    with backend.decoder(new_tokens) as decoder:
        started, cpu_started = time.perf_counter(), time.process_time()
        logits = decoder.start(contexts)
        prefilled, cpu_prefilled = time.perf_counter(), time.process_time()
        active = list(range(len(contexts)))
        for _ in range(new_tokens):
            logits = decoder.step(active, [int(t) for t in np.argmax(logits, axis=-1)])
        done, cpu_done = time.perf_counter(), time.process_time()
    return prefilled - started, done - prefilled, cpu_prefilled - cpu_started, cpu_done - cpu_prefilled


def measure_greedy(scorer, workload: Workload, batch_sizes: Sequence[int], new_tokens: int, repeats: int,
                   sequential: bool = True) -> dict:
    """Decode tokens/s with B contexts in one batch vs the same B contexts one at a time (fixed step count).

    `sequential` False skips the one-at-a-time runs (their figures are then absent)."""
    backend = scorer.backend
    distinct = [context_ids(scorer, s) for s in workload.sets]
    pool = [distinct[i % len(distinct)] for i in range(max(batch_sizes))]
    _decode(backend, pool[:2], 2)  # warm-up
    out = {}
    for b in batch_sizes:
        contexts = pool[:b]

        def batched():
            return _decode(backend, contexts, new_tokens)

        def one_at_a_time():
            parts = [_decode(backend, [c], new_tokens) for c in contexts]
            return tuple(map(sum, zip(*parts)))

        runs_b = [batched() for _ in range(repeats)]
        dec_b = median(r[1] for r in runs_b)
        out[str(b)] = {
            "contexts": b, "new_tokens": new_tokens,
            "batched": {"decode_seconds": dec_b, "prefill_seconds": median(r[0] for r in runs_b),
                        "prefill_tokens": sum(map(len, contexts)), "tokens_per_s": b * new_tokens / dec_b,
                        "prefill_cpu_seconds": median(r[2] for r in runs_b),
                        "decode_cpu_seconds": median(r[3] for r in runs_b)},
        }
        if sequential:
            runs_s = [one_at_a_time() for _ in range(repeats)]
            dec_s = median(r[1] for r in runs_s)
            out[str(b)]["sequential"] = {"decode_seconds": dec_s, "prefill_seconds": median(r[0] for r in runs_s),
                                         "tokens_per_s": b * new_tokens / dec_s}
    return out
