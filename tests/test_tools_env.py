"""The tools environment on the real BFCL files (read by path) and on small crafted files in tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastscore.errors import DataError
from fastscore.study.data.items import Item
from fastscore.study.data.envs.tools.prose import SEEDED_KINDS
from fastscore.study.data.envs.tools.runtime import ToolRuntime
from fastscore.records import Message
from fastscore.study.data.conditions import RECORD_CONDITIONS, record_messages
from fastscore.study.data.envs.tools.env import (
    DONT_REPEAT_INSTRUCTION, NEUTRAL_MESSAGE, RECORD_ROLE, ToolsEnv, build_items, evaluate, item_from_failure,
    load_sources,
)

AREA = {"name": "calculate_area", "description": "Area of a rectangle.", "parameters": {
    "type": "dict", "properties": {"width": {"type": "integer", "description": "The width."},
                                   "height": {"type": "integer", "description": "The height."}},
    "required": ["width", "height"]}}


def _record(source_id, ground_truth):
    question = {"id": source_id, "question": [[{"role": "user", "content": "Area of a 3 by 4 rectangle?"}]],
                "function": [AREA]}
    return question, {"id": source_id, "ground_truth": ground_truth}


def _write(data_dir: Path, records_by_set: dict[str, list]) -> Path:
    (data_dir / "bfcl" / "possible_answer").mkdir(parents=True)
    for name in ("BFCL_v4_simple_python", "BFCL_v4_multiple"):
        records = records_by_set.get(name, [])
        (data_dir / "bfcl" / f"{name}.json").write_text("\n".join(json.dumps(q) for q, _ in records))
        answers = "\n".join(json.dumps(a) for _, a in records)
        (data_dir / "bfcl" / "possible_answer" / f"{name}.json").write_text(answers)
    return data_dir


GOOD = {"calculate_area": {"width": [3], "height": [4]}}


@pytest.fixture(scope="module")
def real_sources(study_data):
    return {s.source_id: s for s in load_sources(study_data)}


@pytest.fixture(scope="module")
def items30(study_data):
    return build_items(study_data, limit=30, seed=0)


def test_real_items_are_well_formed(items30, real_sources):
    items, skipped = items30
    assert len(items) == 30
    assert len({i.item_id for i in items}) == 30
    for item in items:
        source = real_sources[item.source_id]
        runtime = ToolRuntime(source.functions)
        failed = runtime.execute(item.failed_action)
        assert not failed.ok and failed.error == item.error_message
        truth = item.correct_actions[0]
        assert runtime.execute(truth).ok and evaluate(source, truth).ok
        assert item.candidates[0] == item.failed_action and item.candidates[1] == truth
        assert len(item.candidates) == 4 and len(set(item.candidates)) == 4
        assert all(not runtime.execute(c).ok for c in item.candidates[2:])
        assert item.failure_kind in SEEDED_KINDS
        assert item.failed_action not in item.description and truth not in item.description
        assert item.task == source.question and "Respond with exactly one call in the form" in item.system
        assert Item.from_json(item.to_json()) == item


def test_every_real_record_yields_a_valid_item_or_a_reasoned_skip(study_data):
    items, skipped = build_items(study_data, limit=None, seed=3)
    assert len(items) + len(skipped) == 600
    assert all(s.reason for s in skipped)
    for item in items:
        assert item.failure_kind != "ground_truth"
        assert len(set(item.candidates)) == len(item.candidates) >= 3
    kinds = {i.failure_kind for i in items}
    assert kinds == set(SEEDED_KINDS), kinds  # every kind occurs somewhere in the real data
    print(f"items {len(items)}, skipped {len(skipped)}")


def test_items_are_deterministic_and_depend_on_the_seed(items30, study_data):
    again, _ = build_items(study_data, limit=30, seed=0)
    assert [i.to_json() for i in again] == [i.to_json() for i in items30[0]]
    other, _ = build_items(study_data, limit=30, seed=1)
    assert [i.item_id for i in other] != [i.item_id for i in again]
    # an item's mutations depend on the seed and its source id only, not on which other items were built
    first5, _ = build_items(study_data, limit=5, seed=0)
    assert [i.to_json() for i in first5] == [i.to_json() for i in again[:5]]


def test_unusable_records_are_skipped_with_a_reason(tmp_path):
    two_calls = [GOOD, GOOD]
    data = _write(tmp_path, {"BFCL_v4_simple_python": [_record("simple_python_0", [GOOD]),
                                                      _record("simple_python_1", two_calls),
                                                      _record("simple_python_2", [{"no_such_tool": {}}])]})
    items, skipped = build_items(data, limit=None, seed=0)
    assert [i.source_id for i in items] == ["simple_python_0"]
    reasons = {s.source_id: s.reason for s in skipped}
    assert "2 calls" in reasons["simple_python_1"]
    assert "not among the tools" in reasons["simple_python_2"]
    assert items[0].correct_actions == ("calculate_area(width=3, height=4)",)


def test_missing_file_raises_data_error_with_the_path(tmp_path):
    with pytest.raises(DataError, match="possible_answer"):
        load_sources(tmp_path)


def test_malformed_line_raises_data_error_naming_the_line(tmp_path):
    data = _write(tmp_path, {"BFCL_v4_multiple": [_record("multiple_0", [GOOD])]})
    path = data / "bfcl" / "BFCL_v4_multiple.json"
    path.write_text(path.read_text() + "\n{not json")
    with pytest.raises(DataError, match=r"BFCL_v4_multiple\.json: line 2: invalid JSON"):
        load_sources(data)


def test_question_without_answer_raises_data_error(tmp_path):
    data = _write(tmp_path, {"BFCL_v4_simple_python": [_record("simple_python_0", [GOOD])]})
    (data / "bfcl" / "possible_answer" / "BFCL_v4_simple_python.json").write_text(
        json.dumps({"id": "other", "ground_truth": [GOOD]}))
    with pytest.raises(DataError, match="line 1: id 'simple_python_0' has no possible answer"):
        load_sources(data)


def test_record_messages_for_every_condition(tmp_path):
    data = _write(tmp_path, {"BFCL_v4_simple_python": [_record("simple_python_0", [GOOD])]})
    env = ToolsEnv(data)
    item = env.build_items(limit=None, seed=0)[0][0]
    assert env.context_messages(item) == (Message("system", item.system), Message("user", item.task))
    after = record_messages(env, item, "after")
    assert after == (Message("assistant", item.failed_action), Message(RECORD_ROLE, item.error_message))
    success = record_messages(env, item, "success")
    assert success[0] == after[0] and success[1].content.startswith("OK: ")
    assert '{"status": "success"}' in success[1].content
    assert record_messages(env, item, "neutral") == (after[0], Message(RECORD_ROLE, NEUTRAL_MESSAGE))
    assert record_messages(env, item, "description") == (Message(RECORD_ROLE, item.description),)
    dont = record_messages(env, item, "dont_repeat")
    assert dont[0] == after[0] and dont[1].content == f"{item.error_message}\n{DONT_REPEAT_INSTRUCTION}"
    assert set(RECORD_CONDITIONS) == {"after", "success", "neutral", "description", "dont_repeat"}
    with pytest.raises(ValueError):
        record_messages(env, item, "before")


def test_evaluate_and_on_policy_items(tmp_path):
    data = _write(tmp_path, {"BFCL_v4_simple_python": [_record("simple_python_0", [GOOD])]})
    source = load_sources(data)[0]
    assert evaluate(source, "calculate_area(width=3, height=4)").ok
    wrong = evaluate(source, "calculate_area(width=4, height=3)")
    assert wrong.kind == "wrong_answer" and "argument 'width' has an unexpected value 4" in wrong.error
    rejected = evaluate(source, "calculate_area(width=3)")
    assert rejected.kind == "missing_required"

    # An accepted call that is the wrong answer gets no runtime error (a real runtime returns its result): excluded.
    with pytest.raises(ValueError, match="no runtime error"):
        item_from_failure(source, "calculate_area(width=4, height=3)", wrong, seed=0)
    for action in ("calculate_area(width=3)", "The area is 12."):
        outcome = evaluate(source, action)
        item = item_from_failure(source, action, outcome, seed=0)
        assert item.failure_kind == "model" and item.error_message == outcome.error
        assert item.candidates[:2] == (action, "calculate_area(width=3, height=4)"), item.candidates
        assert len(set(item.candidates)) == len(item.candidates) == 4
        assert action not in item.description
        assert item.item_id == "tools:simple_python_0:model"
    with pytest.raises(ValueError):
        item_from_failure(source, "calculate_area(width=3, height=4)", wrong, seed=0)


def test_the_environment_contract_wraps_the_runtime(tmp_path):
    data = _write(tmp_path, {"BFCL_v4_simple_python": [_record("simple_python_0", [GOOD])]})
    env = ToolsEnv(data)
    judged = env.evaluate("simple_python_0", "calculate_area(width=4, height=3)")
    assert not judged.ok and judged.kind == "wrong_answer" and "unexpected value 4" in judged.message
    assert env.evaluate("simple_python_0", "calculate_area(width=3, height=4)").ok
    made = env.item_from_failure("simple_python_0", "The area is 12.",
                                 env.evaluate("simple_python_0", "The area is 12."), seed=0)
    assert made.failure_kind == "model" and made.source_id == "simple_python_0"
    assert env.same_action(" calculate_area(width=3) \n", "calculate_area(width=3)")
    assert not env.same_action("calculate_area(width=4)", "calculate_area(width=3)")
