"""Refilling vs fixed-batch greedy decoding on the study's own greedy calls: decoder steps, rows per step, CPU
seconds, interleaved (A B A B ...), and whether the two give the same completions.

The workload: the seeded study's first `--limit` items of each environment are scored once (the study's scoring
stage, into a scratch folder), then its greedy stage runs on them with a recording scorer, which keeps each
`Scorer.greedy` call the stage makes (its requests, as grouped by ITEMS_PER_GREEDY_CALL). Those calls are replayed
on one loaded model, alternately with fixed batches (`refill_decode=False`: batches of max_decode_batch in budget
order, each stepping until its longest member ends) and refilled (one decoder session per call), greedily and
sampled (temperature 1.0, `--samples` draws per request, each from its own seeded generator, as the on-policy
stage samples). `--one-call` also replays every request of an environment in one call (bigger greedy calls).

CPU seconds are the process's user + system time (every llama.cpp thread) over the replay, so a loaded machine
changes them less than wall time. Steps and rows are counted by a pass-through decoder wrapper.

    python -m fastscore.bench.lab.refill_decode --data ../shared/data --limit 4 --threads 2 --rounds 2
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from fastscore.backends.base import Decoder


class CountingDecoder(Decoder):
    """A pass-through decoder recording the rows of each step and the contexts joining at it."""

    def __init__(self, inner: Decoder) -> None:
        self.inner, self.rows, self.joins = inner, [], []
        self.refills = inner.refills

    def reserve_slots(self, slots, longest):
        return self.inner.reserve_slots(slots, longest)

    def start(self, contexts):
        return self.inner.start(contexts)

    def step(self, active, tokens):
        self.rows.append(len(active))
        self.joins.append(0)
        return self.inner.step(active, tokens)

    def join_step(self, active, tokens, joining):
        self.rows.append(len(active) + len(joining))
        self.joins.append(len(joining))
        return self.inner.join_step(active, tokens, joining)

    def close(self):
        self.inner.close()


@dataclass
class Pass:
    mode: str
    kind: str
    cpu_s: float
    wall_s: float
    rows: list[int] = field(default_factory=list)
    results: list = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.rows)

    @property
    def mean_rows(self) -> float:
        return float(np.mean(self.rows)) if self.rows else 0.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def record_calls(scorer, store_dir: Path, envs, items, cap) -> list[tuple[list, int]]:
    """The study's scoring stage, then its greedy stage with every Scorer.greedy call's requests and token cap
    recorded (and answered with empty completions)."""
    from fastscore.decode import END_OF_TURN
    from fastscore.records import GreedyResult
    from fastscore.study.stages.decode import DecodePlan, greedy_stage
    from fastscore.study.stages.score import score_stage
    from fastscore.study.stages.store import StudyStore

    store = StudyStore(store_dir)
    store.start({"bench": 1}, resume=False)
    score_stage(store, scorer, envs, items)
    calls: list[tuple[list, int]] = []

    def recording(requests, max_new_tokens, **kwargs):  # nothing decoded: the replays decode
        calls.append((list(requests), max_new_tokens))
        return [GreedyResult(id=r.id, text="", token_ids=(), stopped_by=END_OF_TURN) for r in requests]

    scorer.greedy = recording
    try:
        greedy_stage(store, scorer, envs, items, cap, DecodePlan(argmax_chain=True, retries=0, seed=0))
    finally:
        del scorer.greedy
    return calls


def replay(scorer, calls: Sequence[tuple[list, int]], refill: bool, samples: int) -> Pass:
    from fastscore.scorer import Scorer

    made: list[CountingDecoder] = []
    backend = scorer.backend
    player = Scorer(backend, scorer.tokenizer, max_decode_batch=scorer.max_decode_batch, refill_decode=refill)
    make = backend.decoder
    backend.decoder = lambda n: made.append(CountingDecoder(make(n))) or made[-1]
    results = []
    cpu, wall = _cpu(), time.perf_counter()
    try:
        for requests, new_tokens in calls:
            if samples:
                requests = [replace(r, id=f"{r.id}#{k}") for r in requests for k in range(samples)]
                rngs = [np.random.default_rng([0, zlib.crc32(r.id.encode())]) for r in requests]
                results += player.greedy(requests, max_new_tokens=new_tokens, temperature=1.0, rngs=rngs)
            else:
                results += player.greedy(requests, max_new_tokens=new_tokens)
    finally:
        del backend.decoder
    return Pass("refilled" if refill else "fixed", "sampled" if samples else "greedy", _cpu() - cpu,
                time.perf_counter() - wall, [n for d in made for n in d.rows], results)


def main(argv: Sequence[str] | None = None) -> None:
    import fastscore
    from fastscore.study.data.envs import items_for_envs, open_envs
    from fastscore.study.data.envs import env_class

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--envs", default="tools,mbpp")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4, help="sampled draws per request (0: no sampled pass)")
    parser.add_argument("--one-call", action="store_true", help="also replay each environment in one call")
    args = parser.parse_args(argv)
    names = args.envs.split(",")
    envs = open_envs(names, args.data)
    items, _ = items_for_envs(envs, args.limit, 0)
    cap_of = {name: env_class(name).max_new_tokens for name in names}
    with fastscore.load(threads=args.threads) as model, tempfile.TemporaryDirectory() as scratch:
        scorer = model.scorer
        calls = record_calls(scorer, Path(scratch), envs, items, lambda env: cap_of[env])
        print(f"{len(items)} items, {len(calls)} greedy calls, {sum(len(c) for c, _ in calls)} requests decoded "
              f"(calls of {[len(c) for c, _ in calls]})")
        workloads = [("per stage call", calls, 0)]
        if args.samples:
            workloads.append(("per stage call", calls, args.samples))
        if args.one_call:
            merged = [([r for c, n in calls if n == cap for r in c], cap) for cap in sorted({n for _, n in calls})]
            workloads.append(("one call per cap", merged, 0))
        for label, work, samples in workloads:
            if max(len(c) * max(samples, 1) for c, _ in work) <= scorer.max_decode_batch:
                print(f"{label}, {'sampled' if samples else 'greedy'}: no call holds more than "
                      f"{scorer.max_decode_batch} requests, so both paths decode it in the same batches")
                continue
            passes: list[Pass] = []
            for round_ in range(args.rounds):
                for refill in ((False, True) if round_ % 2 == 0 else (True, False)):
                    passes.append(replay(scorer, work, refill, samples))
                    p = passes[-1]
                    print(f"  {label} {p.kind} {p.mode:8s}: {p.steps} steps, {p.mean_rows:.1f} rows/step, "
                          f"{p.cpu_s:.1f} CPU s, {p.wall_s:.1f} wall s", flush=True)
            fixed = [p for p in passes if p.mode == "fixed"]
            refilled = [p for p in passes if p.mode == "refilled"]
            differ = sum(a.token_ids != b.token_ids or a.stopped_by != b.stopped_by
                         for a, b in zip(fixed[0].results, refilled[0].results, strict=True))
            cpu_a = sum(p.cpu_s for p in fixed) / len(fixed)
            cpu_b = sum(p.cpu_s for p in refilled) / len(refilled)
            print(f"{label}, {fixed[0].kind}: steps {fixed[0].steps} -> {refilled[0].steps}, rows/step "
                  f"{fixed[0].mean_rows:.1f} -> {refilled[0].mean_rows:.1f}, CPU s (mean of {len(fixed)}) "
                  f"{cpu_a:.1f} -> {cpu_b:.1f} ({cpu_a / cpu_b:.2f}x); {differ} of {len(fixed[0].results)} "
                  f"completions differ")


if __name__ == "__main__":
    main()
