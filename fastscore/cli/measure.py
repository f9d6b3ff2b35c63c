"""`bench`, `bench-scale` and `quant-check`: throughput, scaling, and what quantisation does to the scores."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fastscore import variants
from fastscore.cli.app import DATA_HELP, bench_list, command_line, friendly, main
from fastscore.study.datafile import default_data_dir
from fastscore.study.envs import ENVS


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
@click.option("--json", "as_json", is_flag=True,
              help="Print every figure as one JSON line instead of the short table.")
@click.option("--details", is_flag=True, help="Print the detailed tables (roofline, GFLOP/s, every ratio) instead.")
@click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the JSON figures to this file.")
@click.option("--requests", "requests", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Benchmark on this scoring file (fastscore score's input) instead of the study's items.")
@click.option("--decode-bound", is_flag=True,
              help="Instead, measure what bounds batched greedy decoding (fastscore.bench.decode_bound's default grid; "
                   "uses --model, --best as the type (default f32), --threads, --repeats, --pp-tokens, --json-out; "
                   "more options: python -m fastscore.bench.decode_bound --help).")
@click.option("--op-profile", is_flag=True,
              help="Instead, profile llama.cpp op by op on the workload's shared scoring and on greedy decoding steps, "
                   "against the FLOP roofline (fastscore.bench.op_profile; uses --model, --best as the type (default "
                   "f32), --data, --limit, --env, --conditions, --threads, --repeats, the largest --greedy-batches as "
                   "the contexts decoded, --new-tokens, --sgemm-n, --json-out; more options: python -m "
                   "fastscore.bench.op_profile --help).")
@click.option("--study-bound", "study_runs", multiple=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Instead, the item-runs per hour this machine's sgemm rate allows for the tokens these study runs "
                   "computed (a failure source's folder, e.g. study-out/seeded; repeat for each; uses --threads, "
                   "--sgemm-n, --json-out).")
@friendly
def bench(model, data, limit, envs, threads, repeats, backends, quants, skip_reference, best, pp_tokens,
          per_request_repeats, reference_repeats, per_request_limit, greedy_batches, new_tokens, greedy_repeats, sgemm_n,
          conditions, as_json, details, json_out, requests, decode_bound, op_profile, study_runs) -> None:
    """Benchmark every backend side by side on the same study requests: a short table (--details: every figure in
    tables; --json: one JSON line)."""
    import os

    from fastscore.deps import check_extras, extras_for_backend

    if decode_bound or op_profile:
        check_extras("llamacpp", purpose="fastscore bench --decode-bound / --op-profile")
    elif not study_runs:
        chosen = [*bench_list(backends), *([] if skip_reference else ["reference"])]
        check_extras(*(e for b in chosen for e in extras_for_backend(b)),
                     purpose="fastscore bench on " + ", ".join(chosen) + " (--skip-reference and --backends "
                                                                        "choose fewer)")

    if study_runs:
        from fastscore.bench import study_bound
        from fastscore.bench.table import print_and_save

        print_and_save(study_bound.measure(study_runs, threads or os.cpu_count() or 1, sgemm_n), json_out,
                       study_bound.render, as_json)
        return

    if decode_bound:
        from fastscore.bench.decode_bound import DecodeBoundOptions, run_decode_bound
        from fastscore.bench.decode_bound_table import render
        from fastscore.bench.table import print_and_save
        from fastscore.registry import default_model

        opts = DecodeBoundOptions(model=model or default_model(), quant=best or "f32",
                                  threads=threads or os.cpu_count() or 1, repeats=repeats, pp_tokens=pp_tokens)
        print_and_save(run_decode_bound(opts), json_out, render, as_json)
        return

    if op_profile:
        from fastscore.bench.op_profile import OpProfileOptions, run_op_profile
        from fastscore.bench.op_profile_table import render
        from fastscore.bench.table import print_and_save
        from fastscore.registry import default_model

        opts = OpProfileOptions(model=model or default_model(), data_dir=data, quant=best or "f32", items_per_env=limit,
                                envs=bench_list(envs), threads=threads or os.cpu_count() or 1, repeats=repeats,
                                decode_contexts=max(int(b) for b in bench_list(greedy_batches)), new_tokens=new_tokens,
                                sgemm_n=sgemm_n, conditions=bench_list(conditions))
        print_and_save(run_op_profile(opts), json_out, render, as_json)
        return

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
        skip_reference=skip_reference, best=best, pp_tokens=pp_tokens, per_request_repeats=per_request_repeats,
        per_request_limit=per_request_limit, reference_repeats=reference_repeats, greedy_batches=tuple(int(b) for b in bench_list(greedy_batches)),
        new_tokens=new_tokens, greedy_repeats=greedy_repeats, sgemm_n=sgemm_n, conditions=bench_list(conditions),
        requests=requests,
    )  # fmt: skip
    print_and_save(run_bench(opts), json_out, render_details if details else render_short, as_json)


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
    check_extras("llamacpp", "onnx", "reference", purpose="fastscore bench-scale")

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
@friendly
def quant_check(model, limit, envs, variants, out, data, seed, threads, n_boot, requests) -> None:
    """Score the same study items under every quantised variant and compare each with the fp32 reference."""
    from fastscore.deps import check_extras, extras_for_backend
    from fastscore.study.quantcheck.run import DEFAULT_VARIANTS, QuantCheckConfig, parse_variants, run_quant_check
    from fastscore.registry import default_model

    chosen = parse_variants(variants) if variants else DEFAULT_VARIANTS
    check_extras("reference", *(e for v in chosen for e in extras_for_backend(v.backend)),
                 *([] if requests is not None else ["study"]), purpose="fastscore quant-check")

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
