"""The committed-items quant report's arithmetic on crafted items: where a type moves G (before or after the
record), how many items keep G > 0, and sign agreement per margin bin as counts, per (source, environment)."""

from __future__ import annotations

import numpy as np

from fastscore.records import CandidateSet, Message, ScoreRequest
from fastscore.study.quantcheck.committed import CommittedItem, CommittedScores
from fastscore.study.quantcheck.committed_report import compare_group, render_markdown, summarize


def item(env: str, lp_before: float, lp_after: float, n_tokens: int) -> CommittedItem:
    request = ScoreRequest(id="r", messages=(Message("user", "x"),), continuation="y")
    return CommittedItem(source="model", env=env, shard=f"model/{env}/00000", item_id=f"{env}-{lp_before}",
                         before=request, after=CandidateSet(id="r", messages=request.messages, candidates=("y",)),
                         lp_before=lp_before, lp_after=lp_after, n_tokens=n_tokens, argmax_after=0,
                         action_tokens=((1,), (1,)))


# Committed G: tools +3.0, +1.0, -4.0, -0.2; mbpp -2.5 (the record makes two tools items' failed action less likely).
ITEMS = [item("tools", -5.0, -8.0, 2), item("tools", -6.0, -7.0, 1), item("tools", -9.0, -5.0, 4),
         item("tools", -3.0, -2.8, 2), item("mbpp", -4.0, -1.5, 5)]
# The variant lowers every tools lp under before by 1 nat per token and leaves after alone, so G falls by n_tokens
# nats: the +1.0 item goes to 0 (its sign changes), +3.0 stays positive (3 - 2 = +1). On mbpp it moves only after,
# up by 0.2 nats per token (G -2.5 -> -3.5).
VARIANT = CommittedScores("llamacpp:q4_0", "crafted",
                          lp_before=np.array([-7.0, -7.0, -13.0, -5.0, -4.0]),
                          lp_after=np.array([-8.0, -7.0, -5.0, -2.8, -0.5]), argmax_after=np.zeros(5, dtype=int))
IDX = np.random.default_rng(0).integers(0, 4, size=(200, 4))


def test_a_type_that_moves_only_lp_before_shows_it_and_the_items_it_takes_off_g_above_zero():
    tools = np.array([i.env == "tools" for i in ITEMS])
    c = compare_group(ITEMS, VARIANT, tools, IDX)
    assert c["n"] == 4
    assert c["shift_lp_before_per_token"]["mean"] == -1.0
    assert c["shift_lp_after_per_token"]["mean"] == 0.0
    assert c["shift_gain_per_token"]["mean"] == -1.0  # before's shift minus after's
    assert (c["n_positive_committed"], c["n_positive_variant"]) == (2, 1)
    # |G| bins [0, 0.5), [0.5, 2), [2, inf): -0.2 keeps its sign; +1.0 -> 0.0 does not; +3.0 and -4.0 keep theirs.
    assert [(b["n_agree"], b["n"]) for b in c["sign_agreement_by_margin"]] == [(1, 1), (0, 1), (2, 2)]


def test_a_group_is_compared_on_its_own_items_only():
    mbpp = np.array([i.env == "mbpp" for i in ITEMS])
    c = compare_group(ITEMS, VARIANT, mbpp, np.zeros((10, 1), dtype=int))
    assert c["n"] == 1
    assert c["shift_lp_before_per_token"]["mean"] == 0.0
    assert np.isclose(c["shift_lp_after_per_token"]["mean"], 0.2)
    assert np.isclose(c["shift_gain_per_token"]["mean"], -0.2)
    assert (c["n_positive_committed"], c["n_positive_variant"]) == (0, 0)
    assert [(b.get("n_agree"), b["n"]) for b in c["sign_agreement_by_margin"]] == [(None, 0), (None, 0), (1, 1)]


def test_the_markdown_shows_the_split_the_items_above_zero_and_bin_counts():
    class Config:
        command, run_dir, model, sample, seed, n_boot = "fastscore bench quant --run RUN", "RUN", "m", None, 0, 50

    summary = summarize(ITEMS, {"llamacpp:q4_0": VARIANT}, {"model": "m", "backend": "llamacpp", "quant": "f32"},
                        Config)
    rows = {line.split(" | ")[1]: line for line in render_markdown(summary).splitlines()
            if line.startswith("| llamacpp:q4_0 |")}
    assert "| -1.0000; +0.0000 | 1/1, 0/1, 2/2 | 2 → 1 |" in rows["model/tools"]
    assert "| +0.0000; +0.2000 | none, none, 1/1 | 0 → 0 |" in rows["model/mbpp"]
    assert "| 1/1, 0/1, 3/3 | 2 → 1 |" in rows["all"]
