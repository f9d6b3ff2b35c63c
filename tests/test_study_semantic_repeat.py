"""The semantic repeat judgement: tools compare calls after argument normalisation, MBPP the failing test outcome."""

from __future__ import annotations

import pytest

from fastscore.study.data.envs.base import Outcome
from fastscore.study.data.envs.mbpp.env import MbppEnv
from fastscore.study.data.envs.tools.env import ToolsEnv
from fastscore.study.data.envs.tools.runtime import same_call, same_call_possible
from fastscore.study.data.items import Item
from fastscore.study.stages.decode import sample_done


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


# Texts that are the same call as FAILED, spelled as Python allows: every start of each must leave the repeat open.
FAILED = 'math.hypot(x=3, y="4")'
SAME_CALLS = [
    FAILED,
    "  math.hypot(y='4', x=3)\n",
    "(math.hypot)(x=3, y='4')",  # a parenthesised function is still the function
    "( math . hypot ) ( x = 3 , y = '4' )",
    "(\n  math.hypot(x=3,\n             y='4')\n)",
    "math.hypot \\\n(x=3, y='4')",  # a line continuation
    "# the call\nmath.hypot(x=3, y='4')",  # a comment before it
    "math.hypot(x=3, y='4')  # done",
    "\u3000math.hypot(x=3, y='4')",  # stripped as whitespace by str.strip
    "\uff4d\uff41\uff54\uff48.hypot(x=3, y='4')",  # fullwidth letters: Python reads identifiers NFKC-normalised
]
ACCENTED = "get_caf\u00e9_menu(day='mon')"
SAME_ACCENTED = ["get_cafe\u0301_menu(day='mon')", "( get_cafe\u0301_menu)(day='mon')"]  # e + combining acute = \u00e9


@pytest.mark.parametrize("text, failed", [(t, FAILED) for t in SAME_CALLS] + [(t, ACCENTED) for t in SAME_ACCENTED])
def test_every_start_of_a_repeat_leaves_the_repeat_open(text, failed):
    assert same_call(text, failed)
    possible = same_call_possible(failed)
    starts = [text[:k] for k in range(1, len(text) + 1)] + [text[:k] + "\ufffd" for k in range(len(text))]
    closed = [head for head in starts if not possible(head)]
    assert closed == []


@pytest.mark.parametrize("head, failed, open_", [
    ("math.hyp", FAILED, True),
    ("math.hypot(x=4", FAILED, True),  # arguments are not judged: another spelling may follow
    ("math.sqrt(", FAILED, False),  # another function
    ("mathx", FAILED, False),
    ("The", FAILED, False),  # prose where the failed action is a call
    ("I will call math.hypot(x=3", FAILED, False),
    ("```python\nmath.hypot(x=3, y='4')", FAILED, False),  # a fence is not part of a call
    ("The answer is", "The answer is  42.", True),  # prose compares with whitespace collapsed
    ("The answer was", "The answer is 42.", False),
    ("f(a=1)", "The answer is 42.", False),
    ("# a comment, then", FAILED, True),
    ("Ma\u00efs # ", FAILED, False),  # the ASCII before a character outside it already rules the name out
    ("The ans\ufffd", "The answer is 42.", True),  # a character the next token completes: left out
    ("The \ufffd ans", "The answer is 42.", True),  # an undecodable byte inside: not judged
    ("get_cafx", ACCENTED, False),
])
def test_a_start_that_rules_out_the_repeat_closes_it(head, failed, open_):
    assert same_call_possible(failed)(head) is open_
    assert ToolsEnv("/nonexistent").may_repeat(item("tools", failed))(head) is open_


def test_mbpp_never_closes_a_repeat_early():
    """Its repeat is judged by running the program: no start of a text rules it out."""
    assert MbppEnv("/nonexistent").may_repeat(item("mbpp", "```python\ndef f(x):\n    return x\n```")) is None


class NoMeaning(ToolsEnv):
    """An environment by which no start can still repeat in meaning."""

    def may_repeat(self, item):
        return lambda head: False


def test_a_sample_stops_once_neither_repeat_is_possible():
    """sample_done: the environment's rule, or a start that rules out the token-for-token repeat (its text leaves
    the emitted action's) and the repeat in meaning (may_repeat)."""
    tools, failed = ToolsEnv("/nonexistent"), item("tools", "f(a=1)")
    done = sample_done(failed, tools, "f(a=1)", None)
    assert not done("f(a=")  # still the emitted action
    assert not done("f( a")  # another spelling of the call may follow
    assert done("The")  # prose: neither
    assert done("g(")  # another function
    assert not done("f(a=1)\ufffd")  # part of a character: not judged
    assert sample_done(failed, tools, "f(a=1)", lambda head: head.endswith("!"))("f(a=1)!")  # the env's rule
    # Where the environment cannot judge a meaning from a start (MBPP runs the program), only its rule stops it.
    program = "```python\ndef f(x):\n    return x\n```"
    assert sample_done(item("mbpp", program), MbppEnv("/nonexistent"), program, None) is None
    # Emitted tokens that end inside a character: a sample that goes on from them may still repeat them token for
    # token (the environment here rules every meaning out, so only that repeat keeps the sample open).
    cut = sample_done(item("tools", "f(a='\u00e9')"), NoMeaning("/nonexistent"), "f(a='\ufffd", None)
    assert not cut("f(a='\u00e9')") and not cut("f(a=")
    assert cut("f(b")
