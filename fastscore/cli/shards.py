"""`study-shards`: the full study run as shards committed to git (run, report, verify, status)."""

from __future__ import annotations

from pathlib import Path

import click

from fastscore.cli.app import DATA_HELP, MODEL_HELP, csv_list, friendly, main
from fastscore.study.data.datafile import default_data_dir
from fastscore.study.data.envs import ENVS

RUN_DIR = click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
DATA = click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
                    callback=lambda _ctx, _param, value: value or default_data_dir())
THREADS = click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the "
                       "backend's).")
SANDBOX = click.option("--sandbox", default="bwrap", show_default=True, type=click.Choice(["bwrap", "rlimits"]),
                       help="How MBPP programs are isolated (see `fastscore study --help`).")


@main.group("study-shards")
def study_shards() -> None:
    """The full study (`fastscore study --limit all`, default settings) as shards committed to a results folder:
    resumable across sessions and machines, reproducible from its rows. See docs/full-run.md."""


@study_shards.command("run")
@RUN_DIR
@DATA
@click.option("--shard-items", default=50, show_default=True, type=click.IntRange(min=1),
              help="Seeded positions per shard (fixed for the run: the partition is recorded in its manifest).")
@click.option("--max-hours", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Start no shard that would not end within this many hours (from the shards' measured times); "
                   "shorter shards after one that would not fit still start.")
@click.option("--max-shards", default=None, type=click.IntRange(min=1), help="Run at most this many shards.")
@click.option("--commit", is_flag=True, help="`git add` and `git commit` RUN_DIR after each finished shard.")
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--failures", default="seeded,model", show_default=True, help="Comma-separated failure sources.")
@click.option("--only", "only", default=None,
              help="Run only these failure sources' shards now (comma-separated); the run keeps all of --failures.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--max-new-tokens", default=None, type=click.IntRange(min=1),
              help="Greedy token cap (default: each environment's own).")
@click.option("--check-items", default=2, show_default=True, type=click.IntRange(min=1),
              help="Committed items new code (or libraries, weights, machine) re-scores before it adds shards.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Shards run at once, each in its own process with --threads threads (default: the cores shared "
                   "out). On 2 cores, 2 workers of 1 thread did 1.2x the item-runs per hour of 1 worker of 2 threads.")
@THREADS
@SANDBOX
@friendly
def run(run_dir, data, shard_items, max_hours, max_shards, commit, model, envs, failures, only, seed,
        max_new_tokens, check_items, workers, threads, sandbox) -> None:
    """Run the next shards of the study into RUN_DIR (e.g. results/smollm2-135m-full), skipping committed ones."""
    from fastscore.deps import check_extras
    from fastscore.registry import default_model
    from fastscore.study.shards.run import ShardRunConfig, run_shards

    check_extras("llamacpp", "parquet", purpose="fastscore study-shards run")  # the embedded model; rows as Parquet
    config = ShardRunConfig(out_dir=run_dir, data_dir=data, shard_items=shard_items, max_hours=max_hours,
                            max_shards=max_shards, commit=commit, model=model or default_model(),
                            envs=tuple(csv_list(envs)), sources=tuple(csv_list(failures)), seed=seed,
                            max_new_tokens=max_new_tokens, threads=threads, sandbox=sandbox, check_items=check_items,
                            only_sources=None if only is None else tuple(csv_list(only)), workers=workers)
    outcome = run_shards(config, progress=True, say=click.echo)
    if outcome.check is not None:
        click.echo(f"mixing check: re-scored {', '.join(outcome.check['items'])}: reproduced (max |Δ| "
                   f"{max(outcome.check['max_abs'].values(), default=0.0):.3g} nats)")
    click.echo(f"{len(outcome.ran)} shard(s) run in {outcome.seconds:.0f} s; {outcome.n_done} of {outcome.n_total} "
               f"done; stopped: {outcome.stopped}")
    if outcome.commit_commands:
        click.echo("commit the new shards with:\n  " + "\n  ".join(outcome.commit_commands))


@study_shards.command("report")
@RUN_DIR
@DATA
@click.option("--n-boot", default=2000, show_default=True, type=click.IntRange(min=1), help="Bootstrap resamples.")
@friendly
def report(run_dir, data, n_boot) -> None:
    """Rebuild RUN_DIR's summary.json, report.md and plots from every committed shard (labelled partial until all
    are done)."""
    from fastscore.deps import check_extras
    from fastscore.study.shards.merge import coverage_lines, write_report

    check_extras("parquet", purpose="fastscore study-shards report")
    outcome = write_report(run_dir, data, n_boot)
    click.echo(coverage_lines(outcome.coverage)[0].removeprefix("> ").replace("**", ""))
    click.echo(f"wrote {len(outcome.files)} files into {outcome.out_dir} (summary.json, report.md, plots)")


@study_shards.command("verify")
@RUN_DIR
@DATA
@click.option("--sample", "n_items", default=2, show_default=True, type=click.IntRange(min=1),
              help="Committed items to re-score.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the sample.")
@click.option("--item", "item_ids", multiple=True, metavar="ITEM_ID",
              help="Re-score this committed item instead of a sample (repeatable), e.g. mbpp-775.")
@THREADS
@SANDBOX
@friendly
def verify(run_dir, data, n_items, seed, item_ids, threads, sandbox) -> None:
    """Re-score a seeded random sample of RUN_DIR's committed items (or the --item ones) from scratch and print max
    |Δ| per score kind; exit non-zero unless every score is within 1e-4 nats and texts and verdicts are equal."""
    from fastscore.deps import check_extras
    from fastscore.study.shards.rescore import TOLERANCE
    from fastscore.study.shards.verify import require_reproduced, verify_run

    check_extras("llamacpp", "parquet", purpose="fastscore study-shards verify")
    comparison = verify_run(run_dir, n_items, seed, data, threads, sandbox, item_ids)
    click.echo(f"re-scored {', '.join(comparison.items)}")
    for line in comparison.lines():
        click.echo(line)
    require_reproduced(comparison, run_dir)
    click.echo(f"reproduced: every score within {TOLERANCE:g} nats; texts and verdicts equal")


@study_shards.command("status")
@RUN_DIR
@friendly
def status(run_dir) -> None:
    """Shards done and planned, items per source and environment, hours spent."""
    from fastscore.study.shards.merge import coverage_lines, run_coverage
    from fastscore.study.shards.manifest import Manifest

    manifest = Manifest.open(run_dir, None)
    click.echo(coverage_lines(run_coverage(manifest))[0].removeprefix("> ").replace("**", ""))
    hours = sum(s["seconds"] for s in manifest.shards.values()) / 3600
    click.echo(f"{hours:.2f} h of shard time on {len({s['machine']['cpu'] for s in manifest.shards.values()})} "
               "machine type(s)")
