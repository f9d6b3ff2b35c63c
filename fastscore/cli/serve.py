"""`serve`: prompt log-probs (OpenAI /v1/completions) and candidate scores (/v1/score) over HTTP."""

from __future__ import annotations

import click

from fastscore.cli.app import BACKEND_HELP, MODEL_HELP, QUANT_HELP, friendly, main


@main.command()
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--backend", default="llamacpp", show_default=True, help=BACKEND_HELP)
@click.option("--quant", default=None, help=QUANT_HELP)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (the default accepts local clients only).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads (default: the backend's).")
@click.option("--backend-option", "backend_option", multiple=True, metavar="KEY=VALUE",
              help="A typed backend option, repeatable (e.g. n_ctx=8192 for llamacpp).")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0),
              help="/v1/score: also return the K most likely tokens at every scored position.")
@click.option("--exclude-end-of-turn", is_flag=True, help="/v1/score: score candidates without the end-of-turn token.")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(min=1),
              help="Requests that may wait for the model; past that the server answers 503.")
@click.option("--batch-window-ms", default=5.0, show_default=True, type=click.FloatRange(min=0),
              help="How long the model waits for more requests to join a batch (one prefix trie).")
@click.option("--max-body-bytes", default=1 << 20, show_default=True, type=click.IntRange(min=1),
              help="Larger request bodies are refused with 413.")
@click.option("--max-items", default=256, show_default=True, type=click.IntRange(min=1),
              help="Most prompts (completions) or candidates (score) in one request; more is refused with 413.")
@friendly
def serve(model, backend, quant, host, port, threads, backend_option, top_k, exclude_end_of_turn, max_queue,
          batch_window_ms, max_body_bytes, max_items) -> None:
    """Serve the model over HTTP: POST /v1/completions (OpenAI: echo=true, logprobs=N, max_tokens=0 return the
    prompt's log-probs) and POST /v1/score (fastscore's request objects); concurrent requests are scored together.
    Stop with Ctrl-C."""
    from fastscore.api import load
    from fastscore.deps import check_extras, extras_for_backend
    from fastscore.serve.server import Limits, ScoringServer

    check_extras(*extras_for_backend(backend), purpose=f"fastscore serve on {backend}")
    opened = load(model, backend, quant, threads=threads, top_k=top_k, include_end_of_turn=not exclude_end_of_turn,
                  backend_options=backend_option, progress=True)
    limits = Limits(max_body_bytes=max_body_bytes, max_items=max_items, max_waiting=max_queue,
                    batch_window_s=batch_window_ms / 1000)
    with opened:
        server = ScoringServer((host, port), opened.scorer, opened.model, limits)
        click.echo(f"serving {opened.model} [{backend}, {opened.quant}; {opened.weights_note}] on {server.url} "
                   "(Ctrl-C stops)", err=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            click.echo("stopped", err=True)
        finally:
            server.close()
