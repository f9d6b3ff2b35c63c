"""The model's own attempts begin with the seeded source's `before` completions of the same contexts
(stages.onpolicy.KnownAttempts): a run of both failure sources builds, scores and decodes the on-policy items exactly
as a run of that source alone, which decodes every attempt."""

from __future__ import annotations

from dataclasses import replace

from fastscore.decode import ACTION_DONE, END_OF_TURN, MAX_TOKENS
from fastscore.records import GreedyResult, Message
from fastscore.study.runner import StudyConfig, run_study
from fastscore.study.stages import onpolicy
from fastscore.study.stages.onpolicy import KnownAttempts

STOP = 2
CONTEXT = (Message("system", "s"), Message("user", "u"))


def _completion(ids, stopped_by):
    return GreedyResult(id="x::before", text="", token_ids=tuple(ids), stopped_by=stopped_by)


def test_a_known_completion_is_given_whole_where_it_ended_and_as_far_as_it_went_where_its_budget_cut_it():
    known = KnownAttempts()
    known.remember("a", CONTEXT, _completion([5, 6], END_OF_TURN))
    known.remember("b", CONTEXT, _completion([5, 6, 7], ACTION_DONE))
    known.remember("c", CONTEXT, _completion([5, 6, 7, 8], MAX_TOKENS))
    assert known.start_ids("a", CONTEXT, STOP) == (5, 6, STOP)  # its end-of-turn ends the attempt too
    assert known.start_ids("b", CONTEXT, STOP) == (5, 6, 7)  # the action rule ends it again at the same token
    assert known.start_ids("c", CONTEXT, STOP) == (5, 6, 7, 8)  # decoded on from there, up to the attempt's cap
    # Another context under the same id (or an id never seen): nothing is known.
    assert known.start_ids("a", CONTEXT[:1], STOP) == ()
    assert known.start_ids("z", CONTEXT, STOP) == ()
    assert len(known) == 3


def test_both_sources_make_the_on_policy_rows_the_model_source_makes_alone(tmp_path, study_data, monkeypatch):
    """On the embedded model (f32, exact): --failures both hands the seeded source's completions to the model's
    attempts; --failures model alone decodes them all. Items, skips, log-probs and rows must be the same."""
    given = []
    start_ids = KnownAttempts.start_ids

    def counting(self, item_id, messages, stop_id):
        ids = start_ids(self, item_id, messages, stop_id)
        given.append(len(ids))
        return ids

    monkeypatch.setattr(onpolicy.KnownAttempts, "start_ids", counting)
    base = StudyConfig(envs=("tools",), limit=2, seed=43, data_dir=study_data, n_boot=50, retries=0, threads=2)
    run_study(replace(base, failures="both", out_dir=tmp_path / "both"))
    assert given and any(given), "the model's attempts must have begun with the seeded source's completions"
    asked = len(given)
    run_study(replace(base, failures="model", out_dir=tmp_path / "alone"))
    assert len(given) == asked, "a run of one source has no known completions"
    print(f"{sum(bool(n) for n in given)} of {asked} attempts began with a known completion "
          f"({sum(given)} tokens not decoded again)")
    for name in ("items.jsonl", "skipped.jsonl", "logprobs.jsonl", "scores.jsonl"):
        both = (tmp_path / "both" / "model" / name).read_text()
        assert both == (tmp_path / "alone" / name).read_text(), name
    assert (tmp_path / "alone" / "items.jsonl").read_text().strip(), "the comparison needs on-policy items"


def test_only_exact_types_on_builds_whose_steps_give_a_prefills_bits_keep_completions():
    """A quantised llama.cpp type's completion depends on its batch, and PyPI's llama.cpp sums a one-row step in
    another order than a prefill: a second decode may differ there, so the seeded source's completion would not be
    the attempt's."""
    from fastscore.backends.llamacpp_compact import build_steps_match_prefill
    from fastscore.study.runner import exact_type

    assert exact_type(StudyConfig(quant="f32")) and not exact_type(StudyConfig(quant="q8_0"))
    assert build_steps_match_prefill("0.3.36+fastscore3", "x86_64") and build_steps_match_prefill("0.3.36+fastscore8",
                                                                                                   "x86_64")
    assert not build_steps_match_prefill("0.3.36+fastscore2", "x86_64")
    assert not build_steps_match_prefill("0.3.36", "x86_64") and not build_steps_match_prefill("0.3.36+fastscore8",
                                                                                                 "aarch64")
