"""Tokens, seconds and CPU seconds of the on-policy sampled stage under two designs, on the same items in one process:
k samples from the clean context alone (the design before #31.2) against k' samples under every record and the clean
retry (SAMPLED_CONDITIONS). Seconds depend on the load; tokens generated do not.

    python -m fastscore.bench.lab.sample_cost tools 4 --data ../shared/data --threads 1
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def measure(env_name: str, n_items: int, data: Path, threads: int | None, designs) -> dict:
    from fastscore.registry import default_model
    from fastscore.selection import ModelSelection
    from fastscore.study.data.envs import open_envs
    from fastscore.study.stages import decode
    from fastscore.study.stages.onpolicy import ModelFailureBuilder
    from fastscore.study.stages.score import score_stage
    from fastscore.study.stages.store import StudyStore

    envs = open_envs((env_name,), data)
    env = envs[env_name]
    out: dict = {}
    with ModelSelection.resolve(default_model(), "llamacpp", "f32", threads=threads).open() as scorer:
        items, skipped = ModelFailureBuilder(env, scorer, 0, max_new_tokens=env.max_new_tokens).build(n_items)
        out["items"], out["skipped"] = len(items), len(skipped)
        store = StudyStore(Path(tempfile.mkdtemp()) / "run")
        store.start({"sample_cost": 1}, resume=False)
        score_stage(store, scorer, envs, items)
        lp = store.logprobs().load()
        contexts = {item.item_id: decode.render_conditions(item, env) for item in items}
        greedy = scorer.greedy
        for label, conditions, k in designs:
            counted = {"tokens": 0, "sequences": 0, "seconds": 0.0, "cpu_seconds": 0.0}

            def counting(requests, counted=counted, **kw):
                wall, cpu = time.perf_counter(), time.process_time()
                results = greedy(requests, **kw)
                counted["tokens"] += sum(len(r.token_ids) for r in results)
                counted["sequences"] += len(results)
                counted["seconds"] += time.perf_counter() - wall
                counted["cpu_seconds"] += time.process_time() - cpu
                return results

            scorer.greedy, saved = counting, decode.SAMPLED_CONDITIONS
            decode.SAMPLED_CONDITIONS = conditions
            try:
                budgets = {i: decode.greedy_budget(env.max_new_tokens, lp[i][0]) for i in contexts}
                requests = decode._sample_requests(items, contexts, budgets, env, decode.DecodePlan(True, k, 0),
                                                   scorer.tokenizer)
                decode.DecoderCall({}, requests, env.max_new_tokens, seed=0).run(scorer)
            finally:
                decode.SAMPLED_CONDITIONS, scorer.greedy = saved, greedy
            out[label] = counted
    return out


def main() -> None:
    from fastscore.study.stages.decode import RETRY_CONDITION, SAMPLED_CONDITIONS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env")
    parser.add_argument("items", type=int)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--before-k", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    designs = ((f"clean_retry, k={args.before_k}", (RETRY_CONDITION,), args.before_k),
               (f"every record, k={args.k}", SAMPLED_CONDITIONS, args.k))
    print(json.dumps(measure(args.env, args.items, args.data, args.threads, designs), indent=1))


if __name__ == "__main__":
    main()
