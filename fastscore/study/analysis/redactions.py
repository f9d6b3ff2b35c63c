"""How many items' descriptions had quoted substrings of the failed action replaced by a marker (study.hygiene),
counted per environment into summary.json and stated next to the items and skip reasons in the report.

On the model's own failures the runtime's and the tests' wording names what the model wrote; such items are kept with
a redacted description instead of being skipped, so the count tells how much of the description remedy is elided.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from fastscore.study.data.items import Item
from fastscore.study.analysis.stats import wilson_ci
from fastscore.study.report.control import ci_pct, table

KEY = "description_redacted"


def redaction_counts(items: Iterable[Item]) -> dict[str, dict[str, Any]]:
    """{env: {n_items, n_redacted, substrings, share}}: items whose description was redacted, of the items built.
    An item from before redaction existed (no count in its meta) counts as not recorded, not as unredacted."""
    by_env: dict[str, list[int | None]] = {}
    for item in items:
        by_env.setdefault(item.env, []).append(item.meta.get(KEY))
    out = {}
    for env, counts in by_env.items():
        recorded = [c for c in counts if c is not None]
        entry: dict[str, Any] = {"n_items": len(counts), "n_recorded": len(recorded),
                                 "n_redacted": sum(c > 0 for c in recorded), "substrings": sum(recorded)}
        if recorded:
            entry["share"] = wilson_ci(np.array([c > 0 for c in recorded], dtype=float)).to_dict()
        out[env] = entry
    return out


def attach_redactions(summary: dict[str, Any], items: Iterable[Item]) -> None:
    """Put each environment's counts under summary[env]["description_redacted"] (environments it summarises)."""
    for env, entry in redaction_counts(items).items():
        if isinstance(summary.get(env), dict):
            summary[env][KEY] = entry


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
