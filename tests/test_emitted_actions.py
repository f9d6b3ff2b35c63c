"""On-policy actions scored as emitted (#31.3) and sampled retries judged in meaning under every record (#31.2).

The model's own failed attempt is scored as the token ids it emitted up to where the harness cut it, under every
condition, and shown as their text in every record; samples under every record and the clean retry are decoded
like greedy completions and judged by the environment's semantic repeat rule. End to end on a tiny random model
(llama.cpp, f32).
"""

from __future__ import annotations

import json

import pytest
from scorer_helpers import CountingFakeBackend

from fastscore.decode import ACTION_DONE, END_OF_TURN, MAX_TOKENS
from fastscore.records import CandidateSet, EmittedContinuation, GreedyRequest, GreedyResult, Message
from fastscore.scorer import Scorer

SEED = 43
RETRIES = 3
WORDS = 3  # the test environment's action is written once its text holds this many words


def _rule(text: str) -> bool:
    return len(text.split()) >= WORDS + 1  # a word past the third: the third is complete


def test_an_emitted_continuation_is_scored_as_its_ids_right_after_the_decoding_context(smollm_tokenizer):
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer)
    context = (Message("user", "Name a colour."),)
    text = "Blue, mostly."
    ids = tuple(smollm_tokenizer.encode(text).ids)
    # The same tokens given as text and as ids score alike; ids the tokenizer would never produce are kept as given.
    split = (*smollm_tokenizer.encode("Bl").ids, *smollm_tokenizer.encode("ue, mostly.").ids)
    assert split != ids and smollm_tokenizer.decode(split) == text
    as_text, as_ids, as_split, cut = scorer.score_candidates([CandidateSet("s", context, (
        text, EmittedContinuation(text, ids, True), EmittedContinuation(text, split, True),
        EmittedContinuation(text, ids, False)))])[0].results
    eot = smollm_tokenizer.end_of_turn_id
    assert as_ids.token_ids == (*ids, eot) == as_text.token_ids and as_split.token_ids == (*split, eot)
    print("text vs emitted ids, same tokens: |Δ lp| =", abs(as_text.logprob - as_ids.logprob))
    assert as_ids.logprob == pytest.approx(as_text.logprob, abs=1e-9)
    assert cut.token_ids == ids and not cut.includes_end_of_turn
    assert cut.logprob == pytest.approx(sum(as_ids.token_logprobs[:-1]), abs=1e-9)
    assert as_ids.continuation == text and as_ids.boundary_straddles == 0
    prefix = scorer.context_ids(context)
    prepared = scorer.prepare(CandidateSet("s", context, (EmittedContinuation(text, split, False),)).score_requests()[0])
    assert prepared.token_request.tokens == (*prefix, *split) and prepared.token_request.score_from == len(prefix)


def test_the_emitted_action_ends_where_the_harness_cut_it(smollm_tokenizer):
    from fastscore.study.stages.onpolicy import emitted_action

    ids = tuple(smollm_tokenizer.encode("one two three four five").ids)
    attempt = lambda stop: GreedyResult("a", smollm_tokenizer.decode(ids), ids, stop)  # noqa: E731
    cut = next(k for k in range(1, len(ids) + 1) if _rule(smollm_tokenizer.decode(ids[:k])))
    assert 1 < cut < len(ids)
    token_bytes = smollm_tokenizer.token_bytes
    assert emitted_action(attempt(ACTION_DONE), _rule, token_bytes) == (ids[:cut], False)
    assert emitted_action(attempt(END_OF_TURN), None, token_bytes) == (ids, True)
    assert emitted_action(attempt(MAX_TOKENS), None, token_bytes) == (ids, False)


