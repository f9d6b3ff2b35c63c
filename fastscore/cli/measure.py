"""`fastscore bench`: the command group of the measurements users run: `throughput` (every backend and type side by
side), `scale` (conversion and throughput at real sizes, and what the full grid would cost) and `quant` (what
quantisation does to the scores). The investigations of what bounds the speed are scripts of fastscore.bench.lab."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import click

from fastscore import variants
from fastscore.bench.settings import parse_settings, settings_help
from fastscore.cli.app import DATA_HELP, bench_list, command_line, friendly, main
from fastscore.study.data.datafile import default_data_dir
from fastscore.study.data.envs import ENVS

# `fastscore bench --FLAG` of the investigations that left the command, and the script that runs each now.
MOVED_FLAGS = {"--decode-bound": "python -m fastscore.bench.lab.decode_bound",
               "--op-profile": "python -m fastscore.bench.lab.op_profile",
               "--study-bound": "python -m fastscore.bench.lab.study_bound STUDY_FOLDER..."}


class BenchGroup(click.Group):
    """`fastscore bench` alone or followed by options runs `throughput`, as the command did before it became a group;
    a flag of an investigation that moved out names its script."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for flag, script in MOVED_FLAGS.items():
            if any(a == flag or a.startswith(flag + "=") for a in args):
                raise click.UsageError(f"{flag} left fastscore bench: run `{script}` (--help lists its options)", ctx)
        if not args or (args[0].startswith("-") and args[0] not in ctx.help_option_names):
            args = ["throughput", *args]
        return super().parse_args(ctx, args)


@main.group(cls=BenchGroup)
def bench() -> None:
    """Measure fastscore on this machine: throughput, scale, quant (`fastscore bench` alone: throughput)."""


@bench.command()
@click.option("--model", default=None, help="Registry name (default: the registry's default model).")
@click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
              callback=lambda ctx, param, value: value or default_data_dir())
@click.option("--requests", "requests", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Benchmark on this scoring file (fastscore score's input) instead of the study's items.")
@click.option("--limit", default=3, show_default=True, type=click.IntRange(min=1), help="Items per environment.")
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--backends", default="llamacpp,onnx", show_default=True, help="Backends to measure.")
@click.option("--quants", default=None, help="Subset of types (default: " + ",".join(v.quant for v in variants.VARIANTS if v.in_bench) + ").")
@click.option("--skip-reference", is_flag=True, help="Skip the transformers reference (no end-to-end speedup).")
@click.option("--best", default=None, help="llama.cpp type for end to end and greedy (default: the fastest).")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1), help="Timed runs (median).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A measurement size (repeatable); KEY (default): " + settings_help() + ".")
@click.option("--json", "as_json", is_flag=True,
              help="Print every figure as one JSON line instead of the short table.")
@click.option("--details", is_flag=True, help="Print the detailed tables (roofline, GFLOP/s, every ratio) instead.")
@click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the JSON figures to this file.")
@friendly
def throughput(model, data, requests, limit, envs, backends, quants, skip_reference, best, threads, repeats, settings,
               as_json, details, json_out) -> None:
    """Benchmark every backend side by side on the same study requests: a short table (--details: every figure in
    tables; --json: one JSON line)."""
    import os

    from fastscore.deps import check_extras, extras_for_backend

    sizes = parse_settings(settings)  # a bad --set stops here, before the extras check and the minutes of measuring
    chosen = [*bench_list(backends), *([] if skip_reference else ["reference"])]
    check_extras(*(e for b in chosen for e in extras_for_backend(b)),
                 purpose="fastscore bench throughput on " + ", ".join(chosen) + " (--skip-reference and --backends "
                                                                               "choose fewer)")

    from fastscore.bench.run import BenchOptions, run_bench
    from fastscore.bench.table import print_and_save, render_details, render_short
    from fastscore.registry import default_model
    from fastscore.resolve import model_source

    model_source(model or default_model())
    if json_out is not None:
        from fastscore import outputs

        outputs.ensure_parent(json_out)  # before the minutes of measuring, not after

    opts = BenchOptions(
        model=model or default_model(), data_dir=data, items_per_env=limit, envs=bench_list(envs),
        threads=threads or os.cpu_count() or 1, repeats=repeats, backends=bench_list(backends), quants=bench_list(quants),
        skip_reference=skip_reference, best=best, requests=requests, **sizes,
    )  # fmt: skip
    print_and_save(run_bench(opts), json_out, render_details if details else render_short, as_json)


