"""The seeded "prose" failure of the tools environment: the call written as a sentence, rejected by the runtime with
Python's own SyntaxError; its items on the real data; the mix stated in config.json and in the reports."""

from __future__ import annotations

import ast
import random
from dataclasses import replace

import pytest

from fastscore.study.data.envs.tools.env import ToolsEnv, build_items, load_sources
from fastscore.study.data.envs.tools.mutations import MUTATION_KINDS, mutation_rng, seeded_mutations
from fastscore.study.data.envs.tools.prose import PROSE_KIND, SEEDED_MIX, prose_text, seeded_prose
from fastscore.study.data.envs.tools.runtime import Call, ToolRuntime, parse_call
from fastscore.study.data.hygiene import quoted
from fastscore.study.report.document import write_report
from fastscore.study.report.meta import report_meta
from fastscore.study.report.by_source import mix_section
from fastscore.study.report.control import seeded_mix_text
from fastscore.study.runner import StudyConfig

AREA = {"name": "geometry.area", "parameters": {"type": "dict", "properties": {
    "width": {"type": "integer"}, "height": {"type": "integer"}, "unit": {"type": "string"}},
    "required": ["width", "height"]}}
TRUTH = Call("geometry.area", (("width", 3), ("height", 4), ("unit", "cm")))


def _python_syntax_error(text: str) -> str:
    """What Python itself says about the text as an expression (the runtime must pass it on, not make one up)."""
    with pytest.raises(SyntaxError) as caught:
        ast.parse(text.strip(), mode="eval")
    exc = caught.value
    return f"SyntaxError: {exc.msg} (line {exc.lineno}, column {exc.offset})"


def test_every_template_says_the_call_in_words_and_the_runtime_rejects_it_with_python_s_error():
    runtime = ToolRuntime([AREA])
    texts = {prose_text(TRUTH, random.Random(i)) for i in range(200)}
    assert len(texts) >= 4  # several templates in use
    for text in texts:
        assert "geometry.area" in text and "'cm'" in text and "width" in text  # the right call, in words
        outcome = runtime.execute(text)
        assert not outcome.ok and outcome.kind == "syntax_error", text
        assert outcome.error == _python_syntax_error(text), text
    no_args = prose_text(Call("now", ()), random.Random(0))
    assert "now" in no_args and not ToolRuntime([{"name": "now", "parameters": {}}]).execute(no_args).ok


def test_the_prose_draw_is_seeded_per_item_and_follows_the_share():
    runtime = ToolRuntime([AREA])
    drawn = [seeded_prose(TRUTH, runtime, 0, f"simple_{i}") for i in range(400)]
    assert [m and m.text for m in drawn] == [m and m.text for m in
                                               (seeded_prose(TRUTH, runtime, 0, f"simple_{i}") for i in range(400))]
    share = sum(m is not None for m in drawn) / len(drawn)
    assert 0.4 < share < 0.6, share
    assert all(m.kind == PROSE_KIND and m.call is None for m in drawn if m is not None)
    assert seeded_prose(TRUTH, runtime, 0, "simple_0", share=0.0) is None
    assert seeded_prose(TRUTH, runtime, 0, "simple_0", share=1.0) is not None


@pytest.fixture(scope="module")
def items40(study_data):
    items, _ = build_items(study_data, limit=40, seed=0)
    return items, {s.source_id: s for s in load_sources(study_data)}


def test_real_prose_items_are_clean_and_the_other_kinds_keep_their_seeded_mutations(items40):
    items, sources = items40
    prose = [i for i in items if i.failure_kind == PROSE_KIND]
    calls = [i for i in items if i.failure_kind != PROSE_KIND]
    print(f"{len(prose)} prose items of {len(items)}")
    assert prose and calls and {i.failure_kind for i in calls} <= set(MUTATION_KINDS)
    for item in items:
        source = sources[item.source_id]
        runtime = ToolRuntime(source.functions)
        assert len(item.candidates) == 4 == len(set(item.candidates))
        assert item.error_message == runtime.execute(item.failed_action).error != ""
        assert quoted(item.description, item.failed_action, item.candidates[1], item.system + "\n" + item.task) == []
        # The call mutations come from the item's mutation rng exactly as before prose existed: a prose item is the
        # same item with its failed call replaced; every other item is unchanged.
        truth = parse_call(item.candidates[1])
        mutations = seeded_mutations(truth, runtime, mutation_rng(0, item.source_id), 3)
        assert item.candidates[2:] == tuple(m.text for m in mutations[1:])
        if item.failure_kind == PROSE_KIND:
            assert item.meta["runtime_kind"] == "syntax_error" and item.meta["candidate_kinds"][0] == PROSE_KIND
            assert item.error_message == _python_syntax_error(item.failed_action)
            assert item.description.startswith("Your previous attempt was not a well-formed single call")
        else:
            assert item.failed_action == mutations[0].text and item.failure_kind == mutations[0].kind


def test_the_mix_is_stated_in_config_and_in_the_reports(study_data, tmp_path):

    seeded = StudyConfig(envs=("tools", "mbpp"), failures="seeded", data_dir=study_data)
    assert ToolsEnv.seeded_mix == SEEDED_MIX
    assert seeded.result_settings()["seeded_failure_mix"] == {"tools": SEEDED_MIX}
    model = replace(seeded, failures="model")
    assert model.result_settings()["seeded_failure_mix"] is None
    line = seeded_mix_text(("tools", "mbpp"))
    assert line.startswith(f"tools: {SEEDED_MIX}; mbpp: no rule stated")
    meta = report_meta(seeded, "w", [], [], {}, resumed=False)
    assert meta["seeded_mix"] == line
    assert report_meta(model, "w", [], [], {}, resumed=False)["seeded_mix"] == "none (the model's own failures)"
    text = write_report({}, tmp_path, meta).read_text()
    assert f"| seeded failure mix | {line} |" in text
    assert "prose instead of a call with probability 0.5" in SEEDED_MIX

    def kinds(**counts):
        return {"by_kind": {k: {"n_items": n} for k, n in counts.items()}}
    section = mix_section({"seeded": {"tools": kinds(prose=9, wrong_type=11)},
                           "model": {"tools": kinds(**{"model:syntax_error": 20})}})
    assert "| tools | prose 9, wrong_type 11 | model:syntax_error 20 |" in section
    assert f"Seeded failure mix: tools: {SEEDED_MIX}." in section
