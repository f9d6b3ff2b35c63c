"""Harness realism as a sensitivity check: the error record in the other role, and the chat template's native tool
format, scored on the tiny random Llama / Qwen2 / Qwen3 given the real Llama 3.2 / Qwen2.5 / Qwen3 templates."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from scorer_helpers import CountingFakeBackend, copy_tokenizer, rename_special_tokens

from fastscore import cache
from fastscore.errors import ArtefactUnavailableError
from fastscore.scorer import Scorer
from fastscore.study.analysis.sensitivity import summarize_sensitivity
from fastscore.study.stages.sensitivity import NO_TOOLS_TEMPLATE, NOT_APPLICABLE, check_requests
from fastscore.tokenizer import Tokenizer

# Each tiny architecture with the real template of a model of its family.
FAMILY_OF = {"qwen2": "qwen2.5", "qwen3": "qwen3", "llama": "llama3.2"}


@pytest.fixture(scope="module")
def real_template():
    from fastscore.chat_templates import real_template as fetch

    def get(family: str) -> str:
        try:
            return fetch(family)
        except ArtefactUnavailableError as exc:  # `make test` fetches them first; a bare pytest run offline cannot
            pytest.skip(f"real chat templates unavailable: {exc}")

    return get


@pytest.fixture(scope="module")
def tiny_with_template(tiny_model, real_template):
    """tiny_with_template(arch) -> a copy of the tiny checkpoint whose chat template is its family's real one."""

    def get(arch: str) -> Path:
        source = tiny_model(arch)
        final = cache.home() / "test-models" / f"{source.name}-{FAMILY_OF[arch]}-template"
        if not cache.is_complete(final):
            with cache.atomic_dir(final) as scratch:
                for path in source.iterdir():
                    if path.is_file() and not path.name.startswith("."):
                        shutil.copy2(path, scratch / path.name)
                (scratch / "chat_template.jinja").write_text(real_template(FAMILY_OF[arch]))
                if arch == "llama":
                    rename_special_tokens(scratch)
        return final

    return get


@pytest.fixture(scope="module")
def tools_env(study_data):
    from fastscore.study.data.envs.tools.env import ToolsEnv

    return ToolsEnv(study_data)


def _fake_scorer(folder: Path) -> Scorer:
    return Scorer(CountingFakeBackend(), Tokenizer.from_folder(folder))


def test_the_checks_write_the_record_as_the_other_role_and_in_the_native_tool_format(
        tools_env, real_template, smollm_tokenizer, tmp_path):
    items = [i for i in tools_env.build_items(12, 0)[0] if "(" in i.failed_action]
    folder = copy_tokenizer(Path(smollm_tokenizer.name), tmp_path / "q", template=real_template("qwen2.5"))
    scorer = _fake_scorer(folder)
    plan = check_requests(items[0], tools_env, scorer)
    role_after = plan["record_role"].sets["after"]
    assert [m.role for m in role_after.messages] == ["system", "user", "assistant", "user"]  # tool -> user
    assert role_after.candidates == items[0].candidates
    native = plan["native_tools"]
    before, after = native.sets["before"], native.sets["after"]
    assert before.tools and before.tools == after.tools and "JSON schemas" not in before.messages[0].content
    assert after.messages[2].tool_calls and after.messages[3].role == "tool"
    assert after.messages[3].content == tools_env.failure_report(items[0])
    name = items[0].correct_actions[0].split("(")[0]
    assert before.candidates[1].startswith('<tool_call>\n{"name": "' + name + '", "arguments": {')
    # The scored context renders the failed call as the template writes tool calls: exactly the failed candidate.
    text = scorer.tokenizer.decode(scorer.context_ids(after.messages, tools=after.tools))
    assert before.candidates[0] in text and items[0].failed_action not in text
    # SmolLM2's template renders neither tools nor tool calls: not applicable, with the reason.
    plain = check_requests(items[0], tools_env, _fake_scorer(Path(smollm_tokenizer.name)))
    assert plain["native_tools"] == NO_TOOLS_TEMPLATE and "record_role" in plain and not isinstance(
        plain["record_role"], str)


def _set(lp_failed, n_failed, lp_correct, n_correct):
    return {"cand_lp": [lp_failed, lp_correct, -9.0, -9.0], "cand_n_tokens": [n_failed, n_correct, 3, 3]}


