"""The study's greedy stage on scripted completions: one decoder call per chunk with each item's own budget, and
item-level errors isolated. Scoring runs on the instrumented fake backend; decoding follows a script, so the
completions are chosen by the test, whatever the contexts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from scorer_helpers import CountingFakeBackend, ScriptedDecoder
from test_mbpp_env import TASKS, write_tasks

from fastscore.scorer import Scorer
from fastscore.study.data.conditions import render_conditions
from fastscore.study.data.envs.mbpp.env import MbppEnv, build_items
from fastscore.study.analysis.metrics import read_score_rows
from fastscore.study.stages.decode import DecodePlan, greedy_budget, greedy_stage
from fastscore.study.stages.score import score_stage
from fastscore.study.stages.store import StudyStore

SEED = 3
CAP = 256


class ScriptedBackend(CountingFakeBackend):
    """The fake backend for scoring; its decoders emit `script` (keyed on the tokens generated so far) for every
    context, and it counts the decoders built."""

    def __init__(self, script: dict[tuple[int, ...], Sequence[int]], fallback: int, n_ctx: int = 4096) -> None:
        super().__init__(n_ctx=n_ctx)
        self.script, self.fallback, self.decoders = script, fallback, 0

    def _decoder(self, max_new_tokens: int):
        self.decoders += 1
        return ScriptedDecoder(self.n_vocab, self.script, self.fallback)


def completion_script(tok, text: str, then: Sequence[int]) -> dict[tuple[int, ...], list[int]]:
    """Emit `text`'s tokens, then the tokens `then` (one per step, each the only scripted choice)."""
    ids = list(tok.encode(text).ids) + list(then)
    return {tuple(ids[:k]): [ids[k]] for k in range(len(ids))}


@pytest.fixture(scope="module")
def mbpp(tmp_path_factory):
    """Two synthetic MBPP items of different lengths (so of different greedy budgets), and their environment."""
    data_dir = write_tasks(tmp_path_factory.mktemp("mbpp"), TASKS[:2])
    items, _ = build_items(data_dir, limit=2, seed=SEED)
    assert len(items) == 2
    return MbppEnv(data_dir), items


def run_stages(tmp_path, env, items, scorer, decode_scorer=None):
    store = StudyStore(tmp_path)
    store.start({"test": 1}, resume=False)
    score_stage(store, scorer, {env.name: env}, items, progress=False)
    greedy_stage(store, decode_scorer or scorer, {env.name: env}, items, lambda _env: CAP, DecodePlan(False, 0, SEED))
    rows = sorted((r.to_dict() for r in read_score_rows(tmp_path / "scores.jsonl")),
                  key=lambda r: (r["item_id"], r["condition"]))
    return store, rows


def test_one_decoder_call_per_chunk_whatever_the_items_budgets(mbpp, smollm_tokenizer, tmp_path):
    env, items = mbpp
    tok = smollm_tokenizer
    script = completion_script(tok, items[0].failed_action, [tok.end_of_turn_id])
    scorer = Scorer(ScriptedBackend(script, fallback=tok.encode(".").ids[0]), tok)
    store, rows = run_stages(tmp_path, env, items, scorer)
    lp = store.logprobs().load()
    budgets = {greedy_budget(CAP, lp[item.item_id][0]) for item in items}
    print("budgets", budgets, "decoders built", scorer.backend.decoders)
    assert len(budgets) == 2  # the items need different budgets, yet share one decoder
    assert scorer.backend.decoders == 1
    assert {r["item_id"] for r in rows} == {item.item_id for item in items}
    # Each completion stops at its item's budget or after the scripted program and end-of-turn.
    mine = [r for r in rows if r["item_id"] == items[0].item_id and r["condition"] == "after"][0]
    assert mine["greedy"] == items[0].failed_action and mine["greedy_repeat"]


def test_an_item_too_long_to_decode_fails_alone(mbpp, smollm_tokenizer, tmp_path):
    """One item's context plus its budget exceeds the decoder's window: that item is recorded as failed at the
    greedy stage, the other item of the same call gets its rows."""
    env, items = mbpp
    tok = smollm_tokenizer
    short, long_ = sorted(items, key=lambda item: len(item.task))
    long_ = replace(long_, task=long_.task + " Please." * 150)
    script = completion_script(tok, short.failed_action, [tok.end_of_turn_id])
    fallback = tok.encode(".").ids[0]
    scorer = Scorer(ScriptedBackend(script, fallback), tok)
    score_store = StudyStore(tmp_path / "probe")
    score_store.start({"test": 1}, resume=False)
    score_stage(score_store, scorer, {env.name: env}, [short], progress=False)
    budget = greedy_budget(CAP, score_store.logprobs().load()[short.item_id][0])
    need = max(len(scorer.context_ids(c.messages)) for c in render_conditions(short, env)) + budget
    narrow = Scorer(ScriptedBackend(script, fallback, n_ctx=need), tok)
    store, rows = run_stages(tmp_path / "run", env, [short, long_], scorer, decode_scorer=narrow)
    errors = store.item_errors().load()
    assert list(errors) == [long_.item_id] and errors[long_.item_id][0]["stage"] == "greedy"
    assert errors[long_.item_id][0]["reason"] == "context too long for the model"
    assert {r["item_id"] for r in rows} == {short.item_id}


