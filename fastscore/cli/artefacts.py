"""`models list`, `models verify` and `convert`: the registry, the cached variants, and building them."""

from __future__ import annotations

from pathlib import Path

import click

from fastscore import variants
from fastscore.cli.app import csv_list, friendly, main, models


@models.command("list")
@friendly
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
@friendly
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
@friendly
def convert(model, gguf, onnx, hf_path, force) -> None:
    """Build MODEL's fp32 HF reference and the requested variants; print each read-back check."""
    import time

    from fastscore.conversion.pipeline import convert as convert_variants
    from fastscore.deps import check_extras

    # Every conversion builds (or reads) the fp32 HF reference first and checks each variant against it.
    check_extras("reference", *(["llamacpp"] if gguf else []), *(["onnx"] if onnx else []),
                 purpose="fastscore convert")

    started = time.perf_counter()
    results = convert_variants(model, gguf=csv_list(gguf), onnx=csv_list(onnx), hf_path=hf_path, force=force)
    for result in results:
        click.echo(result.line())
    click.echo(f"{len(results)} variants ready in {time.perf_counter() - started:.1f} s")
