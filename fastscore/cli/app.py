"""The command group and what its commands share: option help texts, option parsers, the command line as typed, and
`friendly`, where typed errors become messages and exit codes (defined in fastscore.exits, which the bench lab's
scripts share)."""

from __future__ import annotations

import logging

import click

from fastscore import __version__, variants
from fastscore.exits import friendly  # noqa: F401  (the commands import it from here)

DATA_HELP = "Study data folder (mbpp.jsonl, bfcl/); default: $FASTSCORE_DATA, else ../shared/data beside the checkout."
# Help texts read the variant table, so they list exactly what the code accepts.
BACKEND_HELP = ", ".join(variants.backends()) + "."
QUANT_HELP = ("Weights variant: " + "; ".join(f"{b} {variants.help_list(b)}" for b in variants.backends())
              + " (default: full precision, the batch-invariant type: llamacpp f32, derived from the embedded model's "
                "shipped q4_1 file, which stays available).")
MODEL_HELP = ("A registry name, a local GGUF file (llamacpp, as it is), a local HF checkpoint folder, or a hub id "
              "org/name (default: the registry's default model).")


def command_line() -> str:
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


def study_limit(value: str | None) -> int | None | str:
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


def bench_list(value: str | None) -> tuple[str, ...] | None:
    """A comma-separated option as given (model paths keep their case); None stays None (the command's default)."""
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


def csv_list(value: str) -> list[str]:
    """A comma-separated list of variant, type, environment or failure-source names: lower-cased, as they are kept."""
    return [part.strip().lower() for part in value.split(",") if part.strip()]
