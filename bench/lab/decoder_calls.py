"""What the greedy stage's decoder calls generate and cost: a finished study run's greedy stage run again (its
scores removed, the rest resumed), each decoder call recorded (tokens generated and lane-seconds, per environment,
greedy or sampled), and the new `scores.jsonl` compared byte for byte with the run's own.

    python -m fastscore.bench.lab.decoder_calls RUN_DIR SCRATCH [--threads 2]

RUN_DIR: one failure source's folder of a finished `fastscore study` run (e.g. OUT/model), left untouched; SCRATCH
is replaced by a copy of it. The run's own config gives the environments, limit and failure source.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import click

STAGE_OUTPUTS = ("scores.jsonl", "summary.json", "report.md")


def call_kind(n_greedy: int, n_sampled: int) -> str:
    return "greedy and sampled" if n_greedy and n_sampled else "sampled" if n_sampled else "greedy"


def tally(calls: Iterable[dict]) -> dict[str, dict[str, float]]:
    """{"env, kind": {"calls", "requests", "tokens", "lane_seconds"}} of recorded calls, each {"env", "kind" (see
    call_kind), "tokens": [per request], "seconds"}."""
    out: dict[str, dict[str, float]] = defaultdict(
        lambda: {"calls": 0, "requests": 0, "tokens": 0, "lane_seconds": 0.0})
    for call in calls:
        row = out[f"{call['env']}, {call['kind']}"]
        row["calls"] += 1
        row["requests"] += len(call["tokens"])
        row["tokens"] += sum(call["tokens"])
        row["lane_seconds"] += call["seconds"]
    return dict(sorted(out.items()))


def item_envs(run_dir: Path) -> dict[str, str]:
    """Item id -> environment, from a study run folder's items.jsonl."""
    items = (json.loads(line) for line in (run_dir / "items.jsonl").read_text().splitlines() if line.strip())
    return {item["item_id"]: item["env"] for item in items}


def _recorded(calls: list[dict], env_of: dict[str, str]):
    """DecoderCall.run wrapped to append each finished call's figures to `calls` (lanes run calls in threads);
    `env_of`: item id -> environment (a call holds one environment's items)."""
    from fastscore.study.stages import decode

    lock, run = threading.Lock(), decode.DecoderCall.run

    def recording(self, scorer):
        start = time.perf_counter()
        ok, failed = run(self, scorer)
        seconds = time.perf_counter() - start
        env = env_of[next(iter(self.requests))]
        kind = call_kind(sum(map(len, self.greedy.values())), sum(map(len, self.sampled.values())))
        with lock:
            calls.append({"env": env, "kind": kind, "seconds": seconds,
                          "tokens": [len(r.token_ids) for results in ok.values() for r in results]})
        return ok, failed

    return run, recording


def _served(calls: list[dict], env_of: dict[str, str]):
    """decode_queue.served (as the greedy stage calls it) wrapped to append each call's figures to `calls` as its
    results come back; its items were decoded from one queue, so a call has no seconds of its own (0)."""
    from fastscore.study.stages import decode

    served = decode.served

    def recording(lanes, jobs):
        for call, (ok, failed) in served(lanes, jobs):
            kind = call_kind(sum(map(len, call.greedy.values())), sum(map(len, call.sampled.values())))
            calls.append({"env": env_of[next(iter(call.requests))], "kind": kind, "seconds": 0.0,
                          "tokens": [len(r.token_ids) for results in ok.values() for r in results]})
            yield call, (ok, failed)

    return served, recording


def _timed_sessions(sessions: list[float]):
    """Scorer.serve_greedy wrapped to append each session's seconds (one per lane) to `sessions`."""
    from fastscore.scorer import Scorer

    serve = Scorer.serve_greedy

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return serve(self, *args, **kwargs)
        finally:
            sessions.append(time.perf_counter() - start)

    return serve, timed


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True)
def main(run_dir: Path, scratch: Path, threads: int) -> None:
    from fastscore.scorer import Scorer
    from fastscore.study.data.envs import env_class
    from fastscore.study.runner import StudyConfig, run_study
    from fastscore.study.stages import decode

    settings = json.loads((run_dir / "config.json").read_text())
    if settings.get("window") is not None or settings.get("hf_path") is not None:
        raise click.UsageError(f"{run_dir} is a sweep shard or an HF-path run: not supported")
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(run_dir, scratch)
    for name in STAGE_OUTPUTS:
        (scratch / name).unlink(missing_ok=True)
    # The run's own settings; a run made with --max-new-tokens N has N for every environment.
    caps = settings["max_new_tokens"]
    own_caps = all(env_class(env).max_new_tokens == cap for env, cap in caps.items())
    config = StudyConfig(
        model=settings["model"], backend=settings["backend"], quant=settings["quant"], envs=tuple(settings["envs"]),
        limit=settings["limit"], seed=settings["seed"], failures=settings["failures"], retries=settings["retries"],
        include_end_of_turn=settings["include_end_of_turn"], out_dir=scratch, data_dir=Path(settings["data_dir"]),
        resume=True, threads=threads, sensitivity=settings["sensitivity"],
        max_new_tokens=None if own_caps else max(caps.values()),
    )  # fmt: skip
    calls: list[dict] = []
    sessions: list[float] = []
    env_of = item_envs(run_dir)
    run, recording = _recorded(calls, env_of)
    served, serving = _served(calls, env_of)
    serve, timed_serve = _timed_sessions(sessions)
    decode.DecoderCall.run, decode.served, Scorer.serve_greedy = recording, serving, timed_serve
    start = time.perf_counter()
    try:
        run_study(config, progress=True)
    finally:
        decode.DecoderCall.run, decode.served, Scorer.serve_greedy = run, served, serve
    wall = time.perf_counter() - start
    same = (scratch / "scores.jsonl").read_bytes() == (run_dir / "scores.jsonl").read_bytes()
    click.echo("| decoder calls | calls | requests | tokens generated | lane-seconds |\n|---|---|---|---|---|")
    for key, row in tally(calls).items():
        click.echo(f"| {key} | {row['calls']} | {row['requests']} | {row['tokens']:,} | {row['lane_seconds']:.1f} |")
    if sessions:  # the calls' items were served from one queue: lane-seconds per session, not per call
        click.echo(f"served from one queue: lane sessions {', '.join(f'{x:.1f}' for x in sessions)} s "
                   f"({sum(sessions):.1f} lane-seconds)")
    verdict = "byte-identical to" if same else "DIFFERS from"
    click.echo(f"wall {wall:.1f} s (model load included); scores.jsonl {verdict} {run_dir / 'scores.jsonl'}")


if __name__ == "__main__":
    main()
