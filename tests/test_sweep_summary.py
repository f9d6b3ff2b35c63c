"""The sweep's cross-model summary on crafted score rows (no model): every share of items carries its Wilson interval
and n, in summary.md and summary.json, and values that hold by construction read 'not applicable'."""

from __future__ import annotations

import json

import pytest

from fastscore.study.analysis.metrics import ScoreRow
from fastscore.sweep import grid
from fastscore.sweep.summary import summarise_cells, write_summary
from fastscore.sweep.worker import shard_dir

N = 20
NEGATIVE = 3  # items whose failed action is more likely after the record (G < 0)
REPEAT_AFTER = 1  # items whose greedy completion after the record is still the failed action
META = {"command": "fastscore sweep --models m", "seed": 0, "limit": N, "shard_size": N, "ran_on": "this process"}


def _row(i: int, condition: str) -> ScoreRow:
    if condition == "ban":  # the failed action is unreachable: lp = -inf, P(repeat) = 0, never greedy
        return ScoreRow(f"t{i:02d}", "tools", "ban", float("-inf"), 5, (float("-inf"), -4.0), (5, 5), 0.0, 0.0,
                        greedy_repeat=False)
    lp = -5.0 if condition == "before" else (-4.5 if i < NEGATIVE else -6.0 - 0.1 * i)
    repeat = True if condition == "before" else i < REPEAT_AFTER
    return ScoreRow(f"t{i:02d}", "tools", condition, lp, 5, (lp, -4.0), (5, 5), 0.4, 0.4, greedy_repeat=repeat)


@pytest.fixture
def swept(tmp_path):
    """Two cells on the same rows, one per failure source, pooled and written as the sweep writes them."""
    cells = [grid.Cell("m", "llamacpp", "f32", "tools", failures) for failures in ("seeded", "model")]
    shards = {cell: grid.shards_of(cell, N, N) for cell in cells}
    for cell_shards in shards.values():
        folder = shard_dir(tmp_path, cell_shards[0])
        folder.mkdir(parents=True)
        rows = [_row(i, c) for i in range(N) for c in ("before", "after", "ban")]
        (folder / "scores.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    result = summarise_cells(tmp_path, shards, {}, cells, seed=0, n_boot=200)
    write_summary(tmp_path, result, META, {})
    stored = {c["failures"]: c["summary"] for c in json.loads((tmp_path / "summary.json").read_text())["cells"]}
    table = (tmp_path / "summary.md").read_text().split("## Results\n\n")[1].split("\n\n")[0].splitlines()
    return stored, {line.split(" | ")[3]: line for line in table[2:]}


def test_shares_of_items_carry_their_wilson_interval_and_n(swept):
    stored, lines = swept
    after = stored["seeded"]["conditions"]["after"]
    # Wilson 95% score intervals: 3/20 -> [0.0524, 0.3604], 1/20 -> [0.0089, 0.2361], 20/20 -> [0.8389, 1].
    assert after["share_negative"] == pytest.approx({"mean": 0.15, "lo": 0.05237, "hi": 0.36042, "n": N,
                                                     "note": "Wilson score interval"}, abs=1e-4)
    assert after["greedy_repeat"] == pytest.approx({"mean": 0.05, "lo": 0.00888, "hi": 0.23613, "n": N,
                                                    "note": "Wilson score interval"}, abs=1e-4)
    before = stored["seeded"]["conditions"]["before"]["greedy_repeat"]
    assert (before["mean"], before["lo"], before["hi"], before["n"]) == pytest.approx((1.0, 0.83887, 1.0, N), abs=1e-4)
    seeded = lines["seeded"]
    assert "| 15% [5%, 36%] (n=20) |" in seeded
    assert "| 100% [84%, 100%] (n=20) → 5% [1%, 24%] (n=20) |" in seeded
    assert seeded.count("(n=20)") >= 5  # G/token and P(repeat) before and after carry theirs too


def test_values_that_hold_by_construction_are_not_applicable_not_measured(swept):
    stored, lines = swept
    # Under the model's own failures the failed action is its greedy completion of `before`: 100% is no finding.
    before = stored["model"]["conditions"]["before"]
    assert "greedy_repeat" not in before
    assert before["not_applicable"]["greedy_repeat"] == "the model's own attempt: by construction"
    assert "| not applicable (the model's own attempt: by construction) → 5% [1%, 24%] (n=20) |" in lines["model"]
    assert "100%" not in lines["model"]
    # The ban makes the failed action unreachable under either source: its zeros are not stored as estimates.
    for failures in ("seeded", "model"):
        ban = stored[failures]["conditions"]["ban"]
        assert "p_repeat" not in ban and "greedy_repeat" not in ban
        assert ban["not_applicable"]["greedy_repeat"] == "0 by construction"
    # The seeded source's greedy outcome before the record is measured, and stays.
    assert "greedy_repeat" in stored["seeded"]["conditions"]["before"]
