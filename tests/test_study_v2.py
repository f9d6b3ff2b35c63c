"""Study v2: description hygiene and fixed candidate sets on every item, on-policy exclusions with reasons, seeded
sampling, and the argmax chain against real greedy decoding on the exact type."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scorer_helpers import CountingFakeBackend

from fastscore.records import GreedyRequest, Message
from fastscore.scorer import Scorer
from fastscore.study.data.hygiene import quoted

SEED = 43


def test_tools_descriptions_quote_neither_the_failed_call_nor_a_name_it_made_up_on_every_item(study_data):
    from fastscore.study.data.envs.tools.env import build_items, system_prompt  # noqa: F401

    items, skipped = build_items(study_data, None, 0)
    assert len(items) > 500
    for item in items:
        assert len(item.candidates) == 4 == len(set(item.candidates)), item.item_id
        assert item.failed_action.strip() not in item.description
        assert quoted(item.description, item.failed_action, item.candidates[1], item.system + "\n" + item.task) == []
    typos = [i for i in items if i.failure_kind == "unknown_function"]
    name = typos[0].failed_action.split("(")[0]
    assert name not in typos[0].description  # the misspelled function is not named
    print(len(items), "tools items,", len(skipped), "skipped")


def test_mbpp_descriptions_quote_no_changed_line_and_add_no_instruction(study_data):
    from fastscore.study.data.envs.mbpp.env import build_items
    from fastscore.study.data.envs.mbpp.sandbox import use_isolation

    with use_isolation("bwrap"):
        items, skipped = build_items(study_data, 40, 0)
    assert len(items) == 40
    for item in items:
        assert len(item.candidates) == 4 == len(set(item.candidates)), item.item_id
        assert quoted(item.description, item.failed_action, item.candidates[1], item.system + "\n" + item.task) == []
        assert "Write a corrected" not in item.description and "Do not" not in item.description
    assert any("fixed size of 4" in s.reason for s in skipped)  # too few failing mutants: skipped, counted


def test_hygiene_finds_a_quoted_typo_and_a_changed_line():
    failed, correct = "get_wether(city='Paris')", "get_weather(city='Paris')"
    assert quoted("You called `get_wether`, which does not exist.", failed, correct, "get_weather tool") == \
        ["get_wether"]
    assert quoted("You called a function that does not exist.", failed, correct, "get_weather tool") == []
    program, reference = "def f(a):\n    return a - 1", "def f(a):\n    return a + 1"
    assert quoted("It did `return a - 1`.", program, reference, "") == ["return a - 1"]


def test_a_degenerate_attempt_is_kept_with_a_redacted_description_and_an_accepted_one_excluded_not_a_crash(study_data):
    from fastscore.study.data.envs.tools.env import ToolsEnv, system_prompt
    from fastscore.study.data.hygiene import REDACTED

    env = ToolsEnv(study_data)
    item = env.build_items(1, SEED)[0][0]
    # The degenerate attempt `call` is a real rejection; its only name is a word of the runtime's own description
    # ("...not a well-formed single call"), which used to exclude it and is now replaced by the marker.
    outcome = env.evaluate(item.source_id, "call")
    assert not outcome.ok and outcome.kind == "syntax_error"
    made = env.item_from_failure(item.source_id, "call", outcome, SEED)
    assert made.meta["description_redacted"] == 1 and f"single {REDACTED}:" in made.description
    context = system_prompt(env.source(item.source_id)) + "\n" + made.task
    assert quoted(made.description, "call", made.candidates[1], context) == []
    assert made.error_message == outcome.message  # the runtime's own text, which names `call`, is unchanged
    accepted = item.correct_actions[0]
    assert env.evaluate(item.source_id, accepted).ok  # the builder skips it ("the model's own attempt succeeded")
    with pytest.raises(ValueError, match="accepted"):
        env.item_from_failure(item.source_id, accepted, env.evaluate(item.source_id, accepted), SEED)


def test_an_attempt_cut_off_at_the_token_cap_is_skipped_with_its_reason(study_data):
    from fastscore.selection import ModelSelection
    from fastscore.study.data.envs.tools.env import ToolsEnv
    from fastscore.study.stages.onpolicy import ModelFailureBuilder

    env = ToolsEnv(study_data)
    seeded = env.build_items(2, SEED)[0]
    skipped = []
    with ModelSelection.resolve("smollm2-135m-instruct", "llamacpp", "q4_1", threads=2).open() as scorer:
        made = list(ModelFailureBuilder(env, scorer, SEED, max_new_tokens=3)._attempts(seeded, skipped))
    assert made == [None, None]
    assert [s.reason for s in skipped] == ["the model's attempt was cut off at the token cap"] * 2


# Slow (~35 s: every attempt of six MBPP items decoded twice on the 135M, once to the 300-token cap): the stop rule's
# effect on the metrics, on scripted completions, stays in the default suite
# (test_greedy_stage.py::test_the_mbpp_stop_rule_changes_no_metric).
@pytest.mark.slow
def test_mbpp_attempts_stop_after_the_program_and_make_the_items_a_decode_to_the_cap_makes(study_data):
    """The action_done rule only cuts what follows the program: on the exact type, the attempts make the same items
    and skip the same sources for the same reasons as the same attempts decoded to the cap."""
    from fastscore.selection import ModelSelection
    from fastscore.study.data.envs.mbpp.env import MbppEnv, extract_program
    from fastscore.study.stages.onpolicy import ModelFailureBuilder

    class ToTheCap(MbppEnv):
        def action_done(self):
            return None

    env, to_cap_env = MbppEnv(study_data), ToTheCap(study_data)
    seeded = env.build_items(6, SEED)[0]
    outcomes = {}
    with ModelSelection.resolve("smollm2-135m-instruct", "llamacpp", "f32", threads=2).open() as scorer:
        for name, e in (("stopped", env), ("to_cap", to_cap_env)):
            skipped = []
            made = list(ModelFailureBuilder(e, scorer, SEED, max_new_tokens=env.max_new_tokens)._attempts(seeded,
                                                                                                       skipped))
            outcomes[name] = made, [(s.source_id, s.reason) for s in skipped]
    (stopped, stopped_skips), (to_cap, to_cap_skips) = outcomes["stopped"], outcomes["to_cap"]
    print("skipped:", stopped_skips)
    assert stopped_skips == to_cap_skips
    shorter = 0
    for a, b in zip(stopped, to_cap):
        assert (a is None) == (b is None)
        if a is None:
            continue
        # The same program, candidates and error; the action itself is what each harness cut (the stopped one
        # after the program, the other at the end of the turn or the cap), emitted token for token.
        assert extract_program(a.failed_action) == extract_program(b.failed_action)
        assert (a.candidates[1:], a.error_message) == (b.candidates[1:], b.error_message)
        ids_a, ids_b = a.meta["attempt"]["token_ids"], b.meta["attempt"]["token_ids"]
        assert ids_b[: len(ids_a)] == ids_a
        emitted_a, emitted_b = a.meta["emitted"]["token_ids"], b.meta["emitted"]["token_ids"]
        assert ids_a[: len(emitted_a)] == emitted_a and ids_b[: len(emitted_b)] == emitted_b
        assert b.failed_action.startswith(a.failed_action)
        shorter += len(ids_a) < len(ids_b)
    print("items:", sum(a is not None for a in stopped), "attempts cut short after their program:", shorter)


def test_sampling_is_seeded_batch_independent_and_follows_the_softmax(smollm_tokenizer):
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer)
    context = (Message("user", "Name a colour."),)
    requests = [GreedyRequest(f"s{i}", context) for i in range(3)]
    rngs = lambda: [np.random.default_rng([7, i]) for i in range(3)]  # noqa: E731
    together = scorer.greedy(requests, max_new_tokens=5, temperature=1.0, rngs=rngs())
    alone = [scorer.greedy([r], max_new_tokens=5, temperature=1.0, rngs=[rngs()[i]])[0] for i, r in enumerate(requests)]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert together == scorer.greedy(requests, max_new_tokens=5, temperature=1.0, rngs=rngs())
    # First-token frequencies over many seeded samples match softmax(logits) within 4 binomial standard errors.
    n = 600
    firsts = scorer.greedy([GreedyRequest(f"f{i}", context) for i in range(n)], max_new_tokens=1, temperature=1.0,
                           rngs=[np.random.default_rng([3, i]) for i in range(n)])
    ids = scorer.context_ids(context)
    logits = scorer.backend.model.reference_logits(ids)[-1].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    top = int(probs.argmax())
    seen = sum(1 for r in firsts if r.token_ids[:1] == (top,))
    stopped = sum(1 for r in firsts if not r.token_ids)
    p_top = probs[top]
    print("top token p", p_top, "seen", seen / n, "stopped", stopped)
    assert abs(seen / n - p_top) <= 4 * np.sqrt(p_top * (1 - p_top) / n) + 1e-9
    with pytest.raises(ValueError, match="Generator"):
        scorer.greedy(requests, max_new_tokens=2, temperature=1.0)


def test_the_argmax_chain_agrees_with_real_greedy_decoding_on_the_exact_type(study_data):
    """On llama.cpp f32 (exact), a candidate's scored tokens are all argmax exactly when greedy decoding emits it."""
    from fastscore.selection import ModelSelection
    from fastscore.study.data.conditions import distinct, render_conditions
    from fastscore.study.data.envs import open_envs
    from fastscore.study.stages.decode import chain_completion, greedy_budget
    from fastscore.study.stages.score import _set_record

    envs = open_envs(["tools"], study_data)
    items = envs["tools"].build_items(2, SEED)[0]
    checked = agreed_repro = 0
    with ModelSelection.resolve("smollm2-135m-instruct", "llamacpp", "f32", threads=2).open() as scorer:
        for item in items:
            contexts = [c for c in render_conditions(item, envs["tools"]) if not c.banned]
            reps = distinct(contexts, lambda x: x.messages)
            contexts = [c for c in contexts if reps[c.condition] == c.condition]
            sets = scorer.score_candidates([c.candidate_set(item.candidates) for c in contexts])
            records = {"conditions": {c.condition: _set_record(s) for c, s in zip(contexts, sets)}}
            budget = greedy_budget(96, records)
            decoded = scorer.greedy([c.greedy_request() for c in contexts], max_new_tokens=budget)
            for c, real in zip(contexts, decoded):
                rec = records["conditions"][c.condition]
                chain = chain_completion(c.request_id, rec, scorer.tokenizer)
                emitted = [j for j, ids in enumerate(rec["cand_token_ids"])
                           if real.stopped_by == "end_of_turn" and list(real.token_ids) == ids[:-1]]
                checked += 1
                if chain is None:
                    assert not emitted, (item.item_id, c.condition, real.text)
                else:
                    assert chain.token_ids == real.token_ids and chain.text == real.text
                    agreed_repro += 1
    print(f"{checked} contexts checked; {agreed_repro} read off the argmax chain, all equal to the real decode")
    assert checked >= 12 and agreed_repro >= 1