def test_changes_on_the_headline_are_paired_per_item_and_match_hand_values():
    default = {
        "a": [{"conditions": {"before": _set(-10.0, 4, -6.0, 4), "after": _set(-6.0, 4, -4.0, 4)}}],
        "b": [{"conditions": {"before": _set(-12.0, 6, -8.0, 4), "after": _set(-9.0, 6, -7.0, 4)}}],
    }
    records = [
        {"item_id": "a", "env": "tools", "checks": {
            "record_role": {"sets": {"after": _set(-8.0, 4, -5.0, 4)}},
            "native_tools": {"sets": {"before": _set(-20.0, 10, -12.0, 8), "after": _set(-10.0, 10, -8.0, 8)}}}},
        {"item_id": "b", "env": "tools", "checks": {
            "record_role": {"sets": {"after": _set(-9.0, 6, -7.0, 4)}},
            "native_tools": {NOT_APPLICABLE: "a candidate does not parse as a call (syntax_error)"}}},
    ]
    out = summarize_sensitivity(default, records, ["tools"], seed=0, n_boot=200)["tools"]
    role = out["record_role"]
    # Item a: study G/tok = (-10 - -6)/4 = -1; check: (-10 - -8)/4 = -0.5. Item b: both (-12 - -9)/6 = -0.5.
    assert role["n_items"] == 2
    assert math.isclose(role["gain_per_token"]["default"]["mean"], (-1.0 - 0.5) / 2)
    assert math.isclose(role["gain_per_token"]["change"]["mean"], (0.5 + 0.0) / 2)
    # ΔG/tok a: study -1 - (-6 - -4)/4 = -0.5, check -0.5 - (-6 - -5)/4 = -0.25; b: -0.5 - (-8 - -7)/4 = -0.25 both.
    assert math.isclose(role["delta_gain_per_token"]["change"]["mean"], (0.25 + 0.0) / 2)
    native = out["native_tools"]
    assert native["n_items"] == 1 and native["n_not_applicable"] == 1
    assert math.isclose(native["gain_per_token"]["check"]["mean"], (-20.0 + 10.0) / 10)
    assert math.isclose(native["delta_gain_per_token"]["check"]["mean"], -1.0 - (-12.0 + 8.0) / 8)
    # A check that applies to no item has a reason and no number.
    records[0]["checks"]["native_tools"] = {NOT_APPLICABLE: NO_TOOLS_TEMPLATE}
    none = summarize_sensitivity(default, records, ["tools"], seed=0, n_boot=200)["tools"]["native_tools"]
    assert none["n_items"] == 0 and NO_TOOLS_TEMPLATE in none[NOT_APPLICABLE] and "gain_per_token" not in none


def _study(model: Path, data: Path, out: Path, sensitivity: bool):
    from fastscore.study.runner import StudyConfig, run_study

    config = StudyConfig(model=str(model), backend="llamacpp", quant="f32", envs=("tools",), limit=2, seed=0,
                         failures="seeded", out_dir=out, data_dir=data, n_boot=100, threads=1, max_new_tokens=8,
                         sensitivity=sensitivity)
    return run_study(config)


# Qwen2.5's template (tools rendered natively) in the default suite; the Qwen3 and Llama 3.x templates, ~19 s each
# (two tiny-model studies per template), run under `make test-all`.
@pytest.mark.parametrize("arch", ["qwen2", pytest.param("qwen3", marks=pytest.mark.slow),
                                  pytest.param("llama", marks=pytest.mark.slow)])
def test_tiny_models_with_real_templates_report_both_checks_without_changing_the_study(
        arch, tiny_with_template, study_data, tmp_path):
    model = tiny_with_template(arch)
    with_checks = _study(model, study_data, tmp_path / "with", sensitivity=True)
    checks = with_checks.summary["tools"]["sensitivity"]
    assert checks["record_role"]["n_items"] == 2
    native = checks["native_tools"]
    assert native["n_items"] + native["n_not_applicable"] == 2 and native["n_items"] >= 1, native
    for check in ("record_role", "native_tools"):
        change = checks[check]["gain_per_token"]["change"]
        assert change["lo"] <= change["mean"] <= change["hi"] and change["mean"] != 0.0
    report = (tmp_path / "with" / "report.md").read_text()
    assert "## Sensitivity: harness realism" in report and "| tools | native tool format | " in report
    stored = [json.loads(line) for line in (tmp_path / "with" / "sensitivity.jsonl").read_text().splitlines()]
    assert all(r["checks"]["native_tools"].get("candidates", ["<tool_call>"])[0].strip().startswith(
        ("<tool_call>", '{"name"')) for r in stored)
    # The study's own conditions are scored in calls of their own: identical numbers without the checks.
    without = _study(model, study_data, tmp_path / "without", sensitivity=False)
    assert "sensitivity" not in without.summary["tools"]
    assert (tmp_path / "with" / "logprobs.jsonl").read_bytes() == (tmp_path / "without" / "logprobs.jsonl").read_bytes()
    assert not (tmp_path / "without" / "sensitivity.jsonl").exists()


def test_a_template_without_tools_reports_the_native_format_as_not_applicable(tiny_model, study_data, tmp_path):
    """The tiny models' own template is the embedded SmolLM2's: no tools=, so no native-format number."""
    outcome = _study(tiny_model("llama"), study_data, tmp_path / "out", sensitivity=True)
    native = outcome.summary["tools"]["sensitivity"]["native_tools"]
    assert native["n_items"] == 0 and native[NOT_APPLICABLE] == NO_TOOLS_TEMPLATE
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"| tools | native tool format | 0 | not applicable: {NO_TOOLS_TEMPLATE} |" in report
