"""Stage 2: each condition's greedy completion and (on-policy items) sampled completions; with the stored log-probs,
each item's ScoreRows go to scores.jsonl.

Decoding is done only where a completion is needed. On an exact backend, greedy decoding reproduces a scored
candidate token for token exactly when each of its scored tokens (end-of-turn included) was the argmax in the scoring
pass, so where a candidate's argmax chain is complete the completion is that candidate and nothing is decoded. The
rest (no candidate's chain complete, the decoder ban, the model's own attempt) is decoded, each request up to its
item's budget and, where the environment has one, its action_done rule (MBPP: one token after the closed program,
ending as ACTION_DONE unless that token ends the turn; no metric reads what a model writes after it). On-policy items
also get k sampled completions under every record and from the clean context (SAMPLED_CONDITIONS; temperature 1.0,
each from a generator seeded by the run's seed and the sample's id), decoded like the greedy completions (same budget,
same action_done rule) and judged like them: token for token and in meaning (StudyEnv.repeats_failure). So "repeats
after a failure" is compared with "repeats after any record of the same action", sampled as well as greedy.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from fastscore.records import GreedyRequest, GreedyResult
from fastscore.study.data.conditions import (
    CONDITIONS, RECORD_CONDITIONS, REFERENCE, ConditionContext, by_condition, distinct, render_conditions,
)
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.stages.isolate import call_isolating, chunks
from fastscore.study.data.items import Item
from fastscore.study.stages.onpolicy import own_attempt
from fastscore.study.stages.rows import reproduces, score_rows
from fastscore.study.stages import errored_at, store_results
from fastscore.study.stages.store import StudyStore

ITEMS_PER_GREEDY_CALL = 8  # x up to 7 distinct contexts decoded side by side (the scorer keeps up to 32 live)
RETRY_CONDITION = "clean_retry"
RETRY_TEMPERATURE = 1.0
# Where on-policy items are sampled: every record (after, success, neutral, description, dont_repeat) and the clean
# retry (before's messages). Not `ban`: its decoder refuses the failed action, so a repeat is 0 by construction.
SAMPLED_CONDITIONS = (*RECORD_CONDITIONS, RETRY_CONDITION)


@dataclass(frozen=True)
class DecodePlan:
    argmax_chain: bool  # read greedy completions off the argmax chain (only valid on an exact, batch-invariant type)
    retries: int  # sampled completions per on-policy item and SAMPLED_CONDITIONS condition (0: none)
    seed: int


def greedy_budget(cap: int, lp_record: dict[str, Any]) -> int:
    """Greedy tokens for one item: twice its longest candidate (counts include the end-of-turn token), rounded
    up to a multiple of 16, at most `cap`. Enough to reproduce any candidate or write a different answer of similar
    length; a small model's rambling beyond that decides no metric and would dominate the run time."""
    longest = max(max(scored["cand_n_tokens"]) for scored in lp_record["conditions"].values())
    return min(cap, -(-2 * longest // 16) * 16)


def chain_completion(request_id: str, scored: dict[str, Any], tokenizer) -> GreedyResult | None:
    """The greedy completion the scoring pass already determines: the candidate whose scored tokens were all the
    argmax, end-of-turn included (None if no candidate's chain is complete or a token straddled the boundary)."""
    if not scored.get("end_of_turn") or "cand_argmax" not in scored:
        return None
    for ids, complete, straddles in zip(scored["cand_token_ids"], scored["cand_argmax"], scored["cand_straddles"]):
        if complete and not straddles:
            body = tuple(ids[:-1])
            return GreedyResult(id=request_id, text=tokenizer.decode(body), token_ids=body, stopped_by="end_of_turn")
    return None


def retry_rng(seed: int, request_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(request_id.encode())])


def greedy_stage(store: StudyStore, scorer, envs: Mapping[str, StudyEnv], items: Sequence[Item],
                 new_tokens: Callable[[str], int], plan: DecodePlan, *, progress: bool = False,
                 after_item: Callable[[str, str], None] | None = None) -> None:
    """Complete every condition and append each item's ScoreRows to scores.jsonl.

    Decoder calls hold fixed chunks of each environment's scored items (as in score_stage): one call per chunk, each
    request with its item's own token budget (greedy_budget). An on-policy item's `before` completion is the model's
    own attempt it was built from (see own_attempt), not decoded again.
    """
    lp = store.logprobs().load()
    err_log = store.item_errors()
    errors = err_log.load()
    scores_log = store.scores(rows_per_item=len(CONDITIONS))
    done = set(scores_log.load()) | set(errors)
    failed_here = errored_at(errors, "greedy")
    scored = [item for item in items if item.item_id in lp]
    with tqdm(total=len(scored), initial=sum(item.item_id in done for item in scored), desc="greedy decoding",
              unit="item", disable=not progress) as bar:
        for env in envs:
            for chunk in chunks([item for item in scored if item.env == env], ITEMS_PER_GREEDY_CALL):
                if all(item.item_id in done for item in chunk):
                    continue
                # A resumed chunk decodes only what is not stored yet.
                members = [item for item in chunk if item.item_id not in failed_here and item.item_id not in done]
                _complete_chunk(members, lp, scorer, envs[env], new_tokens(env), plan, done, err_log, scores_log,
                                bar, after_item)


def _complete_chunk(members, lp, scorer, env: StudyEnv, cap: int, plan: DecodePlan, done, err_log, scores_log, bar,
                    after_item) -> None:
    contexts = {item.item_id: render_conditions(item, env) for item in members}
    stands_for = {i: distinct(c, lambda x: (x.messages, x.banned)) for i, c in contexts.items()}
    budgets = {i: greedy_budget(cap, lp[i][0]) for i in contexts}
    results: dict[str, dict[str, GreedyResult]] = {i: {} for i in contexts}
    to_decode: dict[str, list[GreedyRequest]] = {i: [] for i in contexts}
    attempts = {item.item_id: own_attempt(item) for item in members}
    action_done = env.action_done()
    for i, conds in contexts.items():
        for c in conds:
            if stands_for[i][c.condition] != c.condition:
                continue
            if c.condition == REFERENCE and attempts[i] is not None:
                results[i][c.condition] = attempts[i]
                continue
            chain = None
            if plan.argmax_chain and not c.banned:
                chain = chain_completion(c.request_id, lp[i][0]["conditions"][c.condition], scorer.tokenizer)
            if chain is not None:
                results[i][c.condition] = chain
            else:
                to_decode[i].append(replace(c.greedy_request(), max_new_tokens=budgets[i], action_done=action_done))
    decoded = {i: {r.id.rsplit("::", 1)[1] for r in reqs} for i, reqs in to_decode.items()}
    # One call for the whole chunk: each request stops at its own budget, so items of different budgets share the
    # decoder's batches instead of each budget rebuilding the decoder for a few contexts.
    decode = lambda reqs: scorer.greedy(reqs, max_new_tokens=cap)  # noqa: E731
    ok, failed = call_isolating(decode, {i: reqs for i, reqs in to_decode.items() if reqs}, lambda r: r.id)
    for i, got in ok.items():
        results[i].update(by_condition(got))
    samples = _sampled_repeats(members, contexts, lp, scorer, env, cap, plan, failed) if plan.retries else {}

    def stored(item: Item) -> None:
        i = item.item_id
        greedy = {c: results[i][rep] for c, rep in stands_for[i].items()}
        made = {c: rep in decoded[i] or rep == REFERENCE and attempts[i] is not None
                for c, rep in stands_for[i].items()}
        rows = score_rows(item, lp[i][0], greedy, env, made, samples.get(i))
        scores_log.append([row.to_dict() for row in rows])

    store_results("greedy", members, done, failed, err_log, stored, bar, after_item)


def sample_request_id(item_id: str, condition: str, k: int) -> str:
    return f"{item_id}::{condition}#{k}"


def _sampled_repeats(members: Sequence[Item], contexts: Mapping[str, Sequence[ConditionContext]], lp, scorer,
                     env: StudyEnv, cap: int, plan: DecodePlan, failed: dict[str, Exception]
                     ) -> dict[str, dict[str, tuple[int, int, int]]]:
    """k sampled completions under each SAMPLED_CONDITIONS context of each on-policy item:
    {item: {condition: (k, repeats token for token, repeats in meaning)}}."""
    targets = [item for item in members if own_attempt(item) is not None and item.item_id not in failed]
    if not targets:
        return {}
    # A sample is decoded as a greedy completion is (the item's budget, the environment's action_done rule), not
    # stopped once its text leaves the failed action's: the semantic judge needs the whole action, since a sample
    # that spells the same call or program differently (other quoting, spacing, argument order, a preamble) repeats
    # it in meaning. The same budget and stop rule also make the sampled rates the same measurement as the greedy
    # ones. The clean retry's context is before's messages (the failed attempt and its error deleted).
    action_done = env.action_done()
    requests, condition_of = {}, {}
    for item in targets:
        i, budget = item.item_id, greedy_budget(cap, lp[item.item_id][0])
        messages = {c.condition: c.messages for c in contexts[i]}
        requests[i] = []
        for cond in SAMPLED_CONDITIONS:
            for k in range(plan.retries):
                condition_of[sample_request_id(i, cond, k)] = cond
                requests[i].append(GreedyRequest(sample_request_id(i, cond, k), messages[cond],
                                                 max_new_tokens=budget, action_done=action_done))

    def sample(reqs: list[GreedyRequest]) -> list[GreedyResult]:
        rngs = [retry_rng(plan.seed, r.id) for r in reqs]
        return scorer.greedy(reqs, max_new_tokens=cap, temperature=RETRY_TEMPERATURE, rngs=rngs)

    ok, bad = call_isolating(sample, requests, lambda r: r.id)
    failed.update(bad)
    by_id = {item.item_id: item for item in targets}
    out: dict[str, dict[str, tuple[int, int, int]]] = {}
    for i, got in ok.items():
        by_condition_sampled: dict[str, list[GreedyResult]] = {cond: [] for cond in SAMPLED_CONDITIONS}
        for result in got:
            by_condition_sampled[condition_of[result.id]].append(result)
        out[i] = {}
        for cond, mine in by_condition_sampled.items():
            # The failed action as scored under this condition (the same emitted ids under every one).
            rec = lp[i][0]["conditions"][cond]
            repeats = sum(reproduces(r, rec["cand_token_ids"][0], rec.get("end_of_turn", True)) for r in mine)
            semantic = sum(env.repeats_failure(by_id[i], r.text) for r in mine)
            out[i][cond] = (len(mine), int(repeats), int(semantic))
    return out