def test_limit_all_is_accepted_and_a_bad_limit_is_a_usage_error(tmp_path):
    from click.testing import CliRunner

    from fastscore.cli import main
    from fastscore.errors import DataError
    from fastscore.study.runner import StudyConfig, check_config

    missing = tmp_path / "no-data"
    result = CliRunner().invoke(main, ["study", "--limit", "all", "--data", str(missing), "--out", str(tmp_path / "o")])
    assert result.exit_code == DataError.exit_code and "not found" in result.output  # parsed, then the data check
    for bad in ("0", "some"):
        result = CliRunner().invoke(main, ["study", "--limit", bad, "--out", str(tmp_path / "o")])
        assert result.exit_code == 2 and "--limit" in result.output
    check_config(StudyConfig(limit=None, quant="f32"))  # every usable item: a valid setting


def test_an_mbpp_attempt_with_a_closed_program_is_finished_even_if_the_model_talked_on(tmp_path):
    from fastscore.study.data.envs.mbpp.env import MbppEnv
    from fastscore.study.data.envs.tools.env import ToolsEnv

    mbpp, tools = MbppEnv(tmp_path), ToolsEnv(tmp_path)
    assert mbpp.finished_action("```python\ndef f():\n    return 1\n```\nThis works because", "max_tokens")
    assert not mbpp.finished_action("```python\ndef f():\n    return 1\n", "max_tokens")
    assert not tools.finished_action("get_weather(city='Par", "max_tokens")
    assert tools.finished_action("get_weather(city='Paris')", "end_of_turn")


