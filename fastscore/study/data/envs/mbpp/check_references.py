"""Run every MBPP reference solution against its tests in the sandbox and print the verdict counts.

    python -m fastscore.study.data.envs.mbpp.check_references [--data DIR] [--sandbox bwrap|rlimits|both]
    python -m fastscore.study.data.envs.mbpp.check_references --overhead 200 [--sandbox ...]

With `both`, each reference runs under both isolations and any task whose status differs is listed: the verdict must
not depend on the isolation. The tasks that do not pass are listed with their message either way. `--overhead N`
instead times N sequential runs of a trivial passing program per isolation and prints the median wall time.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from fastscore.study.data.envs.mbpp.env import EVAL_LIMITS, WORKERS, load_sources
from fastscore.study.data.envs.mbpp.isolation import ISOLATIONS
from fastscore.study.data.envs.mbpp.sandbox import RunOutcome, RunRequest, run_many


def check(data_dir: Path, isolation: str) -> dict[int, RunOutcome]:
    sources = load_sources(data_dir)
    requests = [RunRequest(s.reference, s.tests, s.test_setup_code.replace("\r\n", "\n")) for s in sources]
    outcomes: list[RunOutcome] = []
    for start in tqdm(range(0, len(requests), 50), desc=f"references ({isolation})", unit="x50"):
        outcomes += run_many(requests[start:start + 50], EVAL_LIMITS, workers=WORKERS, isolation=isolation)
    return {s.task_id: o for s, o in zip(sources, outcomes)}


def overhead(runs: int, isolation: str) -> float:
    """Median wall milliseconds of one sandbox run of a trivial passing program (caller's view)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        outcome = run_many([RunRequest("def f():\n    return 1", ("assert f() == 1",))], isolation=isolation)[0]
        times.append((time.perf_counter() - started) * 1000)
        assert outcome.passed, outcome
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="folder with mbpp.jsonl")
    parser.add_argument("--sandbox", choices=[*ISOLATIONS, "both"], default="bwrap")
    parser.add_argument("--overhead", type=int, default=0, metavar="N", help="time N trivial runs instead")
    args = parser.parse_args(argv)
    modes = ISOLATIONS if args.sandbox == "both" else (args.sandbox,)
    if args.overhead:
        for mode in modes:
            print(f"{mode}: median {overhead(args.overhead, mode):.1f} ms per run over {args.overhead} runs")
        return 0
    results = {mode: check(args.data, mode) for mode in modes}
    for mode, outcomes in results.items():
        counts = collections.Counter(o.status for o in outcomes.values())
        passed = counts.pop("passed", 0)
        others = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        print(f"{mode}: {passed} of {len(outcomes)} references pass" + (f" ({others})" if others else ""))
        for task_id, o in sorted(outcomes.items()):
            if not o.passed:
                print(f"  task {task_id}: {o.status}: {o.message}")
    if len(results) == 2:
        first, second = results.values()
        differ = [t for t in first if (first[t].status, first[t].message) != (second[t].status, second[t].message)]
        print(f"verdicts that differ between {' and '.join(results)}: {len(differ)}")
        for t in differ:
            print(f"  task {t}: {first[t].status} ({first[t].message}) vs {second[t].status} ({second[t].message})")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
