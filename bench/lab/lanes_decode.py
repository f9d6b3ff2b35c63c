"""The study's greedy calls decoded on one model with every thread against lanes (copies of the model, one thread
each, calls side by side), alternating A B B A: wall seconds, and whether the completions are the same.

The workload: the seeded study's first `--limit` items of each environment are scored (the study's scoring stage,
into a scratch folder), then its greedy stage runs with a recording scorer that keeps each `Scorer.greedy` call
(bench/lab/refill_decode.py). The calls are replayed sampled like the on-policy stage's (temperature 1.0,
`--samples` draws per request, each from its own seeded generator) or greedily (`--samples 0`). A: one model on
`--threads` threads, the calls one after the other. B: `--lanes` models on `--threads / --lanes` threads each, every
call on the first free lane (fastscore.study.stages.lanes), costliest first.

    python -m fastscore.bench.lab.lanes_decode --data ../shared/data --limit 16 --samples 2 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np


def _call(scorer, requests, new_tokens: int, samples: int):
    if samples:
        requests = [replace(r, id=f"{r.id}#{k}") for r in requests for k in range(samples)]
        rngs = [np.random.default_rng([0, zlib.crc32(r.id.encode())]) for r in requests]
        return scorer.greedy(requests, max_new_tokens=new_tokens, temperature=1.0, rngs=rngs)
    return scorer.greedy(requests, max_new_tokens=new_tokens)


def replay(lanes, calls, samples: int) -> tuple[float, list]:
    """Wall seconds and every call's results (in call order) of the calls run on `lanes`."""
    started = time.perf_counter()
    results = [got for _, got in lanes.ordered(calls, lambda call, scorer: _call(scorer, *call, samples),
                                               cost=lambda call: len(call[0]) * call[1])]
    return time.perf_counter() - started, results


def main(argv: Sequence[str] | None = None) -> None:
    import fastscore
    from fastscore.bench.lab.refill_decode import record_calls
    from fastscore.study.data.envs import env_class, items_for_envs, open_envs
    from fastscore.study.stages.lanes import Lanes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--envs", default="tools,mbpp")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2, help="sampled draws per request (0: greedy)")
    parser.add_argument("--rounds", type=int, default=2, help="A B, then B A, ...")
    args = parser.parse_args(argv)
    names = args.envs.split(",")
    envs = open_envs(names, args.data)
    items, _ = items_for_envs(envs, args.limit, 0)
    cap_of = {name: env_class(name).max_new_tokens for name in names}
    whole = fastscore.load(threads=args.threads)
    lanes = [fastscore.load(threads=max(args.threads // args.lanes, 1)) for _ in range(args.lanes)]
    with tempfile.TemporaryDirectory() as scratch:
        calls = record_calls(whole.scorer, Path(scratch), envs, items, lambda env: cap_of[env])
    print(f"{len(items)} items, {len(calls)} greedy calls of {[len(c) for c, _ in calls]} requests, "
          f"x {max(args.samples, 1)} {'samples' if args.samples else 'greedy'}", flush=True)
    one, several = Lanes([whole.scorer]), Lanes([model.scorer for model in lanes])
    seconds: dict[str, list[float]] = {"A": [], "B": []}
    results = {}
    for round_ in range(args.rounds):
        for mode in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
            wall, results[mode] = replay(one if mode == "A" else several, calls, args.samples)
            seconds[mode].append(wall)
            print(f"  {mode}: {wall:.1f} s", flush=True)
    differ = sum(a.token_ids != b.token_ids or a.stopped_by != b.stopped_by
                 for call_a, call_b in zip(results["A"], results["B"], strict=True)
                 for a, b in zip(call_a, call_b, strict=True))
    a, b = (sum(seconds[m]) / len(seconds[m]) for m in ("A", "B"))
    print(f"A (1 model, {args.threads} threads): {a:.1f} s; B ({args.lanes} lanes, "
          f"{max(args.threads // args.lanes, 1)} thread(s) each): {b:.1f} s; A / B = {a / b:.2f}; "
          f"{differ} of {sum(len(c) for c in results['A'])} completions differ")
    for model in (whole, *lanes):
        model.close()


if __name__ == "__main__":
    main()
