"""The report's statements of the description redactions (fastscore.study.analysis.redactions): a paragraph under
the items table, and a table per failure source in the side-by-side report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastscore.study.analysis.redactions import KEY
from fastscore.study.report.markdown import ci_pct, table


def _cells(entry: Mapping[str, Any] | None) -> list[str]:
    if not entry or "share" not in entry:
        return ["not recorded", ""]
    share = entry["share"]
    return [f"{entry['n_redacted']} of {entry['n_recorded']} ({100 * share['mean']:.0f}% [{ci_pct(share)}])",
            str(entry["substrings"])]


HEADER = ["items with a redacted description (share [95% Wilson])", "substrings redacted"]


def redaction_note(summary: Mapping[str, Any], failure_source: str | None) -> str:
    """The report's paragraph under the items table ("" when no environment recorded its counts)."""
    rows = [[env, *_cells(s.get(KEY))] for env, s in summary.items() if isinstance(s, dict) and KEY in s]
    if not rows:
        return ""
    return ("\n\nDescriptions redacted: where the description remedy, written from the runtime's or the tests' own "
            "wording, would quote the failed action (a line of it not in the correct action, or a name of 3+ "
            "characters in neither the correct action nor the context), each quoted occurrence is replaced by `…` "
            "and the item is kept; the error record in `after` is shown as the runtime printed it. Failure source: "
            f"{failure_source or 'not recorded'}.\n\n" + table(["env", *HEADER], rows))


def redaction_section(by_source: Mapping[str, Mapping[str, Any]]) -> str:
    """The side-by-side report's table: one row per failure source and environment."""
    rows = [[source, env, *_cells(s.get(KEY))] for source, summary in by_source.items()
            for env, s in summary.items() if env != "pooled" and isinstance(s, dict)]
    return ("## Descriptions redacted\n\nItems whose description would have quoted the failed action and was kept "
            "with the quoted substrings replaced by `…` (the error record is unchanged).\n\n"
            + table(["source", "env", *HEADER], rows))
