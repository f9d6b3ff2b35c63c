"""Stage 2: every condition decoded greedily; with the stored log-probs, each item's ScoreRows go to scores.jsonl."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from fastscore.records import GreedyResult
from fastscore.study.conditions import CONDITIONS, by_condition, distinct, render_conditions
from fastscore.study.envs.base import StudyEnv
from fastscore.study.isolate import call_isolating, chunks
from fastscore.study.items import Item
from fastscore.study.onpolicy import own_attempt
from fastscore.study.rows import score_rows
from fastscore.study.stages import errored_at, store_results
from fastscore.study.store import StudyStore

ITEMS_PER_GREEDY_CALL = 4  # x 7 distinct contexts decoded side by side


def greedy_budget(cap: int, lp_record: dict[str, Any]) -> int:
    """Greedy tokens for one item: twice its longest candidate (counts include the end-of-turn token), rounded
    up to a multiple of 16, at most `cap`. Enough to reproduce any candidate or write a different answer of similar
    length; a small model's rambling beyond that decides no metric and would dominate the run time."""
    longest = max(max(scored["cand_n_tokens"]) for scored in lp_record["conditions"].values())
    return min(cap, -(-2 * longest // 16) * 16)


def greedy_stage(store: StudyStore, scorer, envs: Mapping[str, StudyEnv], items: Sequence[Item],
                 new_tokens: Callable[[str], int], *, progress: bool = False,
                 after_item: Callable[[str, str], None] | None = None) -> None:
    """Decode every condition greedily and append each item's complete ScoreRows to scores.jsonl.

    Decoder calls hold fixed chunks of each environment's scored items (as in score_stage), one call per distinct
    token budget (greedy_budget) in a chunk, so an item's completions depend only on the item. An on-policy item's
    `before` completion is the model's own attempt it was built from (see own_attempt), not decoded again.
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
                members = [item for item in chunk if item.item_id not in failed_here]
                contexts = {item.item_id: render_conditions(item, envs[env]) for item in members}
                stands_for = {i: distinct(c, lambda x: (x.messages, x.banned)) for i, c in contexts.items()}
                budgets = {i: greedy_budget(new_tokens(env), lp[i][0]) for i in contexts}
                results: dict[str, list[GreedyResult]] = {}
                failed: dict[str, Exception] = {}
                attempts = {item.item_id: own_attempt(item) for item in members}
                for budget in sorted(set(budgets.values())):
                    requests = {i: [c.greedy_request() for c in cs if stands_for[i][c.condition] == c.condition
                                    and not (c.condition == "before" and attempts[i] is not None)]
                                for i, cs in contexts.items() if budgets[i] == budget}
                    decode = lambda reqs, n=budget: scorer.greedy(reqs, max_new_tokens=n)  # noqa: E731
                    ok, bad = call_isolating(decode, requests, lambda r: r.id)
                    results.update(ok)
                    failed.update(bad)

                def stored(item: Item) -> None:
                    by_cond = by_condition(results[item.item_id])
                    if attempts[item.item_id] is not None:
                        by_cond["before"] = attempts[item.item_id]
                    greedy = {c: by_cond[rep] for c, rep in stands_for[item.item_id].items()}
                    rows = score_rows(item, lp[item.item_id][0], greedy, envs[item.env])
                    scores_log.append([row.to_dict() for row in rows])

                store_results("greedy", members, done, failed, err_log, stored, bar, after_item)
