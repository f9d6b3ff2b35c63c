"""Stage 2: each condition's greedy completion and (on-policy items) sampled completions; with the stored log-probs,
each item's ScoreRows go to scores.jsonl.

Decoding is done only where a completion is needed. On an exact backend, greedy decoding reproduces a scored
candidate token for token exactly when each of its scored tokens (end-of-turn included) was the argmax in the scoring
pass, so where a candidate's argmax chain is complete the completion is that candidate and nothing is decoded. The
rest (no candidate's chain complete, the decoder ban, the model's own attempt) is decoded, each request up to its
item's budget and, where the environment has one, its action_done rule (MBPP: one token after the closed program,
ending as ACTION_DONE unless that token ends the turn; no metric reads what a model writes after it). On-policy items
also get k sampled completions under every record and from the clean context (SAMPLED_CONDITIONS; temperature 1.0,
each from a generator seeded by the run's seed and the sample's id), decoded like the greedy completions and in the
same decoder call (same budget, same action_done rule; each context computed once for both) and judged like them:
token for token and in meaning (StudyEnv.repeats_failure). So "repeats after a failure" is compared with "repeats
after any record of the same action", sampled as well as greedy. Only the counts of a sample are kept, so it also
stops once its text rules out both repeats (sample_done).
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from fastscore.decode import ActionDone
from fastscore.records import GreedyRequest, GreedyResult
from fastscore.study.data.conditions import (
    CONDITIONS, RECORD_CONDITIONS, REFERENCE, ConditionContext, by_condition, distinct, render_conditions,
)
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.stages.isolate import ITEM_LEVEL_ERRORS, call_isolating, chunks
from fastscore.study.stages.decode_queue import served
from fastscore.study.stages.lanes import as_lanes
from fastscore.study.data.items import Item
from fastscore.study.stages.onpolicy import KnownAttempts, own_attempt
from fastscore.study.stages.rows import reproduces, score_rows
from fastscore.study.stages import errored_at, store_results
from fastscore.study.stages.store import StudyStore

log = logging.getLogger(__name__)

# Items per decoder call at most: each with up to 7 distinct contexts and, on-policy, 6 x retries samples (the
# scorer keeps up to 32 sequences live)
ITEMS_PER_GREEDY_CALL = 8
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
    # A completion is the same bits whichever call decodes it (an exact, batch-invariant type on a backend whose
    # steps give a prefill's bits, Backend.steps_match_prefill), so the lanes may decode from one queue.
    exact: bool = False


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
                 after_item: Callable[[str, str], None] | None = None, known: KnownAttempts | None = None) -> None:
    """Complete every condition and append each item's ScoreRows to scores.jsonl.

    Decoder calls hold fixed chunks of each environment's scored items (ITEMS_PER_GREEDY_CALL): per chunk one call of
    its greedy requests and, for on-policy items, its sampled ones (DecoderCall), each request with its item's own
    token budget (greedy_budget). An on-policy item's `before` completion is the model's own attempt it was built
    from (see own_attempt), not decoded again. `scorer`: a Scorer, or Lanes. Where a completion is the same bits in
    any call (plan.exact) every lane serves the calls' items from one queue (decode_queue.served); elsewhere each
    call runs whole on a lane, longest first. Either way the completions are judged and stored in chunk order, in
    this thread, so the rows are those of one lane. `known`:
    where given, each seeded item's `before` completion is remembered there for the model's own attempts at the same
    source.
    """
    lp = store.logprobs().load()
    err_log = store.item_errors()
    errors = err_log.load()
    scores_log = store.scores(rows_per_item=len(CONDITIONS))
    done = set(scores_log.load()) | set(errors)
    failed_here = errored_at(errors, "greedy")
    scored = [item for item in items if item.item_id in lp]
    lanes = as_lanes(scorer)
    chunk_plans = []
    for env in envs:
        mine = [item for item in scored if item.env == env]
        for chunk in chunks(mine, ITEMS_PER_GREEDY_CALL):
            if all(item.item_id in done for item in chunk):
                continue
            # A resumed chunk decodes only what is not stored yet.
            members = [item for item in chunk if item.item_id not in failed_here and item.item_id not in done]
            chunk_plans.append(_plan_chunk(members, lp, lanes.first.tokenizer, envs[env], new_tokens(env), plan))
    calls = [chunk_plan.call for chunk_plan in chunk_plans if chunk_plan.call is not None]
    # Where a completion is the same bits in any call, every lane decodes from one queue (stages/decode_queue.py);
    # elsewhere its last bits may depend on its call, so each call is decoded as planned, on whichever lane. A lone
    # item is one call, which runs on every lane's threads (Lanes.ordered), where a queue would leave a lane idle.
    if plan.exact and sum(len(call.requests) for call in calls) > 1 and lanes.first.can_serve_greedy():
        finished = served(lanes, calls)
    else:
        finished = lanes.ordered(calls, lambda call, lane: call.run(lane), cost=lambda call: call.cost)
    # closing: an error while judging or storing (a sandbox run, the disk) also stops the lanes' calls
    with contextlib.closing(finished), tqdm(total=len(scored), initial=sum(item.item_id in done for item in scored),
                                            desc="greedy decoding", unit="item", disable=not progress) as bar:
        for chunk_plan in chunk_plans:
            if chunk_plan.call is not None:
                _call, (ok, failed) = next(finished)
                chunk_plan.take(ok, failed)
            env, completions, failed = chunk_plan.env, chunk_plan.completions, chunk_plan.failed
            samples = _judge_samples(chunk_plan, lp)

            def stored(item: Item) -> None:
                i = item.item_id
                greedy = {c: completions[i][rep] for c, rep in chunk_plan.stands_for[i].items()}
                made = {c: rep in chunk_plan.decoded[i] or rep == REFERENCE and chunk_plan.attempts[i] is not None
                        for c, rep in chunk_plan.stands_for[i].items()}
                rows = score_rows(item, lp[i][0], greedy, env, made, samples.get(i))
                scores_log.append([row.to_dict() for row in rows])
                if known is not None and chunk_plan.attempts[i] is None:
                    known.remember(i, env.context_messages(item), greedy[REFERENCE])

            store_results("greedy", chunk_plan.members, done, failed, err_log, stored, bar, after_item)


@dataclass(frozen=True)
class DecoderCall:
    """A chunk's one Scorer.greedy call: per item, its greedy requests, then (on-policy items) its sampled ones.

    Greedy and sampled requests of one context share a call so that the decoder computes the context once: a sample
    joins as a copy of a stream that holds it. Sampled ones draw from their own generators, so on an exact type, on a
    backend whose steps give a prefill's bits, each completion is the one a call of its own would give."""
    greedy: dict[str, list[GreedyRequest]]
    sampled: dict[str, list[GreedyRequest]]
    cap: int
    seed: int

    @property
    def requests(self) -> dict[str, list[GreedyRequest]]:
        return {i: self.greedy.get(i, []) + self.sampled.get(i, []) for i in (*self.greedy, *self.sampled)}

    @property
    def cost(self) -> int:
        """Tokens it may decode at most: which call a free lane takes first (longest first)."""
        return sum(r.max_new_tokens or self.cap for reqs in self.requests.values() for r in reqs)

    def sampled_ids(self) -> frozenset[str]:
        return frozenset(r.id for reqs in self.sampled.values() for r in reqs)

    def run(self, scorer) -> tuple[dict[str, list[GreedyResult]], dict[str, Exception]]:
        """Results per item in its requests' order (greedy, then sampled), and the items that failed."""
        return call_isolating(lambda reqs: scorer.greedy(reqs, **self._decoding(reqs)), self.requests,
                              lambda r: r.id)

    def units(self, scorer, tag, failed: dict[str, Exception]) -> dict[str, Any]:
        """Each item's requests as a unit for Scorer.serve_greedy, keyed (tag, item id); an item the scorer rejects
        goes to `failed` instead, as `run` would leave it out."""
        out = {}
        for item_id, reqs in self.requests.items():
            try:
                out[item_id] = scorer.greedy_unit((tag, item_id), reqs, **self._decoding(reqs))
            except ITEM_LEVEL_ERRORS as exc:
                log.warning("item %s: %s", item_id, exc)
                failed[item_id] = exc
        return out

    def _decoding(self, reqs: list[GreedyRequest]) -> dict[str, Any]:
        """The budget cap, temperatures and generators of `reqs`: 0 for greedy ones, RETRY_TEMPERATURE with a fresh
        generator (retry_rng) for sampled ones."""
        sampled_ids = self.sampled_ids()
        sampled = [r.id in sampled_ids for r in reqs]
        return {"max_new_tokens": self.cap, "temperature": [RETRY_TEMPERATURE if s else 0.0 for s in sampled],
                "rngs": [retry_rng(self.seed, r.id) if s else None for r, s in zip(reqs, sampled)]}


