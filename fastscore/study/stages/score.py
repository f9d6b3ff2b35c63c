"""Stage 1: every condition's candidate-set log-probs, appended per item to logprobs.jsonl."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from fastscore.records import CandidateSetResult
from fastscore.study.data.conditions import by_condition, distinct, render_conditions
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.stages.isolate import call_isolating, chunks
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
                progress: bool = False, after_item: Callable[[str, str], None] | None = None) -> None:
    """Append each item's candidate-set log-probs under every condition to logprobs.jsonl.

    Scorer calls always hold the same items (fixed chunks of the item list, minus items that failed here), also
    when a resumed run needs only some of them: numbers must not depend on where a run was interrupted, and an
    engine's floating-point results may depend on what else is in its batch.
    """
    lp_log, err_log = store.logprobs(), store.item_errors()
    errors = err_log.load()
    done = set(lp_log.load()) | set(errors)
    failed_here = errored_at(errors, "score")
    with tqdm(total=len(items), initial=sum(item.item_id in done for item in items), desc="score candidate sets",
              unit="item", disable=not progress) as bar:
        for chunk in chunks(items, ITEMS_PER_SCORE_CALL):
            if all(item.item_id in done for item in chunk):
                continue
            members = [item for item in chunk if item.item_id not in failed_here]
            contexts = {item.item_id: render_conditions(item, envs[item.env]) for item in members}
            stands_for = {i: distinct(c, lambda x: x.messages) for i, c in contexts.items()}
            by_id = {item.item_id: item for item in members}
            requests = {i: [c.candidate_set(scored_candidates(by_id[i])) for c in cs
                            if stands_for[i][c.condition] == c.condition] for i, cs in contexts.items()}
            results, failed = call_isolating(scorer.score_candidates, requests, lambda r: r.id)

            def stored(item: Item) -> None:
                by_cond = by_condition(results[item.item_id])
                conds = {c: _set_record(by_cond[rep]) for c, rep in stands_for[item.item_id].items()}
                lp_log.append([{"item_id": item.item_id, "env": item.env, "conditions": conds}])

            store_results("score", members, done, failed, err_log, stored, bar, after_item)
