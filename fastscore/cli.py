"""The command line: parses options and delegates. Typed errors become messages and exit codes here, and only here."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click

from fastscore import __version__, variants
from fastscore.errors import FastscoreError
from fastscore.study.datafile import default_data_dir
from fastscore.study.envs import ENVS

INTERRUPTED_EXIT_CODE = 130  # the shell's convention for a SIGINT
DATA_HELP = "Study data folder (mbpp.jsonl, bfcl/); default: $FASTSCORE_DATA, else ../shared/data beside the checkout."
# Help texts read the variant table, so they list exactly what the code accepts.
BACKEND_HELP = ", ".join(variants.backends()) + "."
QUANT_HELP = ("Weights variant: " + "; ".join(f"{b} {variants.help_list(b)}" for b in variants.backends())
              + " (default: full precision, the batch-invariant type: llamacpp f32, derived from the embedded model's "
                "shipped q4_1 file, which stays available).")


def _one_line(exc: BaseException) -> str:
    """The error's message and its notes (e.g. where the finished work was kept) on one line."""
    parts = [str(exc)] if str(exc) else []
    return "; ".join(parts + list(getattr(exc, "__notes__", ())))


def _command_line() -> str:
    """The current command as typed (its arguments and the options given on the command line), for provenance."""
    ctx = click.get_current_context()
    words = ["fastscore", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) != click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name]
        values = value if isinstance(value, (tuple, list)) else [value]
        for one in values:
            if isinstance(param, click.Argument):
                words.append(str(one))
            elif getattr(param, "is_flag", False):
                words.append(param.opts[-1])
            else:
                words += [param.opts[-1], str(one)]
    return " ".join(words)


def _friendly(func):
    """Turn library errors into a one-line message and the error's exit code: no traceback for user error."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except FastscoreError as exc:
            click.echo(f"Error: {_one_line(exc)}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            click.echo(f"Interrupted{'; ' + _one_line(exc) if getattr(exc, '__notes__', None) else ''}", err=True)
            sys.exit(INTERRUPTED_EXIT_CODE)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="fastscore")
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
def main(verbose: int) -> None:
    """fastscore: teacher-forced log-probs of an agent's action under many related chat contexts."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


@main.group()
def models() -> None:
    """The registry of checkpoints."""


# --- commands: each parses its options and calls one library function ---


MODEL_HELP = ("A registry name, a local GGUF file (llamacpp, as it is), a local HF checkpoint folder, or a hub id "
              "org/name (default: the registry's default model).")


@main.command()
@click.argument("requests", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--backend", default="llamacpp", show_default=True, help=BACKEND_HELP)
@click.option("--quant", default=None, help=QUANT_HELP)
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              help="Output JSONL ('-': stdout). Written as OUT.partial, renamed to OUT once complete.")
@click.option("--generate", is_flag=True, help="Also decode a greedy reply per request (honouring 'banned').")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--hf-path", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A local HF checkpoint folder to use instead of the hub.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the backend's).")
@click.option("--exclude-end-of-turn", is_flag=True, help="Score the continuation without the end-of-turn token.")
@click.option("--chunk-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="Requests per scorer call (output streams chunk by chunk).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from OUT.partial (same options required).")
@click.option("--on-error", default="stop", show_default=True, type=click.Choice(["stop", "skip"]),
              help="At a bad request line: stop, or skip it and list it with its reason in OUT.skipped.jsonl.")
@click.option("--backend-option", "backend_option", multiple=True, metavar="KEY=VALUE",
              help="A typed backend option, repeatable (e.g. kv_type=f16, flash_attn=on for llamacpp; "
                   "share_prefixes=false for onnx).")
@click.option("--n-ctx", default=None, type=click.IntRange(min=16),
              help="llama.cpp context size in tokens (default 4096; the same as --backend-option n_ctx=N).")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0),
              help="Also write the K most likely tokens (id, text, log-prob) at every scored position.")
@click.option("--format", "out_format", default="jsonl", show_default=True,
              type=click.Choice(["jsonl", "parquet", "csv"]),
              help="OUT's format: nested JSONL, or one row per candidate as Parquet (pyarrow: the `parquet` extra) "
                   "or CSV (lists as JSON); a table is converted from OUT.jsonl, which is kept beside it.")
