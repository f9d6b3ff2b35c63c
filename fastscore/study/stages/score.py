"""Stage 1: every condition's candidate-set log-probs, appended per item to logprobs.jsonl."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from fastscore.records import CandidateSetResult
from fastscore.study.data.conditions import by_condition, distinct, render_conditions
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.stages.isolate import call_isolating, chunks
from fastscore.study.stages.lanes import Lanes, as_lanes
from fastscore.study.data.items import Item
from fastscore.study.stages.onpolicy import scored_candidates
from fastscore.study.stages import errored_at, store_results
from fastscore.study.stages.store import StudyStore

# x 6 distinct candidate sets x 4 candidates: one shared prefix trie per call. Items of one environment share the
# system prompt (MBPP) or its preamble (tools), so bigger calls compute more of it once.
ITEMS_PER_SCORE_CALL = 16


def _set_record(result: CandidateSetResult) -> dict[str, Any]:
    # Token-level scores of every candidate: the copy control's shared/edited split and the argmax chain (a greedy
    # decode reproduces a candidate token for token iff each of its scored tokens, end-of-turn included, is the argmax).
    return {"cand_lp": [r.logprob for r in result.results], "cand_n_tokens": [r.n_tokens for r in result.results],
            "p": list(result.probs), "p_norm": list(result.probs_per_token),
            "cand_token_ids": [list(r.token_ids) for r in result.results],
            "cand_token_lp": [list(r.token_logprobs) for r in result.results],
            "cand_argmax": [bool(all(r.token_is_argmax)) for r in result.results],
            "cand_straddles": [r.boundary_straddles for r in result.results],
            "end_of_turn": bool(result.results[0].includes_end_of_turn)}


def score_stage(store: StudyStore, scorer, envs: Mapping[str, StudyEnv], items: Sequence[Item], *,
                progress: bool = False, after_item: Callable[[str, str], None] | None = None,
                split: bool = False) -> None:
    """Append each item's candidate-set log-probs under every condition to logprobs.jsonl.

    Scorer calls always hold the same items (fixed chunks of the item list, minus items that failed here), also
    when a resumed run needs only some of them: numbers must not depend on where a run was interrupted, and an
    engine's floating-point results may depend on what else is in its batch.

    `scorer`: a Scorer, or Lanes. With `split` (an exact, batch-invariant type: a score is the same bits whatever
    else its call holds) each chunk is scored as one call per lane, its items dealt out by size, the lanes side by
    side; otherwise each chunk is one call on the first lane with every lane's threads.
    """
    lanes = as_lanes(scorer)
    lp_log, err_log = store.logprobs(), store.item_errors()
    errors = err_log.load()
    done = set(lp_log.load()) | set(errors)
    failed_here = errored_at(errors, "score")
    parts = len(lanes.scorers) if split else 1
    plans = [_plan_chunk(chunk, envs, failed_here, parts) for chunk in chunks(items, ITEMS_PER_SCORE_CALL)
             if not all(item.item_id in done for item in chunk)]
    jobs = [(plan, part) for plan in plans for part in plan.parts]
    with tqdm(total=len(items), initial=sum(item.item_id in done for item in items), desc="score candidate sets",
              unit="item", disable=not progress) as bar, contextlib.closing(_scored(lanes, jobs, parts)) as scored:
        for (plan, part), (results, failed) in scored:
            plan.results.update(results)
            plan.failed.update(failed)
            plan.waiting -= 1
            if plan.waiting:
                continue

            def stored(item: Item, plan: _ChunkPlan = plan) -> None:
                by_cond = by_condition(plan.results[item.item_id])
                conds = {c: _set_record(by_cond[rep]) for c, rep in plan.stands_for[item.item_id].items()}
                lp_log.append([{"item_id": item.item_id, "env": item.env, "conditions": conds}])

            store_results("score", plan.members, done, plan.failed, err_log, stored, bar, after_item)
            plan.results.clear()  # stored: a long stage holds only the chunks still being scored


@dataclass
class _ChunkPlan:
    """One chunk's scorer requests, in `parts` (one call each), and the results as the calls finish."""
    members: list[Item]
    stands_for: dict[str, dict[str, str]]  # item -> condition -> the condition whose context it shares
    parts: list[dict[str, list]]  # item -> its candidate-set requests, per call
    waiting: int = 0
    results: dict[str, list[CandidateSetResult]] = field(default_factory=dict)
    failed: dict[str, Exception] = field(default_factory=dict)


def _plan_chunk(chunk: Sequence[Item], envs: Mapping[str, StudyEnv], failed_here: set[str], parts: int
                ) -> _ChunkPlan:
    members = [item for item in chunk if item.item_id not in failed_here]
    contexts = {item.item_id: render_conditions(item, envs[item.env]) for item in members}
    stands_for = {i: distinct(c, lambda x: x.messages) for i, c in contexts.items()}
    by_id = {item.item_id: item for item in members}
    requests = {i: [c.candidate_set(scored_candidates(by_id[i])) for c in cs
                    if stands_for[i][c.condition] == c.condition] for i, cs in contexts.items()}
    split = _dealt(requests, parts)
    return _ChunkPlan(members, stands_for, split, waiting=len(split))


def _dealt(requests: dict[str, list], parts: int) -> list[dict[str, list]]:
    """The items' requests dealt into at most `parts` calls of about equal size (characters of their messages and
    candidates): each item, largest first, to the call that holds the fewest so far. One call holds them all in the
    chunk's order."""
    if parts <= 1 or len(requests) <= 1:
        return [requests]
    size = {i: sum(_chars(r) for r in reqs) for i, reqs in requests.items()}
    calls: list[dict[str, list]] = [{} for _ in range(min(parts, len(requests)))]
    held = [0] * len(calls)
    for i in sorted(requests, key=lambda i: -size[i]):
        k = held.index(min(held))
        calls[k][i] = requests[i]
        held[k] += size[i]
    return calls


def _chars(request) -> int:
    text = len(request.prompt or "") + sum(len(m.content or "") + len(str(m.tool_calls)) for m in request.messages)
    return text + sum(len(c if isinstance(c, str) else c.text) for c in request.candidates)


def _scored(lanes: Lanes, jobs: list, parts: int) -> Iterator:
    """((plan, part), (results per item, errors per item)) for every job in order: each part one call."""
    def score(job, scorer):
        return call_isolating(scorer.score_candidates, job[1], lambda r: r.id)
    if parts > 1:
        yield from lanes.ordered(jobs, score)
        return
    with lanes.solo() as scorer:
        for job in jobs:
            yield job, score(job, scorer)
