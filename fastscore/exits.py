"""How a command line ends on a typed error: its one-line message and the error's exit code, no traceback.

Shared by `fastscore`'s CLI and the standalone `python -m` scripts of fastscore.bench.lab, which the CLI never imports.
"""

from __future__ import annotations

import functools
import sys

import click

from fastscore.errors import FastscoreError

INTERRUPTED_EXIT_CODE = 130  # the shell's convention for a SIGINT


def one_line(exc: BaseException) -> str:
    """The error's message and its notes (e.g. where the finished work was kept) on one line."""
    parts = [str(exc)] if str(exc) else []
    return "; ".join(parts + list(getattr(exc, "__notes__", ())))


def friendly(func):
    """Turn library errors into a one-line message and the error's exit code: no traceback for user error."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except FastscoreError as exc:
            click.echo(f"Error: {one_line(exc)}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            click.echo(f"Interrupted{'; ' + one_line(exc) if getattr(exc, '__notes__', None) else ''}", err=True)
            sys.exit(INTERRUPTED_EXIT_CODE)

    return wrapper