@click.option("--ban", "ban", default="exact", show_default=True, type=click.Choice(["exact", "prefix"]),
              help="With --generate: a completion may not equal a 'banned' text (exact) or not even start with one "
                   "(prefix).")
@_friendly
def score(requests, model, backend, quant, out, generate, max_new_tokens, hf_path, threads, exclude_end_of_turn,
          chunk_size, resume, on_error, backend_option, n_ctx, top_k, out_format, ban) -> None:
    """Score each candidate continuation of every request in REQUESTS (JSONL, '-': stdin) and write OUT, with the
    run's metadata (model, backend, quant, weights, versions, tokenizer hash, command) in OUT.meta.json."""
    from fastscore.score_run import run_score

    run = run_score(requests, out, model=model, backend=backend, quant=quant, hf_path=hf_path, threads=threads,
                    include_end_of_turn=not exclude_end_of_turn, backend_options=backend_option, n_ctx=n_ctx,
                    top_k=top_k, out_format=out_format, ban_prefix=ban == "prefix", generate=generate,
                    max_new_tokens=max_new_tokens, chunk_size=chunk_size, resume=resume, on_error=on_error,
                    command=_command_line())
    summary = run.summary
    resumed = f", {summary.n_resumed} already done" if summary.n_resumed else ""
    skipped = f"; {summary.n_skipped} bad lines skipped, listed in {summary.skipped_file}" if summary.n_skipped else ""
    click.echo(f"scored {summary.n_requests} requests ({summary.n_candidates} candidates{resumed}) with {run.model} "
               f"[{backend}, {run.quant}; {run.weights_note}] -> {summary.out}{skipped}", err=True)


@main.command()
@click.option("--model", default=None, help="Registry name (default: the registry's default model).")
@click.option("--backend", default="llamacpp", show_default=True, help=BACKEND_HELP)
@click.option("--quant", default=None, help=QUANT_HELP)
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--limit", default=None, callback=lambda ctx, param, value: _study_limit(value),
              help="Items per environment, or 'all' for every usable item (default: sized for the 2-core machine).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--failures", default="both", show_default=True, type=click.Choice(["both", "seeded", "model"]),
              help="seeded: mutations of the ground truth; model: the model's own failed greedy attempts; both: "
                   "each in its own subfolder of --out, reported side by side.")
@click.option("--retries", default=8, show_default=True, type=click.IntRange(min=0),
              help="Sampled clean retries per on-policy item (temperature 1.0, seeded).")
@click.option("--exclude-end-of-turn", is_flag=True,
              help="Score the action alone, without the end-of-turn token (the paper's action-only counts).")
@click.option("--out", "out", default=Path("study-out"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path))
@click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
              callback=lambda ctx, param, value: value or default_data_dir())
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out (same options required).")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the backend's).")
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
@_friendly
def study(model, backend, quant, envs, limit, seed, failures, retries, exclude_end_of_turn, out, data, resume, threads,
          max_new_tokens, n_boot, hf_path, sandbox, sensitivity) -> None:
    """Run the corrective-gain study end to end and write its results, report and plots into --out."""
    from fastscore.registry import default_model
    from fastscore.study.report import headline
    from fastscore.study.runner import DEFAULT_LIMIT, StudyConfig, run_study

    model = model or default_model()
    config = StudyConfig(
        model=model, backend=backend, quant=quant,
        envs=tuple(e.strip() for e in envs.split(",") if e.strip()),
        limit=DEFAULT_LIMIT if limit == "default" else limit, seed=seed, failures=failures, retries=retries,
        include_end_of_turn=not exclude_end_of_turn, out_dir=out, data_dir=data, resume=resume, n_boot=n_boot,
        max_new_tokens=max_new_tokens, hf_path=hf_path, threads=threads, sandbox=sandbox, sensitivity=sensitivity,
    )  # fmt: skip
    outcome = run_study(config, progress=True)
    for line in headline(outcome, config.failures):
        click.echo(line)
    click.echo(f"results in {outcome.out_dir}/ (report.md, summary.json, scores.jsonl, plots)")


