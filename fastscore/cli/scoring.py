"""`score` and `compare`: scoring request files and comparing two of their outputs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fastscore.cli.app import BACKEND_HELP, MODEL_HELP, QUANT_HELP, command_line, friendly, main


@main.command()
@click.argument("requests", required=False, type=click.Path(exists=True, dir_okay=False, allow_dash=True,
                                                             path_type=Path))
@click.option("--text", "text", default=None, metavar="FILE_OR_STRING",
              help="Instead of REQUESTS: score this raw text unconditionally (no chat template): every token's "
                   "log-prob and the perplexity, as JSON to --out (default: stdout). A file's path reads the file; "
                   "'-' reads stdin; anything else is the text itself.")
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--backend", default="llamacpp", show_default=True, help=BACKEND_HELP)
@click.option("--quant", default=None, help=QUANT_HELP)
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              help="Output JSONL ('-': stdout; required with REQUESTS). Written as OUT.partial, renamed to OUT once "
                   "complete; locked meanwhile (a second run on OUT is refused, exit code 10).")
@click.option("--generate", is_flag=True, help="Also decode a greedy reply per request (honouring 'banned').")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--hf-path", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A local HF checkpoint folder to use instead of the hub.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the backend's).")
@click.option("--exclude-end-of-turn", is_flag=True, help="Score the continuation without the end-of-turn token.")
@click.option("--chunk-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="Requests per scorer call (output streams chunk by chunk).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from OUT.partial (same options required).")
@click.option("--restart", is_flag=True, help="Discard an interrupted run's OUT.partial and start over.")
@click.option("--max-line-bytes", default=None, type=click.IntRange(min=1),
              help="The most bytes a request line may hold, checked before it is parsed (default: 16 context windows "
                   "of text, n_ctx times the longest token's bytes each).")
@click.option("--on-error", default="stop", show_default=True, type=click.Choice(["stop", "skip"]),
              help="At a bad request line: stop, or skip it and list it with its reason in OUT.skipped.jsonl.")
@click.option("--backend-option", "backend_option", multiple=True, metavar="KEY=VALUE",
              help="A typed backend option, repeatable (e.g. kv_type=f16, flash_attn=on for llamacpp; "
                   "share_prefixes=false for onnx).")
@click.option("--n-ctx", default=None, type=click.IntRange(min=16),
              help="llama.cpp context size in tokens, at most the model's trained context (default 4096, or the trained "
                   "context if smaller; the same as --backend-option n_ctx=N).")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0),
              help="Also write the K most likely tokens (id, text, log-prob) at every scored position.")
@click.option("--format", "out_format", default="jsonl", show_default=True,
              type=click.Choice(["jsonl", "parquet", "csv"]),
              help="OUT's format: nested JSONL, or one row per candidate as Parquet (pyarrow: the `parquet` extra) "
                   "or CSV (lists as JSON); a table is converted from OUT.jsonl, which is kept beside it.")
@click.option("--ban", "ban", default="exact", show_default=True, type=click.Choice(["exact", "prefix"]),
              help="With --generate: a completion may not equal a 'banned' text (exact) or not even start with one "
                   "(prefix).")
@friendly
def score(requests, text, model, backend, quant, out, generate, max_new_tokens, hf_path, threads,
          exclude_end_of_turn, chunk_size, resume, restart, max_line_bytes, on_error, backend_option, n_ctx,
          top_k, out_format, ban) -> None:
    """Score each candidate continuation of every request in REQUESTS (JSONL, '-': stdin) and write OUT, with the
    run's metadata (model, backend, quant, weights, versions, tokenizer hash, command) in OUT.meta.json.
    With --text instead: the text's per-token log-probs and perplexity."""
    from fastscore.deps import check_extras, extras_for_backend

    if (requests is None) == (text is None):
        raise click.UsageError("give either REQUESTS or --text")
    check_extras(*extras_for_backend(backend), *(["parquet"] if out_format == "parquet" else []),
                 purpose=f"fastscore score on {backend}" + (" to parquet" if out_format == "parquet" else ""))
    if text is not None:
        from fastscore.text_score import run_text

        run = run_text(text, out, model=model, backend=backend, quant=quant, hf_path=hf_path, threads=threads,
                       backend_options=backend_option, n_ctx=n_ctx, command=command_line())
        click.echo(f"{run.score.line()} with {run.model} [{backend}, {run.quant}]"
                   + ("" if out is None or str(out) == "-" else f" -> {out}"), err=True)
        return
    if out is None:
        raise click.UsageError("Missing option '--out' (the scores' output file; '-' for stdout).")
    from fastscore.score_run import run_score

    run = run_score(requests, out, model=model, backend=backend, quant=quant, hf_path=hf_path, threads=threads,
                    include_end_of_turn=not exclude_end_of_turn, backend_options=backend_option, n_ctx=n_ctx,
                    top_k=top_k, out_format=out_format, ban_prefix=ban == "prefix", generate=generate,
                    max_new_tokens=max_new_tokens, chunk_size=chunk_size, resume=resume, restart=restart,
                    on_error=on_error, max_line_bytes=max_line_bytes, command=command_line())
    summary = run.summary
    resumed = f", {summary.n_resumed} already done" if summary.n_resumed else ""
    skipped = f"; {summary.n_skipped} bad lines skipped, listed in {summary.skipped_file}" if summary.n_skipped else ""
    click.echo(f"scored {summary.n_requests} requests ({summary.n_candidates} candidates{resumed}) with {run.model} "
               f"[{backend}, {run.quant}; {run.weights_note}] -> {summary.out}{skipped}", err=True)


@main.command()
@click.argument("run_a", type=click.Path(exists=True, path_type=Path))
@click.argument("run_b", type=click.Path(exists=True, path_type=Path))
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=0),
              help="How many of the most-changed candidates to list (0: none).")
@click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the comparison as JSON to this file.")
@friendly
def compare(run_a, run_b, top, json_out) -> None:
    """Compare two `score` outputs of the same requests (jsonl, csv or parquet, as `score --format` writes them):
    per-token and per-candidate differences, argmax changes, sign flips of candidate contrasts (B - A), and the
    candidates whose log-prob changed most."""
    from fastscore import outputs
    from fastscore.compare import compare_files

    comparison = compare_files(run_a, run_b, top=top)
    for line in comparison.lines():
        click.echo(line)
    if comparison.most_changed:
        click.echo("")
    for line in comparison.table():
        click.echo(line)
    if json_out is not None:
        outputs.write_text_atomic(json_out, json.dumps(comparison.to_dict(), indent=1) + "\n")
