"""Description redaction: a description that would quote the failed action's distinctive substrings gets a marker in
their place and the item is kept; the error record stays what the runtime or the tests printed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fastscore.study.data.hygiene import REDACTED, check_description, quoted, redact

sys.path.insert(0, str(Path(__file__).parent))
from test_mbpp_env import TASKS, write_tasks  # noqa: E402
from test_tools_env import AREA  # noqa: E402

FAILED = "def total(nums):\n    return sum(nums) - 1"
CORRECT = "def total(xs):\n    return sum(xs)"
CONTEXT = "Write a function total that sums a list."


def test_redacts_the_verbatim_action_then_its_lines_then_its_names_whole_word():
    description = (f"Your program was:\n{FAILED}\nIts last line `return sum(nums) - 1` used nums; numsx and "
                   "_nums are other words, and total is the task's own name.")
    assert quoted(description, FAILED, CORRECT, CONTEXT) == [FAILED, "def total(nums):", "return sum(nums) - 1", "nums"]
    text, count = redact(description, FAILED, CORRECT, CONTEXT)
    assert text == (f"Your program was:\n{REDACTED}\nIts last line `{REDACTED}` used {REDACTED}; numsx and _nums are "
                    "other words, and total is the task's own name.")
    assert count == 3  # the program, the line, the name: a line is replaced whole, not name by name
    check_description(text, FAILED, CORRECT, CONTEXT)


def test_a_description_that_quotes_nothing_is_left_as_it_is():
    description = "It raised a NameError while running the test `assert total([1]) == 1`."
    assert redact(description, FAILED, CORRECT, CONTEXT) == (description, 0)


def test_a_name_exposed_by_removing_a_shorter_line_is_redacted_in_a_further_pass():
    failed, correct = "y = 0\nx=1\nfoobarbaz(y)", "y = 0"
    description = "It wrote foobarbazx=1."
    assert quoted(description, failed, correct, "") == ["x=1"]  # `foobarbazx` is not the name `foobarbaz`...
    text, count = redact(description, failed, correct, "")
    assert text == f"It wrote {REDACTED}{REDACTED}." and count == 2  # ... until the line after it is gone
    check_description(text, failed, correct, "")


def test_a_substring_the_marker_contains_cannot_be_redacted_and_the_guard_still_fails():
    failed, correct = f"x = 1\n{REDACTED}", "x = 1"
    text, _ = redact(f"It printed {REDACTED}.", failed, correct, "")
    with pytest.raises(ValueError, match="would quote"):
        check_description(text, failed, correct, "")


@pytest.fixture()
def mbpp_source(tmp_path):
    from fastscore.study.data.envs.mbpp.env import load_sources

    data_dir = write_tasks(tmp_path / "mbpp", TASKS)
    return next(s for s in load_sources(data_dir) if s.task_id == 12)  # count_evens(xs)


def test_an_mbpp_model_program_whose_names_the_outline_would_quote_is_kept_redacted(mbpp_source):
    from fastscore.study.data.envs.mbpp.describe import describe_failure
    from fastscore.study.data.envs.mbpp.env import SYSTEM_PROMPT, evaluate, format_program, item_from_failure

    # The model's own names: a parameter `nums` (the outline names it) and an undefined `total` (the error names it).
    answer = "```python\ndef count_evens(nums):\n    return total\n```"
    outcome = evaluate(mbpp_source, answer)
    assert outcome.status == "error" and outcome.message.startswith("NameError: name 'total' is not defined")
    item = item_from_failure(mbpp_source, answer, outcome, seed=3)
    failed, reference = item.failed_action, format_program(mbpp_source.code)
    context = SYSTEM_PROMPT + "\n" + item.task
    raw = describe_failure("def count_evens(nums):\n    return total", outcome, mbpp_source.tests,
                           len(failed) + len(outcome.message))
    with pytest.raises(ValueError, match="nums"):  # the old rule: this item was skipped
        check_description(raw, failed, reference, context)
    assert f"`count_evens({REDACTED})`" in item.description and "nums" not in item.description
    assert item.meta["description_redacted"] == raw.count("nums") >= 1
    assert item.description == raw.replace("(nums)", f"({REDACTED})")  # nothing else was touched
    assert quoted(item.description, failed, reference, context) == []
    assert item.error_message == outcome.message  # the error record: verbatim, with the model's own name


def _tools_data(tmp_path: Path) -> Path:
    (tmp_path / "bfcl" / "possible_answer").mkdir(parents=True)
    question = {"id": "simple_python_0", "function": [AREA],
                "question": [[{"role": "user", "content": "Area of a 3 by 4 rectangle?"}]]}
    answer = {"id": "simple_python_0", "ground_truth": [{"calculate_area": {"width": [3], "height": [4]}}]}
    for name in ("BFCL_v4_simple_python", "BFCL_v4_multiple"):
        first = name == "BFCL_v4_simple_python"
        (tmp_path / "bfcl" / f"{name}.json").write_text(json.dumps(question) if first else "")
        (tmp_path / "bfcl" / "possible_answer" / f"{name}.json").write_text(json.dumps(answer) if first else "")
    return tmp_path


def test_a_tools_answer_in_prose_keeps_the_words_the_description_always_uses(tmp_path):
    from fastscore.study.data.envs.tools.describe import WORDING
    from fastscore.study.data.envs.tools.env import ToolsEnv, system_prompt

    env = ToolsEnv(_tools_data(tmp_path))
    # Prose that shares "Your" and "not" with the runtime's fixed wording: those are not quotes of it, and redacting
    # them would turn "was not a well-formed single call" into "was … a well-formed single call".
    action = "Your rectangle is not a square; its area is 12, computed with calculate_area."
    outcome = env.evaluate("simple_python_0", action)
    assert not outcome.ok and outcome.kind == "syntax_error"
    item = env.item_from_failure("simple_python_0", action, outcome, seed=0)
    context = system_prompt(env.source("simple_python_0")) + "\n" + item.task
    assert {"Your", "not"} <= set(quoted(item.description, action, item.correct_actions[0], context))  # without
    assert item.meta["description_redacted"] == 0
    assert item.description.startswith("Your previous attempt was not a well-formed single call")
    assert quoted(item.description, action, item.correct_actions[0], context, WORDING) == []
    assert item.error_message == outcome.message  # unchanged


def test_a_name_the_model_made_up_is_redacted_even_beside_template_words():
    from fastscore.study.data.envs.tools.describe import WORDING

    assert {"not", "call", "Your", "previous"} <= WORDING and "describe_failure" in WORDING  # string constants
    assert "Runtime-generated" not in WORDING  # the module docstring is not wording
    failed = "Your answer: calculate_aera(width=3)"
    description = "Your previous attempt called `calculate_aera`, which is not a tool."
    text, count = redact(description, failed, "calculate_area(width=3, height=4)", "", WORDING)
    assert (text, count) == (f"Your previous attempt called `{REDACTED}`, which is not a tool.", 1)


def test_seeded_items_record_their_redaction_count(tmp_path):
    from fastscore.study.data.envs.mbpp.env import build_items
    from fastscore.study.data.envs.tools.env import build_items as tools_items

    items, _ = build_items(write_tasks(tmp_path / "m", TASKS), limit=10, seed=3)
    items += tools_items(_tools_data(tmp_path / "t"), None, 0)[0]
    assert items and all(isinstance(i.meta["description_redacted"], int) for i in items)
    from fastscore.study.data.envs.mbpp.describe import WORDING as MBPP
    from fastscore.study.data.envs.tools.describe import WORDING as TOOLS

    for item in items:
        wording = TOOLS if item.env == "tools" else MBPP
        assert quoted(item.description, item.failed_action, item.candidates[1], item.system + "\n" + item.task,
                      wording) == []


def _item(env: str, i: int, redacted: int | None):
    from fastscore.study.data.items import Item

    return Item(env=env, item_id=f"{env}-{i}", source_id=str(i), system="s", task="t", failed_action="a",
                error_message="e", failure_kind="k", correct_actions=("b",), candidates=("a", "b"), description="d",
                meta={} if redacted is None else {"description_redacted": redacted})


def test_the_report_and_summary_count_redacted_descriptions_per_environment_and_source(tmp_path):
    from test_report import META, study_rows

    from fastscore.study.analysis.metrics import summarize
    from fastscore.study.analysis.redactions import attach_redactions, redaction_counts
    from fastscore.study.report.document import write_report
    from fastscore.study.report.by_source import sources_report

    items = [_item("mbpp", i, 2 if i < 3 else 0) for i in range(25)] + [_item("tools", i, 0) for i in range(25)]
    summary = summarize(study_rows(shift=3.0), seed=11, n_boot=50)
    attach_redactions(summary, items)
    entry = summary["mbpp"]["description_redacted"]
    assert (entry["n_items"], entry["n_redacted"], entry["substrings"]) == (25, 3, 6)
    assert entry["share"]["mean"] == pytest.approx(0.12) and 0.03 < entry["share"]["lo"] < 0.12 < entry["share"]["hi"]
    assert summary["tools"]["description_redacted"]["n_redacted"] == 0
    text = write_report(summary, tmp_path, {**META, "failure_source": "model"}).read_text()
    items_section = text.split("## Items")[1].split("\n## ")[0]
    assert "Failure source: model." in items_section
    assert f"| mbpp | 3 of 25 (12% [{round(100 * entry['share']['lo'])}, " in items_section
    assert "| 6 |" in items_section and "| tools | 0 of 25 (0% [0, " in items_section
    both = sources_report({"seeded": summary, "model": summary}, {"seeded": "s", "model": "m"}, [])
    assert "## Descriptions redacted" in both and "| model | mbpp | 3 of 25 (12%" in both
    old = [_item("mbpp", 0, None)]  # an item stored before the count existed: not recorded, not "0"
    assert "share" not in redaction_counts(old)["mbpp"]
