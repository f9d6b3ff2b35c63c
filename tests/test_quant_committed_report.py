"""The committed-items quant report's arithmetic on crafted items: where a type moves G (before or after the
record), how many items keep G > 0, and sign agreement per margin bin as counts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastscore.study.quantcheck.committed import CommittedScores
from fastscore.study.quantcheck.committed_report import compare_group, render_markdown, summarize


@dataclass(frozen=True)
class Item:
    lp_before: float
    lp_after: float
    n_tokens: int
    argmax_after: int = 0
    source: str = "model"
    env: str = "tools"

    @property
    def gain(self) -> float:
        return self.lp_before - self.lp_after

    @property
    def group(self) -> str:
        return f"{self.source}/{self.env}"


# Committed G: +3.0, +1.0, -4.0, -0.2 (two items where the record lowers the failed action's log-prob).
ITEMS = [Item(-5.0, -8.0, 2), Item(-6.0, -7.0, 1), Item(-9.0, -5.0, 4), Item(-3.0, -2.8, 2)]
# The variant lowers every lp under before by 1 nat per token and leaves after alone: G falls by n_tokens nats,
# which takes the +1.0 item to 0 (its sign changes) and keeps +3.0 positive (3 - 2 = +1).
VARIANT = CommittedScores("llamacpp:q4_0", "crafted",
                          lp_before=np.array([-7.0, -7.0, -13.0, -5.0]), lp_after=np.array([-8.0, -7.0, -5.0, -2.8]),
                          argmax_after=np.zeros(4, dtype=int))


def test_a_type_that_moves_only_lp_before_shows_it_and_the_items_it_turns_negative():
    idx = np.random.default_rng(0).integers(0, 4, size=(200, 4))
    c = compare_group(ITEMS, VARIANT, np.ones(4, dtype=bool), idx)
    print(c["shift_lp_before_per_token"], c["shift_lp_after_per_token"], c["shift_gain_per_token"])
    assert c["shift_lp_before_per_token"]["mean"] == -1.0
    assert c["shift_lp_after_per_token"]["mean"] == 0.0
    assert c["shift_gain_per_token"]["mean"] == -1.0  # before's shift minus after's
    assert (c["n_positive_committed"], c["n_positive_variant"]) == (2, 1)
    # |G| bins [0, 0.5), [0.5, 2), [2, inf): -0.2 keeps its sign; +1.0 -> 0.0 does not; +3.0 and -4.0 keep theirs.
    assert [(b["n_agree"], b["n"]) for b in c["sign_agreement_by_margin"]] == [(1, 1), (0, 1), (2, 2)]


def test_the_markdown_shows_the_split_the_positive_items_and_bin_counts():
    class Config:
        command, run_dir, model, sample, seed, n_boot = "fastscore bench quant --run RUN", "RUN", "m", None, 0, 50

    summary = summarize(ITEMS, {"llamacpp:q4_0": VARIANT}, {"model": "m", "backend": "llamacpp", "quant": "f32"},
                        Config)
    text = render_markdown(summary)
    row = next(line for line in text.splitlines() if line.startswith("| llamacpp:q4_0 | all |"))
    print(row)
    assert "| -1.0000; +0.0000 |" in row
    assert "| 1/1, 0/1, 2/2 |" in row
    assert "| 2 → 1 |" in row
