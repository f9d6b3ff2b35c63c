"""The model's own attempts begun with the seeded source's completions of the same contexts, against decoding them all
(stages.onpolicy.KnownAttempts): a finished `--failures both` run's seeded greedy stage is run again (decoder_calls:
scores removed, the rest resumed, the new scores compared byte for byte) to collect its `before` completions, then the
on-policy builder of every environment is timed with them and without, alternating (A B B A ...), in one process on
one model. Every pass must build the same items and skip the same sources.

    python -m fastscore.bench.lab.known_attempts OUT/seeded SCRATCH [--threads 2] [--rounds 2]
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import click

KNOWN, DECODED = "known completions", "every attempt decoded"


def pass_order(rounds: int) -> list[str]:
    """A B B A per round: each variant runs first as often as second."""
    return [label for _ in range(rounds) for label in (KNOWN, DECODED, DECODED, KNOWN)]


def table_rows(passes: Sequence[dict]) -> list[str]:
    """Markdown rows (variant, seconds of each pass, mean, tokens computed) of passes {"label", "seconds", "tokens"}."""
    rows = []
    for label in (KNOWN, DECODED):
        mine = [p for p in passes if p["label"] == label]
        seconds = [p["seconds"] for p in mine]
        tokens = sorted({p["tokens"] for p in mine})
        rows.append(f"| {label} | {' / '.join(f'{s:.1f}' for s in seconds)} | {sum(seconds) / len(seconds):.1f} | "
                    f"{' / '.join(f'{t:,}' for t in tokens)} |")
    return rows


def collect(run_dir: Path, scratch: Path, threads: int):
    """The `before` completions the seeded greedy stage of `run_dir` makes, run again in `scratch`."""
    from fastscore.bench.lab import decoder_calls
    from fastscore.study import runner
    from fastscore.study.stages.onpolicy import KnownAttempts

    known, stage = KnownAttempts(), runner.greedy_stage
    runner.greedy_stage = lambda *args, **kwargs: stage(*args, **{**kwargs, "known": known})
    try:
        decoder_calls.main([str(run_dir), str(scratch), "--threads", str(threads)], standalone_mode=False)
    finally:
        runner.greedy_stage = stage
    return known


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--rounds", type=int, default=1, show_default=True, help="A B B A rounds.")
def main(run_dir: Path, scratch: Path, threads: int, rounds: int) -> None:
    from fastscore.selection import ModelSelection
    from fastscore.study.data.envs import open_envs
    from fastscore.study.stages.onpolicy import ModelFailureBuilder

    settings = json.loads((run_dir / "config.json").read_text())
    if settings["failures"] != "seeded" or settings.get("window") is not None:
        raise click.UsageError(f"{run_dir} must be a finished run of the seeded source (OUT/seeded of --failures "
                               "both, or a --failures seeded run; not a sweep shard)")
    known = collect(run_dir, scratch, threads)
    click.echo(f"{len(known)} `before` completions collected from the seeded greedy stage")
    envs = open_envs(settings["envs"], Path(settings["data_dir"]))
    caps = settings["max_new_tokens"]
    passes, built = [], {}
    with ModelSelection.resolve(settings["model"], settings["backend"], settings["quant"], threads=threads).open() as scorer:
        for label in pass_order(rounds):
            first, started, made = scorer.backend.stats.computed_tokens, time.perf_counter(), {}
            for name, env in envs.items():
                builder = ModelFailureBuilder(env, scorer, settings["seed"], caps[name],
                                              known=known if label == KNOWN else None)
                items, skipped = builder.build(settings["limit"])
                made[name] = ([item.to_json() for item in items], [(s.source_id, s.reason) for s in skipped])
            passes.append({"label": label, "seconds": time.perf_counter() - started,
                           "tokens": scorer.backend.stats.computed_tokens - first})
            built.setdefault(json.dumps(made, sort_keys=True), []).append(label)
    click.echo("| attempts | seconds per pass | mean | tokens computed |\n|---|---|---|---|")
    for row in table_rows(passes):
        click.echo(row)
    same = len(built) == 1
    click.echo(f"items and skipped sources {'identical in every pass' if same else 'DIFFER between passes'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
