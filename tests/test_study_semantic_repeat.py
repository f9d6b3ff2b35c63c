"""The semantic repeat judgement: tools compare calls after argument normalisation, MBPP the failing test outcome."""

from __future__ import annotations

import pytest

from fastscore.study.data.envs.base import Outcome
from fastscore.study.data.envs.mbpp.env import MbppEnv
from fastscore.study.data.envs.tools.env import ToolsEnv
from fastscore.study.data.envs.tools.runtime import same_call
from fastscore.study.data.items import Item


def item(env: str, failed: str) -> Item:
    return Item(env=env, item_id="x", source_id="s1", system="", task="", failed_action=failed, error_message="e",
                failure_kind="k", correct_actions=("c",), candidates=(failed, "c"), description="d")


@pytest.mark.parametrize("a, b, same", [
    ('f(a=1, b="x")', "f( b='x', a=1 )", True),  # argument order, spacing and quoting
    ('f(a={"k": [1, 2]})', 'f(a={"k":[1,2]})', True),
    ("f(a=1)", "f(a=True)", False),  # a wrong-type mutation is another call
    ("f(a=1)", "f(a=1.0)", False),
    ("f(a=1)", "g(a=1)", False),
    ("f(a=1)", "f(a=1, b=2)", False),
    ("The answer is  42.", "The answer is 42.", True),  # prose: whitespace collapsed
    ("The answer is 42.", "f(a=42)", False),
])
def test_tool_calls_compare_after_argument_normalisation(a, b, same):
    assert same_call(a, b) is same
    assert ToolsEnv("/nonexistent").repeats_failure(item("tools", b), a) is same


def test_mbpp_repeat_is_the_same_failing_test_outcome():
    env = MbppEnv("/nonexistent")
    failed = "```python\ndef f(x):\n    return x - 1\n```"
    # Instrumented: the verdicts the sandbox would give, in the environment's own cache (no program is run).
    env._outcomes = {
        ("s1", failed): Outcome(False, "AssertionError: f(2) == 3", "failed"),
        ("s1", "same failure, other text"): Outcome(False, "AssertionError: f(2) == 3", "failed"),
        ("s1", "another failure"): Outcome(False, "NameError: name 'g' is not defined", "error"),
        ("s1", "passes"): Outcome(True, "passed", "passed"),
    }
    assert env.repeats_failure(item("mbpp", failed), failed)
    assert env.repeats_failure(item("mbpp", failed), "same failure, other text")
    assert not env.repeats_failure(item("mbpp", failed), "another failure")
    assert not env.repeats_failure(item("mbpp", failed), "passes")