@main.command("report-html")
@click.argument("study_out", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the backend's).")
@click.option("--rescore", is_flag=True, help="Recompute tokens.jsonl even if present.")
@_friendly
def report_html(study_out, threads, rescore) -> None:
    """Write STUDY_OUT/report.html: summary tables, plots and a per-item explorer of the failed action's tokens
    (their log-probs before and after the failure record are scored once into tokens.jsonl, with the study's model)."""
    from fastscore.study.report_html import write_report_html

    click.echo(f"wrote {write_report_html(study_out, threads=threads, rescore=rescore)}")


@main.command()
@click.option("--models", required=True, help="Comma-separated models: registry names, hub ids or local HF folders.")
@click.option("--variants", default="f32", show_default=True,
              help="Comma-separated weight variants, QUANT (llama.cpp) or BACKEND:QUANT, e.g. f32,q4_1,onnx:fp32.")
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--failures", default="seeded,model", show_default=True,
              help="Comma-separated failure sources: seeded (mutated ground truth), model (its own failed attempts).")
@click.option("--limit", default="20", show_default=True, callback=lambda _ctx, _param, value: _study_limit(value),
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
@_friendly
def sweep(models, variants, envs, failures, limit, shard_size, out, data, seed, resume, ray_address, workers,
          threads, max_new_tokens, n_boot, sandbox, allow_stand_ins) -> None:
    """Run the study over a grid of models x variants x environments x failure sources, resumable by shard, in this
    process or on Ray, and write the cross-model summary (summary.md, summary.json, a plot) into --out."""
    from fastscore.sweep.run import SweepConfig, run_sweep

    config = SweepConfig(
        models=tuple(m.strip() for m in models.split(",") if m.strip()), variants=tuple(_csv(variants)),
        envs=tuple(_csv(envs)),
        failures=tuple(_csv(failures)), limit=limit, shard_size=shard_size, seed=seed,
        out_dir=out, data_dir=data, resume=resume, ray=ray_address, workers=workers, threads=threads,
        max_new_tokens=max_new_tokens, n_boot=n_boot, sandbox=sandbox, command=_command_line(),
        allow_standins=allow_stand_ins,
    )  # fmt: skip
    outcome = run_sweep(config, progress=True)
    for (model, variant), reason in outcome.skipped.items():
        click.echo(f"skipped {model} ({variant}): {reason}")
    click.echo(f"{outcome.n_shards} shards ({outcome.n_resumed} already done) in {outcome.seconds:.0f} s; "
               f"summary in {outcome.out_dir}/summary.md")
def _study_limit(value: str | None) -> int | None | str:
    """--limit: a positive count, 'all' (None: every usable item), or unset ('default')."""
    if value is None:
        return "default"
    if value.strip().lower() == "all":
        return None
    try:
        count = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a positive integer nor 'all'") from None
    if count < 1:
        raise click.BadParameter(f"must be at least 1 or 'all' (got {count})")
    return count


def _bench_list(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


@main.command()
@click.option("--model", default=None, help="Registry name (default: the registry's default model).")
@click.option("--data", "data", default=None, type=click.Path(path_type=Path), help=DATA_HELP,
              callback=lambda ctx, param, value: value or default_data_dir())
@click.option("--limit", default=3, show_default=True, type=click.IntRange(min=1), help="Items per environment.")
@click.option("--env", "envs", default=",".join(ENVS), show_default=True, help="Comma-separated environments.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1), help="Timed runs (median).")
@click.option("--backends", default="llamacpp,onnx", show_default=True, help="Backends to measure.")
@click.option("--quants", default=None, help="Subset of types (default: " + ",".join(v.quant for v in variants.VARIANTS if v.in_bench) + ").")
@click.option("--skip-reference", is_flag=True, help="Skip the transformers reference (no end-to-end speedup).")
@click.option("--best", default=None, help="llama.cpp type for end to end and greedy (default: the fastest).")
@click.option("--pp-tokens", default=512, show_default=True, type=click.IntRange(min=2))
@click.option("--per-request-repeats", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--reference-repeats", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--per-request-limit", default=None, type=click.IntRange(min=1),
              help="Time only the first N requests one per call (default: all).")
@click.option("--greedy-batches", default="1,8,32", show_default=True)
@click.option("--new-tokens", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--greedy-repeats", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--sgemm-n", default=2048, show_default=True, type=click.IntRange(min=16))
@click.option("--conditions", default=None, help="Subset of study conditions in the workload (default: all).")
@click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the JSON figures to this file.")
@click.option("--requests", "requests", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Benchmark on this scoring file (fastscore score's input) instead of the study's items.")
@_friendly
def bench(model, data, limit, envs, threads, repeats, backends, quants, skip_reference, best, pp_tokens,
          per_request_repeats, reference_repeats, per_request_limit, greedy_batches, new_tokens, greedy_repeats, sgemm_n,
          conditions, json_out, requests) -> None:
    """Benchmark every backend side by side on the same study requests: a table, then one JSON line."""
    import os

    from fastscore import outputs
    from fastscore.bench.run import BenchOptions, run_bench
    from fastscore.bench.table import json_line, render
    from fastscore.registry import default_model
    from fastscore.resolve import model_source

    model_source(model or default_model())
    if json_out is not None:
        outputs.ensure_parent(json_out)

    opts = BenchOptions(
        model=model or default_model(), data_dir=data, items_per_env=limit, envs=_bench_list(envs),
        threads=threads or os.cpu_count() or 1, repeats=repeats, backends=_bench_list(backends), quants=_bench_list(quants),
        skip_reference=skip_reference, best=best, pp_tokens=pp_tokens, per_request_repeats=per_request_repeats,
        per_request_limit=per_request_limit, reference_repeats=reference_repeats, greedy_batches=tuple(int(b) for b in _bench_list(greedy_batches)),
        new_tokens=new_tokens, greedy_repeats=greedy_repeats, sgemm_n=sgemm_n, conditions=_bench_list(conditions),
        requests=requests,
    )  # fmt: skip
    summary = run_bench(opts)
    click.echo(render(summary))
    line = json_line(summary)
    click.echo(line)
    if json_out is not None:
        outputs.write_text_atomic(json_out, line + "\n")


@main.command("bench-scale")
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
@click.option("--table-out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the markdown tables to this file.")
@_friendly
def bench_scale(models, data, out, limit, threads, repeats, greedy_batch, new_tokens, skip, prune, studies,
                table_out) -> None:
    """Convert and measure each registry model at real size (stand-ins where the weights are not here)."""
    import os

    from fastscore import outputs
    from fastscore.bench import projection
    from fastscore.bench.scale import DEFAULT_MODELS, SCORING, ScaleOptions, run_scale
    from fastscore.resolve import model_source

    chosen = _bench_list(models) or DEFAULT_MODELS
    for model in chosen:
        model_source(model)  # an unknown name stops here, before anything runs
    opts = ScaleOptions(out_dir=out, data_dir=data, models=chosen, items_per_env=limit,
                        threads=threads or os.cpu_count() or 1, repeats=repeats, greedy_batch=greedy_batch,
                        new_tokens=new_tokens, skip=_bench_list(skip) or (), prune=prune)
    results = run_scale(opts)
    works = [projection.study_work(folder) for folder in studies]
    sources = projection.count_sources(data, sorted({e for w in works for e in w["items"]})) if works else None
    text = projection.render(results, works, sources, SCORING, opts.threads, os.cpu_count() or 1)
    click.echo(text)
    if table_out is not None:
        outputs.write_text_atomic(table_out, text + "\n")


@main.command("quant-check")
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
@_friendly
def quant_check(model, limit, envs, variants, out, data, seed, threads, n_boot, requests) -> None:
    """Score the same study items under every quantised variant and compare each with the fp32 reference."""
    from fastscore.study.quantcheck.run import DEFAULT_VARIANTS, QuantCheckConfig, parse_variants, run_quant_check
    from fastscore.registry import default_model

    if requests is not None:
        from fastscore.quant_requests import quant_check_requests

        chosen = parse_variants(variants) if variants else DEFAULT_VARIANTS
        results = quant_check_requests(requests, model or default_model(), [(v.backend, v.quant) for v in chosen],
                                       out, threads=threads, progress=True, command=_command_line())
        for label, comparison in results.items():
            click.echo(f"{label}: best candidate changed {comparison.candidate_argmax_changes.line()}; "
                       f"contrast sign flips {comparison.contrast_sign_flips.line()}")
        click.echo(f"results in {out}/ (quant.md, quant.json, one scores file per variant)")
        return

    config = QuantCheckConfig(
        model=model or default_model(), out_dir=out, data_dir=data, envs=_bench_list(envs), limit=limit,
        variants=parse_variants(variants) if variants else DEFAULT_VARIANTS, seed=seed, threads=threads,
        n_boot=n_boot, command="fastscore " + " ".join(sys.argv[1:]), progress=True,
    )  # fmt: skip
    summary = run_quant_check(config)
    for label, groups in summary["variants"].items():
        click.echo(f"{label}: " + "; ".join(f"{g}: {c['sign_of_mean']}" for g, c in groups.items()))
    click.echo(f"results in {out}/ (quant.md, quant.json, plots)")


@main.command()
@click.argument("run_a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("run_b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the comparison as JSON to this file.")
@_friendly
def compare(run_a, run_b, json_out) -> None:
    """Compare two `score` outputs of the same requests: per-token and per-candidate differences, argmax changes
    and sign flips of candidate contrasts (B - A)."""
    from fastscore import outputs
    from fastscore.compare import compare_files

    comparison = compare_files(run_a, run_b)
    for line in comparison.lines():
        click.echo(line)
    if json_out is not None:
        outputs.write_text_atomic(json_out, json.dumps(comparison.to_dict(), indent=1) + "\n")


def _csv(value: str) -> list[str]:
    return [part.strip().lower() for part in value.split(",") if part.strip()]


@models.command("list")
@_friendly
def models_list() -> None:
    """The registry's models, and which of their variants are present locally."""
    from fastscore.registry import all_models, default_model
    from fastscore.resolve import local_variants

    headers = ("name", "family", "params", "hub id", "embedded", "local variants")
    rows = [
        (
            entry.name + (" (default)" if entry.name == default_model() else ""),
            entry.family,
            f"{entry.params / 1e9:.1f}B" if entry.params >= 1e9 else f"{entry.params / 1e6:.0f}M",
            entry.hub_id,
            f"yes ({entry.embedded.quant})" if entry.embedded else "no",
            ", ".join(local_variants(entry.name)) or "-",
        )
        for entry in all_models()
    ]
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    for row in (headers, *rows):
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


@models.command("verify")
@click.argument("names", nargs=-1)
@click.option("--hf-path", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The local HF checkpoint folder the variants were converted from.")
@_friendly
def models_verify(names, hf_path) -> None:
    """Hash every cached variant of NAMES (default: every registry model) against what was recorded at build."""
    from fastscore.conversion.verify import verify
    from fastscore.errors import DamagedArtefactError
    from fastscore.registry import all_models

    results = [r for name in (names or [e.name for e in all_models()]) for r in verify(name, hf_path)]
    for result in results:
        click.echo(result.line())
    damaged = [r for r in results if r.problems]
    click.echo(f"{len(results)} artefacts checked, {len(damaged)} damaged")
    if damaged:
        raise DamagedArtefactError(f"{len(damaged)} damaged artefact(s): " + "; ".join(
            f"{r.model} {r.variant} (fix: {r.fix})" for r in damaged))


@main.command()
@click.argument("model")
@click.option("--gguf", default="", help="Comma-separated GGUF types: " + variants.help_list("llamacpp") + ".")
@click.option("--onnx", default="", help="Comma-separated ONNX types: " + variants.help_list("onnx") + ".")
@click.option("--hf-path", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A local HF checkpoint folder to convert instead of fetching the hub.")
@click.option("--force", is_flag=True,
              help="Rebuild the requested variants even if cached (none requested: the tokenizer and hf-fp32).")
@_friendly
def convert(model, gguf, onnx, hf_path, force) -> None:
    """Build MODEL's fp32 HF reference and the requested variants; print each read-back check."""
    import time

    from fastscore.conversion.pipeline import convert as convert_variants

    started = time.perf_counter()
    results = convert_variants(model, gguf=_csv(gguf), onnx=_csv(onnx), hf_path=hf_path, force=force)
    for result in results:
        click.echo(result.line())
    click.echo(f"{len(results)} variants ready in {time.perf_counter() - started:.1f} s")
