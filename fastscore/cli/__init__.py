"""The command line: parses options and delegates. Typed errors become messages and exit codes here, and only here
(fastscore.cli.app.friendly). One module per command family; importing them registers their commands on `main`,
the console script's entry point."""

from fastscore.cli import artefacts, measure, scoring, serve, shards, studies  # noqa: F401  (registers the commands)
from fastscore.cli.app import main

__all__ = ["main"]
