"""`study`, `report-html`, `study-table` and `sweep`: the corrective-gain study, its HTML report, the paper-vs-study
table generated from its summary, and the study over a grid."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fastscore.cli.app import (BACKEND_HELP, DATA_HELP, QUANT_HELP, command_line, csv_list, friendly, main,
                               study_limit)
from fastscore.study.data.datafile import default_data_dir
from fastscore.study.data.envs import ENVS
from fastscore.study.runner import RETRIES


@main.command()
@click.option("--model", default=None, help="Registry name (default: the registry's default model).")
@click.option("--backend", default="llamacpp", show_default=True, help=BACKEND_HELP)
@click.option("--quant", default=None, help=QUANT_HELP)
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--limit", default=None, callback=lambda ctx, param, value: study_limit(value),
              help="Items per environment, or 'all' for every usable item (default: sized for the 2-core machine).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--failures", default="both", show_default=True, type=click.Choice(["both", "seeded", "model"]),
              help="seeded: mutations of the ground truth; model: the model's own failed greedy attempts; both: "
                   "each in its own subfolder of --out, reported side by side.")
@click.option("--retries", default=RETRIES, show_default=True, type=click.IntRange(min=0),
              help="Sampled completions per on-policy item under every record and the clean retry (temperature 1.0, "
                   "seeded).")
@click.option("--exclude-end-of-turn", is_flag=True,
              help="Score the action alone, without the end-of-turn token (the paper's action-only counts).")
@click.option("--out", "out", default=Path("study-out"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path))
@click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
              callback=lambda ctx, param, value: value or default_data_dir())
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out (same options required).")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="CPU threads, shared by the --lanes (default: the machine's cores).")
@click.option("--max-new-tokens", default=None, type=click.IntRange(min=1),
              help="Greedy token cap for every environment (default: per environment; each item decodes at most "
                   "twice its longest candidate).")
@click.option("--n-boot", default=2000, show_default=True, type=click.IntRange(min=1), help="Bootstrap resamples.")
@click.option("--hf-path", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A local HF checkpoint folder to use instead of the hub.")
@click.option("--sandbox", default="bwrap", show_default=True, type=click.Choice(["bwrap", "rlimits"]),
              help="How MBPP programs run: bwrap (isolated by bubblewrap) or rlimits (limits only, not isolated; "
                   "the report says so).")
@click.option("--sensitivity", is_flag=True,
              help="Also score the harness-realism checks (error record as tool vs user message; the template's "
                   "native tool format) and report them as changes on the headline. Scoring only.")
@click.option("--lanes", default=None, type=click.IntRange(min=1),
              help="Copies of the model that decode side by side, sharing --threads (default: 2 on llama.cpp with "
                   "2 threads or more, else 1). On llama.cpp the results do not depend on it.")
@friendly
def study(model, backend, quant, envs, limit, seed, failures, retries, exclude_end_of_turn, out, data, resume, threads,
          max_new_tokens, n_boot, hf_path, sandbox, sensitivity, lanes) -> None:
    """Run the corrective-gain study end to end and write its results, report and plots into --out."""
    from fastscore.deps import check_extras, extras_for_backend
    from fastscore.registry import default_model
    from fastscore.study.report.document import headline
    from fastscore.study.runner import DEFAULT_LIMIT, StudyConfig, run_study

    check_extras(*extras_for_backend(backend), purpose=f"fastscore study on {backend}")
    warn_without_plots()

    model = model or default_model()
    config = StudyConfig(
        model=model, backend=backend, quant=quant,
        envs=tuple(e.strip() for e in envs.split(",") if e.strip()),
        limit=DEFAULT_LIMIT if limit == "default" else limit, seed=seed, failures=failures, retries=retries,
        include_end_of_turn=not exclude_end_of_turn, out_dir=out, data_dir=data, resume=resume, n_boot=n_boot,
        max_new_tokens=max_new_tokens, hf_path=hf_path, threads=threads, sandbox=sandbox, sensitivity=sensitivity,
        lanes=lanes,
    )  # fmt: skip
    outcome = run_study(config, progress=True)
    for line in headline(outcome, config.failures):
        click.echo(line)
    click.echo(f"results in {outcome.out_dir}/ (report.md, summary.json, scores.jsonl, plots)")


def warn_without_plots() -> None:
    """The plots are the one optional part of a study: without matplotlib it runs and says so before it starts."""
    from fastscore.deps import has_extra, pip_line

    if not has_extra("study"):
        click.echo(f"Note: matplotlib is not installed, so no plots will be drawn (the tables and report are); for "
                   f"them: {pip_line(['study'])}", err=True)


@main.command("report-html")
@click.argument("study_out", type=click.Path(exists=True, file_okay=False, path_type=Path))  # a part or the top
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the backend's).")
@click.option("--rescore", is_flag=True, help="Recompute tokens.jsonl even if present.")
@friendly
def report_html(study_out, threads, rescore) -> None:
    """Write STUDY_OUT/report.html: a summary (n, what G means, intervals), tables, plots and a per-item explorer of
    the failed action's tokens coloured by their G (scored once into tokens.jsonl, with the study's model). On a
    `--failures both` study's top folder: a page per part (seeded/, model/) and a top page linking them."""
    from fastscore.deps import check_extras, extras_for_backend
    from fastscore.study.report.html import HTML_FILE, study_parts, write_report_html
    from fastscore.study.report.html_deps import scoring_backend

    backend = scoring_backend(study_out, rescore)  # None: the tokens are scored already
    if backend is not None:
        check_extras(*extras_for_backend(backend), purpose=f"scoring the report's tokens on {backend}")
    page = write_report_html(study_out, threads=threads, rescore=rescore)
    for part in study_parts(study_out):
        click.echo(f"wrote {part / HTML_FILE}")
    click.echo(f"wrote {page}")


