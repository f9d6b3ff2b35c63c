"""How many items' descriptions had quoted substrings of the failed action replaced by a marker (data.hygiene),
counted per environment into summary.json (the report states them: fastscore.study.report.redactions).

On the model's own failures the runtime's and the tests' wording names what the model wrote; such items are kept with
a redacted description instead of being skipped, so the count tells how much of the description remedy is elided.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from fastscore.study.data.items import Item
from fastscore.study.analysis.stats import wilson_ci

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