@dataclass
class ChunkPlan:
    """One chunk's completions: those known before decoding (the argmax chain, the model's own attempt), the
    decoder call for the rest, and, once it finishes, its results."""
    env: StudyEnv
    members: list[Item]
    stands_for: dict[str, dict[str, str]]  # item -> condition -> the condition whose context it shares
    completions: dict[str, dict[str, GreedyResult]]  # item -> condition -> greedy completion
    decoded: dict[str, set[str]]  # item -> conditions decoded (not read off the argmax chain or the attempt)
    attempts: dict[str, GreedyResult | None]
    call: DecoderCall | None
    retries: int
    failed: dict[str, Exception] = field(default_factory=dict)
    # on-policy item -> condition -> its k sampled completions
    sampled: dict[str, dict[str, list[GreedyResult]]] = field(default_factory=dict)

    def take(self, ok: dict[str, list[GreedyResult]], failed: dict[str, Exception]) -> None:
        """The finished call's results; an item that failed is judged on neither its greedy nor its sampled ones."""
        call = self.call
        self.failed.update(failed)
        k = self.retries  # an item's samples come in its requests' order: condition by condition, k each
        for i, got in ok.items():
            n_greedy = len(call.greedy.get(i, ()))
            self.completions[i].update(by_condition(got[:n_greedy]))
            if i in call.sampled:
                mine = got[n_greedy:]
                self.sampled[i] = {cond: mine[n * k : (n + 1) * k] for n, cond in enumerate(SAMPLED_CONDITIONS)}


