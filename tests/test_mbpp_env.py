"""The MBPP environment builds items whose failed programs really fail, deterministically, as minimal text edits."""

from __future__ import annotations

import ast
import json
import random
import re
import warnings
from pathlib import Path

import pytest

from fastscore.errors import DataError
from fastscore.study.data.items import Item, Skipped
from fastscore.records import Message
from fastscore.study.data.conditions import record_messages
from fastscore.study.data.envs.mbpp.env import (
    MbppEnv,
    build_items,
    evaluate,
    extract_program,
    format_program,
    item_from_failure,
    load_sources,
)
from fastscore.study.data.envs.mbpp.mutations import KINDS, all_mutants
from fastscore.study.data.envs.mbpp.sandbox import use_isolation
from sandbox_helpers import rlimits_python

FENCED = re.compile(r"\A```python\n(?:[^\n]*[^\s\n][^\n]*\n|\n)*```\Z")

TASKS = [
    {"task_id": 11, "text": "Write a function to add one to a number.",
     "code": "def add_one(x):  \r\n    return x + 1\r\n",
     "test_list": ["assert add_one(1) == 2", "assert add_one(-1) == 0", "assert add_one(41) == 42"]},
    {"task_id": 12, "text": "Write a function to count the even numbers in a list.",
     "code": "def count_evens(xs):\n    n = 0\n    for x in xs:\n        if x % 2 == 0:\n            n += 1\n    return n",
     "test_list": ["assert count_evens([1, 2, 4]) == 2", "assert count_evens([]) == 0", "assert count_evens([3]) == 0"]},
    {"task_id": 13, "text": "Write a function to return the last but one element of a list.",
     "code": "def second_last(xs):\n    i = len(xs) - 2\n    return xs[i]",
     "test_list": ["assert second_last([1, 2, 3]) == 2", "assert second_last([5, 6]) == 5", "assert second_last('abc') == 'b'"]},
    {"task_id": 14, "text": "Write a function to double a number.",
     "code": "def double(x):\n    return x * 3",  # a reference that fails its own tests
     "test_list": ["assert double(2) == 4", "assert double(0) == 0", "assert double(5) == 10"]},
    {"task_id": 15, "text": "Write a function to return its argument.",
     "code": "def ident(x):\n    return x",  # nothing to mutate
     "test_list": ["assert ident(1) == 1", "assert ident('a') == 'a'", "assert ident(None) is None"]},
]  # fmt: skip


def write_tasks(directory: Path, tasks: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [{"test_setup_code": "", "challenge_test_list": [], **t} for t in tasks]
    (directory / "mbpp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    data_dir = write_tasks(tmp_path_factory.mktemp("mbpp"), TASKS)
    items, skipped = build_items(data_dir, limit=10, seed=3)
    return data_dir, items, skipped


@pytest.fixture(scope="module")
def real(study_data):
    items, skipped = build_items(study_data, limit=6, seed=0)
    sources = {str(s.task_id): s for s in load_sources(study_data)}
    return items, skipped, sources


def test_missing_file_raises_data_error_naming_the_path(tmp_path):
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "mbpp.jsonl"))):
        load_sources(tmp_path)


def test_malformed_line_raises_data_error_naming_the_line(tmp_path):
    good = json.dumps({**TASKS[0], "test_setup_code": ""})
    (tmp_path / "mbpp.jsonl").write_text(good + "\n{not json\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 2"):
        load_sources(tmp_path)
    (tmp_path / "mbpp.jsonl").write_text(good + "\n" + json.dumps({"task_id": 2, "text": "x"}) + "\n")
    with pytest.raises(DataError, match=r"line 2: field 'code'"):
        load_sources(tmp_path)


def test_unusable_tasks_are_skipped_with_reasons(synthetic):
    _, items, skipped = synthetic
    assert sorted(i.source_id for i in items) == ["11", "12", "13"]
    reasons = {s.source_id: s.reason for s in skipped}
    assert set(reasons) == {"14", "15"}
    assert "does not pass its tests" in reasons["14"]
    assert "no mutation site" in reasons["15"]
    assert all(isinstance(s, Skipped) and s.env == "mbpp" for s in skipped)


def test_item_layout_and_action_format(synthetic):
    _, items, _ = synthetic
    for item in items:
        assert item.env == "mbpp" and item.item_id == f"mbpp-{item.source_id}"
        assert item.failure_kind in KINDS
        assert item.candidates[0] == item.failed_action and item.candidates[1] == item.correct_actions[0]
        assert len(set(item.candidates)) == len(item.candidates) <= 4
        for candidate in item.candidates:
            assert FENCED.match(candidate), candidate
            assert "\r" not in candidate
        assert "Your code should pass these tests:\nassert " in item.task
        assert "```python" in item.system
        assert Item.from_json(item.to_json()) == item
    add_one = next(i for i in items if i.source_id == "11")
    assert add_one.correct_actions == ("```python\ndef add_one(x):\n    return x + 1\n```",)


