"""The study's greedy calls on two lanes, each call on a new decoding context (A, the code before the pool) against a
context kept from the lane's last call (B, fastscore.backends.llamacpp_pool), alternating A B B A: wall seconds,
contexts made, and whether the completions are the same.

The workload is lanes_decode's: the seeded study's first `--limit` items of each environment are scored into a
scratch folder, its greedy calls recorded, and replayed sampled (`--samples` draws per request) or greedily
(`--samples 0`) on `--lanes` models of one thread each, every call on the first free lane, costliest first.

    python -m fastscore.bench.lab.context_pool --data ../shared/data --limit 16 --samples 0 --rounds 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> None:
    import fastscore
    from fastscore.bench.lab.lanes_decode import _call
    from fastscore.bench.lab.refill_decode import record_calls
    from fastscore.study.data.envs import env_class, items_for_envs, open_envs
    from fastscore.study.stages.lanes import Lanes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--envs", default="tools,mbpp")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=0, help="sampled draws per request (0: greedy)")
    parser.add_argument("--rounds", type=int, default=2, help="A B, then B A, ...")
    args = parser.parse_args(argv)
    names = args.envs.split(",")
    envs = open_envs(names, args.data)
    items, _ = items_for_envs(envs, args.limit, 0)
    cap_of = {name: env_class(name).max_new_tokens for name in names}
    models = [fastscore.load(threads=1) for _ in range(args.lanes)]
    with tempfile.TemporaryDirectory() as scratch:
        calls = record_calls(models[0].scorer, Path(scratch), envs, items, lambda env: cap_of[env])
    print(f"{len(items)} items, {len(calls)} greedy calls of {[len(c) for c, _ in calls]} requests, "
          f"x {max(args.samples, 1)} {'samples' if args.samples else 'greedy'}, {args.lanes} lanes of 1 thread",
          flush=True)
    lanes = Lanes([model.scorer for model in models])
    pools = [model.scorer.backend.stream_contexts for model in models]

    def replay(keep: bool) -> tuple[float, tuple[int, float], list]:
        for pool in pools:
            pool.release()
        made = sum(pool.created for pool in pools), sum(pool.creating_seconds for pool in pools)

        def compute(call, scorer):
            if not keep:
                scorer.backend.stream_contexts.release()
            return _call(scorer, *call, args.samples)

        started = time.perf_counter()
        results = [got for _, got in lanes.ordered(calls, compute, cost=lambda call: len(call[0]) * call[1])]
        wall = time.perf_counter() - started
        return wall, (sum(pool.created for pool in pools) - made[0],
                      sum(pool.creating_seconds for pool in pools) - made[1]), results

    seconds: dict[str, list[float]] = {"A": [], "B": []}
    results, made = {}, {}
    for round_ in range(args.rounds):
        for mode in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
            wall, made[mode], results[mode] = replay(keep=mode == "B")
            seconds[mode].append(wall)
            print(f"  {mode}: {wall:.1f} s, {made[mode][0]} contexts made in {made[mode][1]:.1f} lane-s",
                  flush=True)
    differ = sum(a.token_ids != b.token_ids or a.stopped_by != b.stopped_by or a.banned_mass != b.banned_mass
                 for call_a, call_b in zip(results["A"], results["B"], strict=True)
                 for a, b in zip(call_a, call_b, strict=True))
    a, b = (sum(seconds[m]) / len(seconds[m]) for m in ("A", "B"))
    print(f"A (a new context per call): {a:.1f} s; B (kept): {b:.1f} s; "
          f"A / B = {a / b:.3f}; {differ} of {sum(len(c) for c in results['A'])} completions differ")
    for model in models:
        model.close()


if __name__ == "__main__":
    main()
