"""The run-level progress bar: its plan follows the items as they become known, and stage ends settle resumed
items, so the bar's count (and so its ETA) covers every stage still to come."""

from __future__ import annotations

from fastscore.study.stages.progress import RunProgress, SourcePlan

SEEDED = SourcePlan(builds_items=False, sensitivity=False)
ON_POLICY = SourcePlan(builds_items=True, sensitivity=True)


def test_stages_per_item():
    assert SEEDED.stages_per_item == 2  # scoring, greedy decoding
    assert ON_POLICY.stages_per_item == 4  # building, scoring, greedy decoding, sensitivity


def test_plan_is_a_target_until_the_items_are_built():
    bar = RunProgress(enabled=False)
    bar.plan("seeded", 20, SEEDED)
    bar.plan("model", 20, ON_POLICY)
    assert bar.bar.total == 20 * 2 + 20 * 4
    bar.plan("model", 13, ON_POLICY)  # the model failed fewer sources than wanted
    assert bar.bar.total == 20 * 2 + 13 * 4


def test_unknown_counts_take_the_first_built_sources_size():
    bar = RunProgress(enabled=False)
    bar.plan("seeded", 0, SEEDED)
    bar.plan("model", 0, ON_POLICY)
    assert bar.bar.total == 0
    bar.plan("seeded", 30, SEEDED)
    bar.plan_unknown(30)
    assert bar.planned == {"seeded": 60, "model": 120}
    bar.plan_unknown(5)  # nothing unknown is left: no change
    assert bar.bar.total == 180


def test_hook_advances_and_passes_the_call_on():
    calls = []
    bar = RunProgress(enabled=False)
    bar.plan("seeded", 3, SEEDED)
    hook = bar.hook("seeded", lambda stage, item: calls.append((stage, item)))
    hook("score", "a")
    hook("score", "b")
    assert bar.bar.n == 2 and calls == [("score", "a"), ("score", "b")]
    assert RunProgress(enabled=False).hook("seeded", None)("score", "a") is None


def test_settle_counts_items_a_resumed_run_skipped():
    bar = RunProgress(enabled=False)
    bar.plan("seeded", 3, SEEDED)
    hook = bar.hook("seeded", None)
    hook("score", "c")  # a and b were scored before the kill: only c reports
    bar.settle("seeded", 3, 1)
    assert bar.bar.n == 3
    for item in "abc":
        hook("greedy", item)
    bar.settle("seeded", 3, 2)
    assert (bar.bar.n, bar.bar.total) == (6, 6)