def test_every_built_candidate_really_fails_or_passes_when_run(real):
    items, _, sources = real
    assert len(items) == 6
    for item in items:
        source = sources[item.source_id]
        outcomes = [evaluate(source, c) for c in item.candidates]
        assert outcomes[1].passed, (item.item_id, outcomes[1])
        assert not any(o.passed for i, o in enumerate(outcomes) if i != 1), (item.item_id, outcomes)
        assert outcomes[0].message == item.error_message
        assert item.error_message.startswith(("AssertionError: assert ", "Timeout: ")) or ": " in item.error_message


def test_mutants_differ_from_the_reference_only_at_the_mutated_span(real, synthetic):
    items = real[0] + synthetic[1]
    for item in items:
        reference = extract_program(item.correct_actions[0])
        mutant = extract_program(item.failed_action)
        edit = item.meta["mutation"]
        start, end = edit["start"], edit["end"]
        assert reference[start:end] == edit["original"]
        assert mutant == reference[:start] + edit["replacement"] + reference[end:]
        assert edit["replacement"] != edit["original"]
    # The same holds for every proposed mutant of real references, not only the ones that became items.
    for source in list(real[2].values())[:60]:
        reference = source.reference
        for m in all_mutants(reference, random.Random(0)):
            assert m.text == reference[: m.start] + m.replacement + reference[m.end :]
            assert m.text != reference
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # old MBPP solutions use invalid string escapes like "\w"
                ast.parse(m.text)


def test_builds_are_deterministic_and_independent_of_the_other_tasks(synthetic, tmp_path):
    data_dir, items, skipped = synthetic
    again, skipped_again = build_items(data_dir, limit=10, seed=3)
    assert [i.to_json() for i in again] == [i.to_json() for i in items]
    assert skipped_again == skipped
    alone, _ = build_items(write_tasks(tmp_path / "one", [TASKS[1]]), limit=1, seed=3)
    assert alone[0].to_json() == next(i for i in items if i.source_id == "12").to_json()
    other_seed, _ = build_items(data_dir, limit=10, seed=4)
    assert {i.source_id for i in other_seed} == {i.source_id for i in items}
    assert [i.candidates for i in other_seed] != [i.candidates for i in items]


def test_limit_takes_a_seeded_prefix(real, study_data):
    items, _, _ = real
    fewer, _ = build_items(study_data, limit=3, seed=0)
    assert [i.to_json() for i in fewer] == [i.to_json() for i in items[:3]]


def test_description_does_not_quote_the_program(real, synthetic):
    for item in real[0] + synthetic[1]:
        mutant = extract_program(item.failed_action)
        reference_lines = extract_program(item.correct_actions[0]).split("\n")
        changed_line = next(a for a, b in zip(mutant.split("\n"), reference_lines) if a != b)
        assert changed_line.strip() not in item.description
        assert mutant not in item.description
        target = len(item.failed_action) + len(item.error_message)
        print(item.item_id, len(item.description), target)
        assert 0.4 * target <= len(item.description) <= 2.5 * target


def test_record_messages(synthetic):
    data_dir, items, _ = synthetic
    env, item = MbppEnv(data_dir), items[0]
    assert env.context_messages(item) == (Message("system", item.system), Message("user", item.task))
    after = record_messages(env, item, "after")
    assert after == (
        Message("assistant", item.failed_action),
        Message("user", f"Running the tests failed:\n{item.error_message}"),
    )
    assert record_messages(env, item, "success")[1].content == "All tests passed."
    assert record_messages(env, item, "neutral")[1].content == "Program received."
    assert record_messages(env, item, "description") == (Message("user", item.description),)
    dont = record_messages(env, item, "dont_repeat")
    assert dont[0] == after[0]
    assert dont[1].content == f"{after[1].content}\n\nDo not repeat the failed program."
    with pytest.raises(ValueError):
        record_messages(env, item, "unknown")


def test_extract_program_handles_fenced_raw_and_truncated_answers():
    code = "def f(x):\n    return x"
    assert extract_program(format_program(code)) == code
    assert extract_program(f"Here you go:\r\n```python\r\n{code}   \r\n```\r\nDone.") == code
    assert extract_program(f"```\n{code}\n```") == code
    assert extract_program(f"```text\nnot this\n```\n```py\n{code}\n```") == code
    assert extract_program(code + "\n\n") == code
    assert extract_program(f"```python\n{code}") == code  # cut off before the closing fence


