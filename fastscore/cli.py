"""The command line: parses options and delegates. Typed errors become messages and exit codes here, and only here."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import click

from fastscore.errors import FastscoreError

DEFAULT_DATA = Path("../shared/data")


def _friendly(func):
    """Turn library errors into a one-line message and the error's exit code: no traceback for user error."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except FastscoreError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


@click.group()
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
def main(verbose: int) -> None:
    """fastscore: teacher-forced log-probs of an agent's action under many related chat contexts."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


@main.group()
def models() -> None:
    """The registry of checkpoints."""


# --- commands: each parses its options and calls one library function ---