def test_both_failure_sources_are_reported_side_by_side(tmp_path):
    from test_report import study_rows

    from fastscore.study.analysis.metrics import summarize
    from fastscore.study.report.document import headline
    from fastscore.study.runner import StudyConfig
    from fastscore.study.sources import StudyOutcome
    from fastscore.study.sources import combine_sources

    summary = summarize(study_rows(shift=3.0, n=8), seed=0, n_boot=100)
    outcomes = {source: StudyOutcome(tmp_path / source, {"tools": 8, "mbpp": 8}, 0, 0, summary, {"score": 1.0}, 1.0, ())
                for source in ("seeded", "model")}
    outcome = combine_sources(StudyConfig(quant="f32", out_dir=tmp_path), outcomes, 2.0)
    report = (tmp_path / "report.md").read_text()
    assert "| seeded: tools |" in report and "| model: pooled |" in report
    assert "not applicable (seeded failures)" in report
    assert "not applicable (by construction: the model's own attempt)" in report
    assert "## Failure mix" in report and "| tools | unrecorded 8 | unrecorded 8 |" in report  # rows carry no kinds
    assert "Seeded failure mix: tools: each item's failed action is prose instead of a call" in report
    assert set(json.loads((tmp_path / "summary.json").read_text())) == {"seeded", "model"}
    lines = headline(outcome)
    assert lines[0].startswith("[seeded] tools") and lines[-1].startswith("measured time, both failure sources")
