"""One environment's score rows as per-condition arrays aligned on its items (EnvTable): what every metric reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fastscore.errors import DataError
from fastscore.study.analysis.stats import corrective_gain
from fastscore.study.data.conditions import GAIN_UNDEFINED, REFERENCE


@dataclass(frozen=True)
class EnvTable:
    """Rows of one env as per-condition arrays aligned on sorted item ids (NaN where an item lacks the row)."""

    env: str
    item_ids: tuple[str, ...]
    columns: dict[str, dict[str, np.ndarray]] = field(repr=False)
    # condition -> per item: (the failed action's token log-probs, which of its tokens are the edit) or None
    tokens: dict[str, list[tuple[np.ndarray, np.ndarray] | None]] = field(default_factory=dict, repr=False)
    kinds: tuple[str, ...] = ()  # each item's failure kind ("" when not recorded)

    def has(self, condition: str) -> bool:
        return condition in self.columns

    def column(self, condition: str, name: str) -> np.ndarray:
        if condition not in self.columns:
            return np.full(len(self.item_ids), np.nan)
        return self.columns[condition][name]

    def present(self, condition: str) -> np.ndarray:
        return ~np.isnan(self.column(condition, "n_tokens"))

    def gain(self, condition: str) -> np.ndarray:
        if condition in GAIN_UNDEFINED:
            raise DataError(f"G is not defined for {condition!r}: {GAIN_UNDEFINED[condition]}")
        return corrective_gain(self.column(REFERENCE, "lp"), self.column(condition, "lp"))

    def gain_correct(self, condition: str) -> np.ndarray:
        """G of the correct action (candidate 1) in the same contexts: the copy control."""
        return corrective_gain(self.column(REFERENCE, "correct_lp"), self.column(condition, "correct_lp"))

    def subset(self, keep: np.ndarray) -> "EnvTable":
        """The same table restricted to the items where `keep` is True."""
        cols = {c: {name: v[keep] for name, v in by.items()} for c, by in self.columns.items()}
        toks = {c: [t for t, k in zip(by, keep) if k] for c, by in self.tokens.items()}
        kinds = tuple(k for k, kept in zip(self.kinds, keep) if kept)
        return EnvTable(self.env, tuple(i for i, k in zip(self.item_ids, keep) if k), cols, toks, kinds)