def test_on_policy_failure_becomes_a_model_item(synthetic):
    data_dir, _, _ = synthetic
    source = next(s for s in load_sources(data_dir) if s.task_id == 12)
    answer = "Sure!\n```python\ndef count_evens(xs):\n    return len(xs)\n```"
    outcome = evaluate(source, answer)
    assert outcome.status == "failed" and outcome.message == "AssertionError: assert count_evens([1, 2, 4]) == 2"
    item = item_from_failure(source, answer, outcome, seed=3)
    assert item.failure_kind == "model"
    # The model's answer as given (emitted up to the harness's cut), not re-rendered; judged by its program.
    assert item.failed_action == answer
    assert MbppEnv(data_dir).same_action(format_program("def count_evens(xs):\n    return len(xs)"), answer)
    assert item.candidates[:2] == (answer, format_program(source.code))
    assert item.error_message == outcome.message
    assert all(not evaluate(source, c).passed for i, c in enumerate(item.candidates) if i != 1)
    assert evaluate(source, format_program(source.code)).passed
    with pytest.raises(ValueError):
        item_from_failure(source, format_program(source.code), evaluate(source, source.code), seed=3)


def test_the_environment_contract_judges_programs(synthetic):
    data_dir, items, _ = synthetic
    env = MbppEnv(data_dir)
    item = items[0]
    failed = env.evaluate(item.source_id, item.failed_action)
    assert not failed.ok and failed.message == item.error_message
    assert env.evaluate(item.source_id, item.correct_actions[0]).ok
    assert env.same_action("Here:\n" + item.failed_action + "\nDone.", item.failed_action)
    assert not env.same_action(item.correct_actions[0], item.failed_action)
    assert env.build_items(limit=10, seed=3) == (items, synthetic[2])


def test_a_model_answer_that_games_the_tests_is_not_a_success(synthetic):
    data_dir, _, _ = synthetic
    source = next(s for s in load_sources(data_dir) if s.task_id == 12)
    always_equal = "class Yes(int):\n    def __eq__(self, other):\n        return True\n" \
                   "def count_evens(xs):\n    return Yes(-1)"  # fmt: skip
    forged_report = "import os, sys\nos.write(int(sys.argv[2]), b'{\"done\": \"x\"}\\n')\nos._exit(0)"
    for program in (always_equal, forged_report):
        outcome = evaluate(source, format_program(program))
        assert not outcome.passed and outcome.status in ("failed", "crash"), outcome


def test_items_are_the_same_under_either_isolation(synthetic):
    data_dir, items, skipped = synthetic
    with rlimits_python(), use_isolation("rlimits"):
        again, skipped_again = build_items(data_dir, limit=10, seed=3)
    assert [i.to_json() for i in again] == [i.to_json() for i in items]
    assert skipped_again == skipped


def test_a_closed_python_block_fixes_the_program_whatever_follows(tmp_path):
    """The MBPP stop rule: once program_written holds for a prefix of an answer, it holds for every longer prefix
    and the program extracted from it is the whole answer's."""
    from fastscore.study.data.envs.mbpp.env import program_written
    from fastscore.study.data.envs.tools.env import ToolsEnv

    answers = [
        "Sure:\n```text\nnot code\n```\n```py\ndef f(x):\n    return x\n```\nThen:\n```python\nother = 1\n```\nok",
        "```python\ndef f(x):\n    return x\n   ```\n\n```python\nnot this\n```",
        "```\ndef f(x):\n    return x\n```\nand ```python\ndef g():\n    pass\n```",  # an unlabelled block first
        "```python\n```\ndef f(x):\n    return x\n```",  # an empty-looking opening is not a closed block
    ]
    for answer in answers:
        first = next(k for k in range(len(answer) + 1) if program_written(answer[:k]))
        assert all(program_written(answer[:k]) for k in range(first, len(answer) + 1)), answer
        assert all(extract_program(answer[:k]) == extract_program(answer) for k in range(first, len(answer) + 1))
        assert answer[:first].endswith("```")
    assert not program_written("```text\nx\n```") and not program_written("```python\nx = 1\n")
    assert not program_written("```python\n```")
    env = MbppEnv(tmp_path)
    assert env.action_done() is program_written and ToolsEnv(tmp_path).action_done() is None
    assert env.finished_action("```python\nx = 1\n```\n", "action_done")
