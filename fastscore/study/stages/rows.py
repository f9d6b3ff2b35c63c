"""One item's ScoreRows: its stored candidate-set scores and its greedy completions, judged by its environment."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from fastscore.records import GreedyResult
from fastscore.study.data.conditions import CONDITIONS, GAIN_UNDEFINED, banned_candidate_lp
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.data.items import Item
from fastscore.study.data.score_row import ScoreRow, candidate_probabilities


def failure_kind(item: Item) -> str:
    """The item's mutation kind; for the model's own failure, what the runtime or the tests said ("model:<kind>")."""
    if item.failure_kind != "model":
        return item.failure_kind
    return "model:" + str(item.meta.get("runtime_kind") or item.meta.get("status") or "unknown")


def edited_tokens(failed: Sequence[int], correct: Sequence[int]) -> tuple[bool, ...]:
    """Per token of the failed action: True where it is not part of a run of tokens shared with the correct action
    (the edit), by a longest-matching-blocks alignment of the two token sequences."""
    shared = [False] * len(failed)
    for block in difflib.SequenceMatcher(None, list(failed), list(correct), autojunk=False).get_matching_blocks():
        for k in range(block.a, block.a + block.size):
            shared[k] = True
    return tuple(not s for s in shared)


def reproduces(result: GreedyResult, scored_ids: Sequence[int], end_of_turn: bool) -> bool:
    """Is a completion the scored continuation token for token? With end-of-turn scored: exactly its tokens, then
    the end of the turn. Without: an action the harness cut after its last token (the model's own attempt, which
    wrote on), so a completion that starts with its tokens is cut at the same token and is the same action."""
    if end_of_turn:
        return result.stopped_by == "end_of_turn" and list(result.token_ids) == list(scored_ids[:-1])
    return list(result.token_ids[: len(scored_ids)]) == list(scored_ids)


def score_rows(item: Item, lp_record: dict[str, Any], greedy: dict[str, GreedyResult], env: StudyEnv,
               decoded: dict[str, bool] | None = None, samples: dict[str, tuple[int, int, int]] | None = None
               ) -> list[ScoreRow]:
    """`decoded[c]` False: c's completion was read off the argmax chain; `samples[c]` = (k, repeats token for token,
    repeats in meaning) of the samples drawn from c's context."""
    rows = []
    for cond in CONDITIONS:
        scored, completion = lp_record["conditions"][cond], greedy[cond]
        cand_lp, n = scored["cand_lp"], scored["cand_n_tokens"]
        if cond == "ban":
            cand_lp = banned_candidate_lp(cand_lp)
            p, p_norm = candidate_probabilities(cand_lp, n)
        else:
            p, p_norm = scored["p"][0], scored["p_norm"][0]
        ids = scored.get("cand_token_ids")
        token_lp = edited = None
        if ids is not None and cond not in GAIN_UNDEFINED:
            token_lp, edited = scored["cand_token_lp"][0], edited_tokens(ids[0], ids[1])
        k, repeats, semantic = (samples or {}).get(cond, (None, None, None))
        attempt = item.meta.get("attempt") if item.failure_kind == "model" else None
        rows.append(ScoreRow(
            item_id=item.item_id, env=item.env, condition=cond, lp=cand_lp[0], n_tokens=n[0], cand_lp=cand_lp,
            cand_n_tokens=n, p_repeat=p, p_repeat_norm=p_norm, greedy=completion.text,
            greedy_repeat=(reproduces(completion, ids[0], scored.get("end_of_turn", True)) if ids is not None
                           else env.same_action(completion.text, item.failed_action)),
            greedy_success=env.evaluate(item.source_id, completion.text).ok,
            banned_mass=completion.banned_mass if cond == "ban" else None,
            failure_kind=failure_kind(item),
            greedy_repeat_program=env.same_action(completion.text, item.failed_action),
            greedy_repeat_semantic=env.repeats_failure(item, completion.text),
            greedy_decoded=None if decoded is None else decoded.get(cond, True),
            token_lp=token_lp, token_edited=edited, sampled_k=k, sampled_repeat=repeats,
            sampled_repeat_semantic=semantic,
            action_cut=None if attempt is None else attempt.get("stopped_by"),
            scored_end_of_turn=None if ids is None else bool(scored.get("end_of_turn", True)),
        ))
    return rows