class _Judged:
    """Records every text the environment judged for a repeat, and what it answered."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []


def _words_env(data_dir, judged: _Judged, settle: bool = False):
    """The tools environment whose harness cuts an answer once it has written WORDS words (the tiny random model
    never ends its turn), and whose semantic repeat judge is recorded. Without `settle`, a sample runs to that rule
    (the environment cannot tell a repeat from a start); with it, samples stop once settled by the tools rule."""
    from fastscore.study.data.envs.tools.env import ToolsEnv

    class WordsEnv(ToolsEnv):
        def action_done(self):
            return _rule

        def may_repeat(self, item):
            return super().may_repeat(item) if settle else None

        def repeats_failure(self, item, text):
            same = super().repeats_failure(item, text)
            judged.calls.append((text, same))
            return same

    return WordsEnv(data_dir)


def test_on_policy_actions_are_scored_as_emitted_under_every_condition_and_retries_judged_in_meaning(
        tiny_model, study_data, tmp_path):
    from fastscore.selection import ModelSelection
    from fastscore.study.data.conditions import CONDITIONS, render_conditions
    from fastscore.study.stages.onpolicy import ModelFailureBuilder
    from fastscore.study.data.score_row import read_score_rows
    from fastscore.study.stages.decode import SAMPLED_CONDITIONS, DecodePlan, greedy_stage
    from fastscore.study.stages.score import score_stage
    from fastscore.study.stages.store import StudyStore

    judged = _Judged()
    env = _words_env(study_data, judged)
    store = StudyStore(tmp_path)
    store.start({"test": 1}, resume=False)
    with ModelSelection.resolve(str(tiny_model("llama")), "llamacpp", "f32", threads=2).open() as scorer:
        items, skipped = ModelFailureBuilder(env, scorer, SEED, max_new_tokens=16).build(1)
        assert items, [s.reason for s in skipped]
        score_stage(store, scorer, {env.name: env}, items)
        sampled_requests: list[GreedyRequest] = []
        greedy = scorer.greedy

        def recording_greedy(requests, **kw):  # the real decoder; records what was sampled, and how
            temperatures = kw.get("temperature", 0.0)
            if isinstance(temperatures, float):
                temperatures = [temperatures] * len(requests)
            for request, temperature in zip(requests, temperatures, strict=True):
                if temperature:
                    assert temperature == 1.0
                    sampled_requests.append(request)
            return greedy(requests, **kw)

        scorer.greedy = recording_greedy
        greedy_stage(store, scorer, {env.name: env}, items, lambda _: 16, DecodePlan(False, RETRIES, SEED))
        decode = scorer.tokenizer.decode
    lp = {r["item_id"]: r for r in map(json.loads, (tmp_path / "logprobs.jsonl").read_text().splitlines())}
    rows = {(r.item_id, r.condition): r for r in read_score_rows(tmp_path / "scores.jsonl")}
    for item in items:
        attempt = item.meta["attempt"]
        # The harness's cut, from the attempt alone: the first token after which the action was written.
        ids = attempt["token_ids"]
        cut = next(k for k in range(1, len(ids) + 1) if _rule(decode(ids[:k])))
        assert attempt["stopped_by"] == ACTION_DONE and cut == len(ids) - 1  # the decoder read one token more
        emitted = ids[:cut]
        for cond in CONDITIONS:
            scored = lp[item.item_id]["conditions"][cond]
            assert scored["cand_token_ids"][0] == emitted, (item.item_id, cond)  # no end-of-turn: never emitted
            assert not scored["end_of_turn"] and not rows[item.item_id, cond].scored_end_of_turn
        shown = {c.condition: c.messages[2].content for c in render_conditions(item, env) if len(c.messages) > 2}
        assert shown["after"] == shown["neutral"] == shown["success"] == decode(emitted) == item.failed_action
        assert rows[item.item_id, "before"].greedy_repeat  # its own attempt starts with the action: cut there too
    # The decode stage judges each item's samples (before it writes the rows, whose greedy completions are judged
    # next, one per condition), condition by condition in SAMPLED_CONDITIONS order: every sample was judged in
    # meaning, as a whole action (decoded to the action_done rule, like a greedy completion; the run is seeded and
    # exact, so no sample of it ends at its budget): this environment cannot tell a repeat from a start.
    n, per_item = len(items), RETRIES * len(SAMPLED_CONDITIONS)
    assert len(judged.calls) == n * (per_item + len(CONDITIONS))
    samples = judged.calls[: n * per_item]
    print("samples judged:", samples)
    assert all(_rule(text) for text, _ in samples)
    contexts = {(c.item_id, c.condition): c.messages for item in items for c in render_conditions(item, env)}
    for k, item in enumerate(items):
        for j, cond in enumerate(SAMPLED_CONDITIONS):
            row = rows[item.item_id, cond]
            mine = samples[k * per_item + j * RETRIES: k * per_item + (j + 1) * RETRIES]
            assert row.sampled_k == RETRIES and 0 <= row.sampled_repeat <= RETRIES, cond
            assert row.sampled_repeat_semantic == sum(same for _, same in mine), cond
            # Each condition's samples were drawn from that condition's own context, at temperature 1.
            drawn = [r for r in sampled_requests if r.id.startswith(f"{item.item_id}::{cond}#")]
            assert len(drawn) == RETRIES and {r.messages for r in drawn} == {contexts[item.item_id, cond]}, cond
        for cond in set(CONDITIONS) - set(SAMPLED_CONDITIONS):  # before (the own attempt) and ban (0 by construction)
            assert rows[item.item_id, cond].sampled_k is None, cond


def test_samples_stopped_once_settled_give_the_rows_of_samples_decoded_to_their_end(tiny_model, study_data, tmp_path):
    """The same on-policy item's decode stage twice on an exact type: samples decoded to the action_done rule, and
    samples that also stop once their text rules out both repeats (sample_done). Fewer sampled tokens, the same
    rows: the counts are all the study keeps of a sample."""
    from fastscore.selection import ModelSelection
    from fastscore.study.stages.onpolicy import ModelFailureBuilder
    from fastscore.study.stages.decode import DecodePlan, greedy_stage
    from fastscore.study.stages.score import score_stage
    from fastscore.study.stages.store import StudyStore

    rows, sampled_tokens = {}, {}
    with ModelSelection.resolve(str(tiny_model("llama")), "llamacpp", "f32", threads=2).open() as scorer:
        items, skipped = ModelFailureBuilder(_words_env(study_data, _Judged()), scorer, SEED, max_new_tokens=16).build(1)
        assert items, [s.reason for s in skipped]
        greedy = scorer.greedy
        for settle in (False, True):
            env, out = _words_env(study_data, _Judged(), settle), tmp_path / f"settle-{settle}"
            store = StudyStore(out)
            store.start({"test": 1}, resume=False)
            score_stage(store, scorer, {env.name: env}, items)
            tokens = sampled_tokens[settle] = []

            def recording_greedy(requests, **kw):
                results = greedy(requests, **kw)
                tokens.extend(len(r.token_ids) for r, t in zip(results, kw["temperature"], strict=True) if t)
                return results

            scorer.greedy = recording_greedy
            greedy_stage(store, scorer, {env.name: env}, items, lambda _: 16, DecodePlan(False, RETRIES, SEED))
            scorer.greedy = greedy
            rows[settle] = (out / "scores.jsonl").read_text()
    print("sampled tokens, to the end vs settled:", sum(sampled_tokens[False]), sum(sampled_tokens[True]))
    assert len(sampled_tokens[True]) == len(sampled_tokens[False]) > 0
    assert sum(sampled_tokens[True]) < sum(sampled_tokens[False])
    assert rows[True] == rows[False]


def test_a_prefix_ban_can_be_asked_per_request_beside_text_bans_in_one_call(smollm_tokenizer):
    """The decoder ban of a model's own action the harness cut: no completion may start with it; in the same call a
    text ban (a seeded action's) still forbids only the exact text."""
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer)
    context = (Message("user", "Name a colour."),)
    free = scorer.greedy([GreedyRequest("g", context)], max_new_tokens=6)[0]
    start = smollm_tokenizer.decode(free.token_ids[:3])
    by_prefix, by_text = scorer.greedy([GreedyRequest("p", context, banned=(start,), ban_prefix=True),
                                        GreedyRequest("t", context, banned=(start,))], max_new_tokens=6)
    assert by_text.token_ids == free.token_ids  # the exact 3-token text is not the 6-token completion
    assert not by_prefix.text.lstrip().startswith(start.strip()) and by_prefix.banned_steps > 0
