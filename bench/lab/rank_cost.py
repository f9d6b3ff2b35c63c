"""What per-token ranks and top-k alternatives cost end to end: the bench's workload written as a scoring file and
scored by `fastscore score`'s own path (`score_file`) four ways side by side in one process, on one loaded model:
without ranks (the rank step replaced by a constant), with ranks (the default output), with ranks counted for every
token (without the shortcut that gives an argmax token rank 1 unread), and with ranks and `--top-k K`.

    python -m fastscore.bench.lab.rank_cost --limit 3 --repeats 3 --threads 2

Rounds alternate the ways (ABCD ABCD ...), so a drift in machine load falls on each alike; medians are reported
with every round's time. Under `nice` or a loaded machine the seconds are only relative to each other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fastscore.engine import plan
from fastscore.study.data.datafile import default_data_dir

WAYS = ("no ranks", "ranks", "ranks, every token counted", "ranks + top-k")


@contextmanager
def _ranks_replaced(way: str):
    """The rank step as `way` needs it: a constant (no rank computed), or counted for every token."""
    computed = plan.token_ranks
    if way == "no ranks":
        plan.token_ranks = lambda logits_rows, targets, rows, is_argmax: np.ones(len(targets), dtype=np.int64)
    elif way == "ranks, every token counted":
        plan.token_ranks = lambda logits_rows, targets, rows, is_argmax: computed(
            logits_rows, targets, rows, np.zeros(len(targets), dtype=bool))
    try:
        yield
    finally:
        plan.token_ranks = computed


def _write_requests(path: Path, data_dir: Path, limit: int) -> int:
    from fastscore.bench.workload import build_workload

    workload = build_workload(data_dir, limit)
    with open(path, "w", encoding="utf-8") as fh:
        for s in workload.sets:
            fh.write(json.dumps({"id": s.id, "messages": [{"role": m.role, "content": m.content} for m in s.messages],
                                 "candidates": list(s.candidates)}, ensure_ascii=False) + "\n")
    return workload.n_requests


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--quant", default="f32")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=3, help="study items per environment (the bench's default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)

    from fastscore.registry import default_model
    from fastscore.requests_io import score_file
    from fastscore.selection import ModelSelection

    model = args.model or default_model()
    with tempfile.TemporaryDirectory() as tmp:
        requests = Path(tmp) / "requests.jsonl"
        n_requests = _write_requests(requests, args.data or default_data_dir(), args.limit)
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        outputs: dict[str, list[dict]] = {}
        with ModelSelection.resolve(model, "llamacpp", args.quant, threads=args.threads).open() as scorer:
            score_file(scorer, requests, Path(tmp) / "warm.jsonl", progress=False)  # warm-up, not counted
            for _ in range(args.repeats):
                for way in WAYS:
                    scorer.top_k = args.top_k if way == "ranks + top-k" else 0
                    out = Path(tmp) / f"{way.replace(' ', '_')}.jsonl"
                    with _ranks_replaced(way):
                        start = time.perf_counter()
                        score_file(scorer, requests, out, progress=False)
                        seconds[way].append(time.perf_counter() - start)
                    outputs[way] = [json.loads(line) for line in out.read_text().splitlines()]
            threads = scorer.backend.n_threads
    same = _same_scores(outputs)
    flags = [f for line in outputs["ranks"] for c in line["candidates"] for f in c["token_is_argmax"]]
    base = statistics.median(seconds["no ranks"])
    result = {"model": model, "quant": args.quant, "threads": threads, "items_per_env": args.limit,
              "requests": n_requests, "scored_tokens": len(flags), "argmax_share": round(sum(flags) / len(flags), 4),
              "top_k": args.top_k, "repeats": args.repeats,
              "seconds": {way: [round(s, 3) for s in times] for way, times in seconds.items()},
              "median_seconds": {way: round(statistics.median(times), 3) for way, times in seconds.items()},
              "overhead_vs_no_ranks": {way: round(statistics.median(times) / base - 1, 4)
                                       for way, times in seconds.items()},
              "same_logprobs_and_ranks_every_way": same}
    for way in WAYS:
        print(f"{way:>26}: median {result['median_seconds'][way]:.2f} s "
              f"({result['overhead_vs_no_ranks'][way]:+.1%} vs no ranks); rounds {result['seconds'][way]}")
    print(json.dumps(result))
    return result


def _same_scores(outputs: dict[str, list[dict]]) -> bool:
    """The ways must give the same log-probs, and the ways with ranks the same ranks."""
    def field(lines, name):
        return [[c[name] for c in line["candidates"]] for line in lines]

    first = field(outputs[WAYS[0]], "token_logprobs")
    ranks = field(outputs["ranks"], "token_ranks")
    return (all(field(outputs[way], "token_logprobs") == first for way in WAYS[1:])
            and all(field(outputs[way], "token_ranks") == ranks for way in WAYS[2:]))


if __name__ == "__main__":
    main()