@main.command()
@click.option("--models", required=True, help="Comma-separated models: registry names, hub ids or local HF folders.")
@click.option("--variants", default="f32", show_default=True,
              help="Comma-separated weight variants, QUANT (llama.cpp) or BACKEND:QUANT, e.g. f32,q4_1,onnx:fp32.")
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--failures", default="seeded,model", show_default=True,
              help="Comma-separated failure sources: seeded (mutated ground truth), model (its own failed attempts).")
@click.option("--limit", default="20", show_default=True, callback=lambda _ctx, _param, value: study_limit(value),
              help="Seeded items per cell (under model failures: sources examined), or 'all'.")
@click.option("--shard-size", default=10, show_default=True, type=click.IntRange(min=1),
              help="Items per shard: the unit of work, of resume and of retry.")
@click.option("--out", "out", default=Path("sweep-out"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path))
@click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
              callback=lambda _ctx, _param, value: value or default_data_dir())
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--resume", is_flag=True, help="Continue the sweep in --out: committed shards are kept.")
@click.option("--ray", "ray_address", default=None, metavar="local|ADDRESS",
              help="Run shards on Ray: 'local' starts an instance for the run; else a cluster address ('auto', "
                   "'ray://head:10001'). Default: in this process.")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="Ray workers (default: the instance's CPUs / --threads).")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads per worker.")
@click.option("--max-new-tokens", default=None, type=click.IntRange(min=1),
              help="Greedy token cap (default: each environment's own).")
@click.option("--n-boot", default=2000, show_default=True, type=click.IntRange(min=1), help="Bootstrap resamples.")
@click.option("--sandbox", default="bwrap", show_default=True, type=click.Choice(["bwrap", "rlimits"]),
              help="How MBPP programs are isolated (see `fastscore study --help`).")
@click.option("--allow-stand-ins", is_flag=True,
              help="Accept random-weight stand-ins (NAME@standin; time only, their G means nothing; marked).")
@friendly
def sweep(models, variants, envs, failures, limit, shard_size, out, data, seed, resume, ray_address, workers,
          threads, max_new_tokens, n_boot, sandbox, allow_stand_ins) -> None:
    """Run the study over a grid of models x variants x environments x failure sources, resumable by shard, in this
    process or on Ray, and write the cross-model summary (summary.md, summary.json, a plot) into --out."""
    from fastscore.deps import check_extras, extras_for_backend
    from fastscore.sweep.grid import parse_variant
    from fastscore.sweep.run import SweepConfig, run_sweep

    backends = [parse_variant(v)[0] for v in csv_list(variants)]
    check_extras(*(e for b in backends for e in extras_for_backend(b)), *(["ray"] if ray_address else []),
                 purpose="fastscore sweep" + (" --ray" if ray_address else ""))
    warn_without_plots()
    config = SweepConfig(
        models=tuple(m.strip() for m in models.split(",") if m.strip()), variants=tuple(csv_list(variants)),
        envs=tuple(csv_list(envs)),
        failures=tuple(csv_list(failures)), limit=limit, shard_size=shard_size, seed=seed,
        out_dir=out, data_dir=data, resume=resume, ray=ray_address, workers=workers, threads=threads,
        max_new_tokens=max_new_tokens, n_boot=n_boot, sandbox=sandbox, command=command_line(),
        allow_standins=allow_stand_ins,
    )  # fmt: skip
    outcome = run_sweep(config, progress=True)
    for (model, variant), reason in outcome.skipped.items():
        click.echo(f"skipped {model} ({variant}): {reason}")
    click.echo(f"{outcome.n_shards} shards ({outcome.n_resumed} already done) in {outcome.seconds:.0f} s; "
               f"summary in {outcome.out_dir}/summary.md")


@main.command("study-table")
@click.argument("results", type=click.Path(exists=True, path_type=Path))
@click.option("--check", "check", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Exit 1 if this markdown file's study-table block differs from the generated table.")
@click.option("--write", "write", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Replace this markdown file's study-table block with the generated table.")
@friendly
def study_table(results, check, write) -> None:
    """Print the paper-vs-study table generated from RESULTS (a study's --out, or its summary.json); the README
    holds it between <!-- study-table:begin --> and <!-- study-table:end -->."""
    from fastscore.study.report.readme_table import run

    ok, text = run(results, check=check, write=write)
    click.echo(text, err=not ok)
    if not ok:
        sys.exit(1)
