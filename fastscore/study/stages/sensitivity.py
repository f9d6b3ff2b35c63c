"""Stage 3 (optional): the harness-realism checks' candidate sets, appended per item to sensitivity.jsonl.

Scoring only, no decoding, in calls of their own after the study's stages: the study's conditions are scored exactly
as in a run without the checks. Calls hold fixed chunks of the item list, as the scoring stage's do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from fastscore.records import CandidateSetResult
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.stages.isolate import call_isolating, chunks, error_reason
from fastscore.study.data.items import Item
from fastscore.study.analysis.sensitivity import NOT_APPLICABLE, CheckRequests, check_requests
from fastscore.study.stages.score import ITEMS_PER_SCORE_CALL
from fastscore.study.stages.store import StudyStore


def _set_record(result: CandidateSetResult) -> dict[str, Any]:
    return {"cand_lp": [r.logprob for r in result.results], "cand_n_tokens": [r.n_tokens for r in result.results]}


def _item_record(item: Item, plan: Mapping[str, CheckRequests | str], results: Sequence[CandidateSetResult],
                 error: Exception | None) -> dict[str, Any]:
    by_id = {r.id: r for r in results}
    checks: dict[str, Any] = {}
    for check, requests in plan.items():
        if isinstance(requests, str):
            checks[check] = {NOT_APPLICABLE: requests}
        elif error is not None:
            checks[check] = {NOT_APPLICABLE: f"not scored: {error_reason(error)}"}
        else:
            checks[check] = {"sets": {name: _set_record(by_id[s.id]) for name, s in requests.sets.items()},
                             "candidates": [getattr(c, "text", c)  # an emitted action: its decoded text
                                            for c in next(iter(requests.sets.values())).candidates]}
    return {"item_id": item.item_id, "env": item.env, "checks": checks}


def sensitivity_stage(store: StudyStore, scorer, envs: Mapping[str, StudyEnv], items: Sequence[Item], *,
                      progress: bool = False, after_item: Callable[[str, str], None] | None = None) -> None:
    """Append each scored item's check results (or the reason a check does not apply) to sensitivity.jsonl."""
    records = store.sensitivity()
    done = set(records.load())
    scored = set(store.logprobs().load())  # items the study could not score have no headline to compare with
    scored_items = [item for item in items if item.item_id in scored]
    with tqdm(total=len(scored_items), initial=sum(i.item_id in done for i in scored_items), desc="sensitivity checks",
              unit="item", disable=not progress) as bar:
        for chunk in chunks(scored_items, ITEMS_PER_SCORE_CALL):
            if all(item.item_id in done for item in chunk):
                continue
            plans = {item.item_id: check_requests(item, envs[item.env], scorer) for item in chunk}
            requests = {i: [s for r in plan.values() if not isinstance(r, str) for s in r.sets.values()]
                        for i, plan in plans.items()}
            results, failed = call_isolating(scorer.score_candidates, requests, lambda r: r.id)
            for item in chunk:
                if item.item_id in done:
                    continue
                records.append([_item_record(item, plans[item.item_id], results.get(item.item_id, []),
                                         failed.get(item.item_id))])
                bar.update(1)
                if after_item is not None:
                    after_item("sensitivity", item.item_id)


def attach_sensitivity(summary: dict[str, Any], store: StudyStore, seed: int, n_boot: int) -> None:
    """Each environment's (and the pooled) summary gets its "sensitivity" entry, from the stored records."""
    from fastscore.study.analysis.metrics import POOLED
    from fastscore.study.analysis.sensitivity import summarize_sensitivity

    records = [r for rs in store.sensitivity().load().values() for r in rs]
    envs = [env for env in summary if env != POOLED]
    checks = summarize_sensitivity(store.logprobs().load(), records, envs, seed, n_boot)
    for group, by_check in checks.items():
        if group in summary:
            summary[group]["sensitivity"] = by_check