@bench.command("scale")
@click.option("--models", default=None,
              help="Comma-separated models (default: the embedded 135M, then each registry model's stand-in, "
                   "NAME@standin: random weights with the real config).")
@click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
              callback=lambda ctx, param, value: value or default_data_dir())
@click.option("--out", "out", default=Path("bench-scale-out"), show_default=True, type=click.Path(path_type=Path),
              help="Results folder: one JSON per model, extended step by step (a rerun measures only what is missing).")
@click.option("--limit", default=1, show_default=True, type=click.IntRange(min=1), help="Workload items per environment.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1), help="Timed runs (median).")
@click.option("--greedy-batch", default=8, show_default=True, type=click.IntRange(min=1),
              help="Contexts decoded side by side in the greedy step.")
@click.option("--new-tokens", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--skip", default="",
              help="Steps to leave out this time (not recorded): kinds (score, greedy, convert), variants (gguf-f16), "
                   "formats (onnx) or step names (score-onnx-int8).")
@click.option("--prune", is_flag=True, help="Delete each stand-in's cached artefacts once it is measured (disk).")
@click.option("--study", "studies", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A study run's failure-source folder (report.md, summary.json) to project the full grid from; "
                   "repeat for each source.")
@click.option("--per-cpu-second", is_flag=True,
              help="Project the grid from the rates per CPU second of each step (a worker that has its whole core), "
                   "not by wall time: for rates measured while other work shared the machine.")
@click.option("--study-threads", default=None, type=click.IntRange(min=1),
              help="Threads the --study runs used: the 135M's check runs its projection on that many one-thread "
                   "workers (default: this machine's cores / --threads).")
@click.option("--table-out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the markdown tables to this file.")
@friendly
def bench_scale(models, data, out, limit, threads, repeats, greedy_batch, new_tokens, skip, prune, studies,
                per_cpu_second, study_threads, table_out) -> None:
    """Convert and measure each registry model at real size (stand-ins where the weights are not here)."""
    import os

    from fastscore.deps import check_extras

    # Stand-ins are built with transformers and exported to ONNX; every model is measured on both backends.
    check_extras("llamacpp", "onnx", "reference", purpose="fastscore bench scale")

    from fastscore import outputs
    from fastscore.bench import projection
    from fastscore.bench.scale import DEFAULT_MODELS, SCORING, ScaleOptions, run_scale
    from fastscore.resolve import model_source

    chosen = bench_list(models) or DEFAULT_MODELS
    for model in chosen:
        model_source(model)  # an unknown name stops here, before anything runs
    opts = ScaleOptions(out_dir=out, data_dir=data, models=chosen, items_per_env=limit,
                        threads=threads or os.cpu_count() or 1, repeats=repeats, greedy_batch=greedy_batch,
                        new_tokens=new_tokens, skip=bench_list(skip) or (), prune=prune)
    results = run_scale(opts)
    works = [projection.study_work(folder) for folder in studies]
    sources = projection.count_sources(data, sorted({e for w in works for e in w["items"]})) if works else None
    text = projection.render(results, works, sources, SCORING, opts.threads, os.cpu_count() or 1,
                             basis="cpu" if per_cpu_second else "wall", study_workers=study_threads)
    click.echo(text)
    if table_out is not None:
        outputs.write_text_atomic(table_out, text + "\n")


@bench.command("quant")
@click.option("--model", default=None, help="Registry name (default: the registry's default model).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1), help="Items per environment.")
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--variants", default=None,
              help="backend:quant list compared with the reference (default: "
                   + ",".join(v.label for v in variants.VARIANTS if v.in_quant_check) + ").")
@click.option("--out", "out", default=Path("quant-out"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path))
@click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
              callback=lambda ctx, param, value: value or default_data_dir())
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the backend's).")
@click.option("--n-boot", default=2000, show_default=True, type=click.IntRange(min=1), help="Bootstrap resamples.")
@click.option("--requests", "requests", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Check on this scoring file (fastscore score's input) instead of the study's items: per-token "
                   "and per-candidate differences, argmax changes and contrast sign flips against the reference.")
@click.option("--run", "run_dir", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Check on the committed items of this sharded run (fastscore study-shards) instead, against its "
                   "committed rows (no reference re-scored; default variants: llamacpp:q8_0,llamacpp:q4_0). Every "
                   "finished scoring call is kept in OUT/calls: run the same command again to resume a stopped check.")
@click.option("--sample", default=None, type=click.IntRange(min=1),
              help="With --run: a seeded random sample of this many committed items (--seed) instead of all.")
@friendly
def quant_check(model, limit, envs, variants, out, data, seed, threads, n_boot, requests, run_dir, sample) -> None:
    """Score the same study items under every quantised variant and compare each with the fp32 reference."""
    if run_dir is not None:
        return _quant_check_run(run_dir, model, variants, out, data, seed, threads, n_boot, sample, requests)
    if sample is not None:
        raise click.UsageError("--sample samples a run's committed items: it needs --run")
    from fastscore.deps import check_extras, extras_for_backend
    from fastscore.study.quantcheck.run import DEFAULT_VARIANTS, QuantCheckConfig, parse_variants, run_quant_check
    from fastscore.registry import default_model

    chosen = parse_variants(variants) if variants else DEFAULT_VARIANTS
    check_extras("reference", *(e for v in chosen for e in extras_for_backend(v.backend)),
                 *([] if requests is not None else ["study"]), purpose="fastscore bench quant")

    if requests is not None:
        from fastscore.quant_requests import quant_check_requests

        results = quant_check_requests(requests, model or default_model(), [(v.backend, v.quant) for v in chosen],
                                       out, threads=threads, progress=True, command=command_line())
        for label, comparison in results.items():
            click.echo(f"{label}: best candidate changed {comparison.candidate_argmax_changes.line()}; "
                       f"contrast sign flips {comparison.contrast_sign_flips.line()}")
        click.echo(f"results in {out}/ (quant.md, quant.json, one scores file per variant)")
        return

    config = QuantCheckConfig(
        model=model or default_model(), out_dir=out, data_dir=data, envs=bench_list(envs), limit=limit,
        variants=chosen, seed=seed, threads=threads,
        n_boot=n_boot, command="fastscore " + " ".join(sys.argv[1:]), progress=True,
    )  # fmt: skip
    summary = run_quant_check(config)
    for label, groups in summary["variants"].items():
        click.echo(f"{label}: " + "; ".join(f"{g}: {c['sign_of_mean']}" for g, c in groups.items()))
    click.echo(f"results in {out}/ (quant.md, quant.json, plots)")


def _quant_check_run(run_dir, model, variants, out, data, seed, threads, n_boot, sample, requests) -> None:
    from fastscore.deps import check_extras, extras_for_backend
    from fastscore.study.quantcheck.committed import RUN_DEFAULT_VARIANTS, CommittedCheckConfig, run_committed_check
    from fastscore.study.quantcheck.run import parse_variants

    ctx = click.get_current_context()
    if requests is not None:
        raise click.UsageError("--run and --requests are two different item sources: give one")
    for name in ("limit", "envs"):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(f"--{name.rstrip('s')} picks items from the data; with --run the items are the "
                                   "run's committed ones (--sample N --seed S for a sample)")
    chosen = parse_variants(variants) if variants else RUN_DEFAULT_VARIANTS
    # No plots: the rows as Parquet and the variants' backends (the run's own backend says so itself when it opens).
    check_extras("parquet", *(e for v in chosen for e in extras_for_backend(v.backend)),
                 purpose="fastscore bench quant --run")
    summary = run_committed_check(CommittedCheckConfig(
        run_dir=run_dir, out_dir=out, data_dir=data, variants=chosen, sample=sample, seed=seed, threads=threads,
        n_boot=n_boot, model=model, command=command_line(), progress=True))
    for label, entry in summary["variants"].items():
        for group, c in entry["groups"].items():
            s, d = c["sign_agreement"], c["shift_gain_per_token"]
            click.echo(f"{label} {group}: n={c['n']} sign agreement {s['mean']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]; "
                       f"G/token shift {d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]")
    click.echo(f"results in {out}/ (quant.md, quant.json)")


def _renamed(command: click.Command, old_name: str) -> None:
    """Keep a command's name from before the `bench` group working (hidden), with a note naming the new one."""
    alias = copy.copy(command)
    alias.hidden = True
    new_name = f"fastscore bench {command.name}"

    @functools.wraps(command.callback)
    def callback(*args, **kwargs):
        click.echo(f"note: `fastscore {old_name}` is now `{new_name}`", err=True)
        return command.callback(*args, **kwargs)

    alias.callback = callback
    main.add_command(alias, old_name)


_renamed(bench_scale, "bench-scale")
_renamed(quant_check, "quant-check")