def _plan_chunk(members: list[Item], lp, tokenizer, env: StudyEnv, cap: int, plan: DecodePlan) -> ChunkPlan:
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
                chain = chain_completion(c.request_id, lp[i][0]["conditions"][c.condition], tokenizer)
            if chain is not None:
                results[i][c.condition] = chain
            else:
                to_decode[i].append(replace(c.greedy_request(), max_new_tokens=budgets[i], action_done=action_done))
    decoded = {i: {r.id.rsplit("::", 1)[1] for r in reqs} for i, reqs in to_decode.items()}
    # One call for the whole chunk: each request stops at its own budget, so items of different budgets share the
    # decoder's batches instead of each budget rebuilding the decoder for a few contexts.
    greedy = {i: reqs for i, reqs in to_decode.items() if reqs}
    sampled = _sample_requests(members, contexts, budgets, env, plan, tokenizer) if plan.retries else {}
    call = DecoderCall(greedy, sampled, cap, plan.seed) if greedy or sampled else None
    return ChunkPlan(env, members, stands_for, results, decoded, attempts, call, plan.retries)


def sample_request_id(item_id: str, condition: str, k: int) -> str:
    return f"{item_id}::{condition}#{k}"


def _sample_requests(members: Sequence[Item], contexts: Mapping[str, Sequence[ConditionContext]],
                     budgets: Mapping[str, int], env: StudyEnv, plan: DecodePlan, tokenizer
                     ) -> dict[str, list[GreedyRequest]]:
    """k sampled completions under each SAMPLED_CONDITIONS context of each on-policy item (temperature 1.0, each
    from its own generator, retry_rng)."""
    # A sample is decoded as a greedy completion is (the item's budget, the environment's action_done rule), so the
    # sampled rates are the same measurement as the greedy ones, except that it also stops once its outcome is
    # settled (sample_done). The clean retry's context is before's messages (the failed attempt and its error deleted).
    action_done = env.action_done()
    requests = {}
    for item in members:
        if own_attempt(item) is None:
            continue
        i = item.item_id
        emitted = item.meta.get("emitted")  # None: an item built before actions were kept as emitted scores its text
        emitted_text = item.failed_action if emitted is None else b"".join(
            tokenizer.token_bytes[t] for t in emitted["token_ids"]).decode("utf-8", errors="replace")
        done = sample_done(item, env, emitted_text, action_done)
        messages = {c.condition: c.messages for c in contexts[i]}
        requests[i] = [GreedyRequest(sample_request_id(i, cond, k), messages[cond], max_new_tokens=budgets[i],
                                     action_done=done)
                       for cond in SAMPLED_CONDITIONS for k in range(plan.retries)]
    return requests


def sample_done(item: Item, env: StudyEnv, emitted_text: str, action_done: ActionDone | None) -> ActionDone | None:
    """The stop rule of an on-policy item's sampled completions: the environment's action_done rule, or the sample's
    outcome is settled. A sample counts as a repeat token for token (its text then starts as the emitted failed
    action's text does, or extends it) or in meaning (env.may_repeat); where its text so far rules out both,
    nothing it writes next changes the counts, which are all the study keeps of a sample. Either rule, once it
    holds, ends the sample one token later, as action_done does (the decoder reads a rule until it first holds).
    `emitted_text`: the text of the failed action's emitted tokens."""
    possible = env.may_repeat(item)
    if possible is None:
        return action_done
    exact = emitted_text.rstrip("\ufffd")  # emitted tokens may end inside a character that a longer sample completes

    def done(head: str) -> bool:
        if action_done is not None and action_done(head):
            return True
        if "\ufffd" in head:  # part of a character, or an undecodable byte: not judged
            return False
        return not (exact.startswith(head) or head.startswith(exact)) and not possible(head)
    return done


def _judge_samples(chunk: ChunkPlan, lp) -> dict[str, dict[str, tuple[int, int, int]]]:
    """{item: {condition: (k, repeats token for token, repeats in meaning)}} of the chunk's sampled completions."""
    by_id = {item.item_id: item for item in chunk.members}
    out: dict[str, dict[str, tuple[int, int, int]]] = {}
    for i, by_condition_sampled in chunk.sampled.items():
        if i in chunk.failed:
            continue
        out[i] = {}
        for cond, mine in by_condition_sampled.items():
            # The failed action as scored under this condition (the same emitted ids under every one).
            rec = lp[i][0]["conditions"][cond]
            repeats = sum(reproduces(r, rec["cand_token_ids"][0], rec.get("end_of_turn", True)) for r in mine)
            semantic = sum(chunk.env.repeats_failure(by_id[i], r.text) for r in mine)
            out[i][cond] = (len(mine), int(repeats), int(semantic))
    return out