class MbppWithoutRule(MbppEnv):
    """The MBPP environment decoding every completion to its end-of-turn or budget (the stage before the rule)."""

    def action_done(self):
        return None


@pytest.mark.parametrize("after_block", ["end_of_turn", "rambles"])
def test_the_mbpp_stop_rule_changes_no_metric(mbpp, smollm_tokenizer, tmp_path, after_block):
    """Every condition's completion is the first item's failed program, then either end-of-turn (the model stops
    anyway: identical rows) or a ramble (only the stored completion text is shorter; every metric, the ban's removed
    mass included, is the same)."""
    env, items = mbpp
    tok = smollm_tokenizer
    then = [tok.end_of_turn_id]
    if after_block == "rambles":
        then = [tok.encode(piece).ids[0] for piece in ("\n", "\n", "This", " works", ".")] + then
    script = completion_script(tok, items[0].failed_action, then)
    fallback = tok.encode(".").ids[0]
    rows = {}
    for name, environment in (("rule", env), ("no rule", MbppWithoutRule(env.data_dir))):
        scorer = Scorer(ScriptedBackend(script, fallback), tok)
        _, rows[name] = run_stages(tmp_path / name.replace(" ", "_"), environment, items, scorer)
    assert len(rows["rule"]) == len(rows["no rule"]) == 2 * 8
    changed: dict[str, set[str]] = {}
    for ruled, free in zip(rows["rule"], rows["no rule"], strict=True):
        diff = {k for k in ruled if ruled[k] != free[k]}
        changed.setdefault(ruled["condition"], set()).update(diff)
        if diff:
            print(ruled["item_id"], ruled["condition"], repr(ruled["greedy"]), "vs", repr(free["greedy"]))
    # Under the ban the model cannot end its turn after the banned program: there it talks on in either case.
    stops_anyway = [c for c in changed if after_block == "end_of_turn" and c != "ban"]
    assert all(changed[c] == set() for c in stops_anyway)
    assert all(changed[c] <= {"greedy"} for c in changed)
    assert any(changed[c] for c in changed)
    mine = {r["condition"]: r for r in rows["rule"] if r["item_id"] == items[0].item_id}
    assert mine["after"]["greedy_repeat"] == (after_block == "end_of_turn")
    assert mine["ban"]["banned_mass"] > 0 and mine["after"]["greedy_repeat_program"]


class CountingScriptedBackend(ScriptedBackend):
    """ScriptedBackend that also counts the contexts its decoders start."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.started = 0

    def _decoder(self, max_new_tokens: int):
        decoder, backend = super()._decoder(max_new_tokens), self
        start = decoder.start

        def counted(contexts):
            backend.started += len(contexts)
            return start(contexts)

        decoder.start = counted
        return decoder


def test_a_resumed_chunk_decodes_only_its_unfinished_items(mbpp, smollm_tokenizer, tmp_path):
    """A run killed after the first item of a greedy chunk was stored: the resumed stage decodes the second item's
    contexts only, and the rows are those of the uninterrupted run."""
    env, items = mbpp
    tok = smollm_tokenizer
    script = completion_script(tok, items[0].failed_action, [tok.end_of_turn_id])
    fallback = tok.encode(".").ids[0]
    whole = Scorer(CountingScriptedBackend(script, fallback), tok)
    _, rows = run_stages(tmp_path, env, items, whole)
    scores = tmp_path / "scores.jsonl"
    lines = scores.read_text().splitlines(keepends=True)
    first = [line for line in lines if items[0].item_id in line]
    scores.write_text("".join(first))  # the second item's rows never written
    store = StudyStore(tmp_path)
    store.start({"test": 1}, resume=True)
    again = Scorer(CountingScriptedBackend(script, fallback), tok)
    greedy_stage(store, again, {env.name: env}, items, lambda _env: CAP, DecodePlan(False, 0, SEED))
    resumed = sorted((r.to_dict() for r in read_score_rows(scores)), key=lambda r: (r["item_id"], r["condition"]))
    print("contexts decoded: whole run", whole.backend.started, "resumed", again.backend.started)
    assert 0 < again.backend.started < whole.backend.started
    assert resumed == rows
