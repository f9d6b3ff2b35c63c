"""The study's model-bound stages: on-policy failures, candidate-set scoring and greedy decoding, item by item.

An item-level problem (a context longer than the model's window, a conversation the template rejects) is caught
per item: the item gets a record in item_errors.jsonl with a countable reason and the run goes on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from fastscore.errors import ContextTooLongError, RequestError, TokenizationError
from fastscore.records import CandidateSetResult, GreedyRequest, GreedyResult
from fastscore.study.conditions import (
    ConditionContext,
    as_messages,
    banned_candidate_lp,
    by_condition,
    condition_request_id,
    render_conditions,
)
from fastscore.study.items import Item, Skipped
from fastscore.study.metrics import CONDITIONS, ScoreRow, candidate_probabilities
from fastscore.study.store import StudyStore

log = logging.getLogger(__name__)

ITEMS_PER_SCORE_CALL = 4  # x 6 distinct candidate sets x 4 candidates: one shared prefix trie per call
ITEMS_PER_GREEDY_CALL = 4  # x 7 distinct contexts decoded side by side
ITEM_LEVEL_ERRORS = (RequestError, TokenizationError)

Req = TypeVar("Req")
Res = TypeVar("Res")


def error_reason(exc: Exception) -> str:
    """A countable reason (the details go to item_errors.jsonl)."""
    if isinstance(exc, ContextTooLongError):
        return "context too long for the model"
    if isinstance(exc, TokenizationError):
        return "tokenization failed"
    return "the scorer rejected the request"


def chunks(seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for lo in range(0, len(seq), size):
        yield seq[lo : lo + size]


def call_isolating(
    call: Callable[[list[Req]], list[Res]], requests: dict[str, list[Req]], request_id: Callable[[Req], str]
) -> tuple[dict[str, list[Res]], dict[str, Exception]]:
    """`call` on every item's requests at once; an item-level error removes the item that caused it, then retries.

    Returns results per item (in its requests' order) and the error of each item that failed.
    """
    pending = dict(requests)
    failed: dict[str, Exception] = {}
    while pending:
        flat = [r for reqs in pending.values() for r in reqs]
        try:
            results = call(flat)
        except ITEM_LEVEL_ERRORS as exc:
            owner = {request_id(r): key for key, reqs in pending.items() for r in reqs}
            culprit = owner.get(getattr(exc, "request_id", None))
            if culprit is None and len(pending) > 1:
                # The error names no request of ours: find the item by calling each one alone.
                done: dict[str, list[Res]] = {}
                for key, reqs in pending.items():
                    ok, bad = call_isolating(call, {key: reqs}, request_id)
                    done.update(ok)
                    failed.update(bad)
                return done, failed
            culprit = culprit if culprit is not None else next(iter(pending))
            log.warning("item %s: %s", culprit, exc)
            failed[culprit] = exc
            del pending[culprit]
            continue
        it = iter(results)
        return {key: [next(it) for _ in reqs] for key, reqs in pending.items()}, failed
    return {}, failed


def distinct(contexts: Sequence[ConditionContext], key: Callable[[ConditionContext], Hashable]) -> dict[str, str]:
    """condition -> the condition whose request stands for it (the first with an identical request)."""
    first: dict[Hashable, str] = {}
    return {c.condition: first.setdefault(key(c), c.condition) for c in contexts}


def _error_record(item: Item, stage: str, exc: Exception) -> dict[str, Any]:
    return {"item_id": item.item_id, "env": item.env, "source_id": item.source_id, "stage": stage,
            "reason": error_reason(exc), "detail": str(exc)}


# ---------------------------------------------------------------- scoring


def _set_record(result: CandidateSetResult) -> dict[str, Any]:
    return {"cand_lp": [r.logprob for r in result.results], "cand_n_tokens": [r.n_tokens for r in result.results],
            "p": list(result.probs), "p_norm": list(result.probs_per_token)}


def _errored_at(errors: dict[str, list[dict[str, Any]]], stage: str) -> set[str]:
    return {item_id for item_id, records in errors.items() if records[0]["stage"] == stage}


def score_stage(store: StudyStore, scorer, envs: dict, items: Sequence[Item], *, progress: bool = True,
                after_item: Callable[[str, str], None] | None = None) -> None:
    """Append each item's candidate-set log-probs under every condition to logprobs.jsonl.

    Scorer calls always hold the same items (fixed chunks of the item list, minus items that failed here), also
    when a resumed run needs only some of them: numbers must not depend on where a run was interrupted, and an
    engine's floating-point results may depend on what else is in its batch.
    """
    lp_log, err_log = store.logprobs(), store.item_errors()
    errors = err_log.load()
    done = set(lp_log.load()) | set(errors)
    failed_here = _errored_at(errors, "score")
    with tqdm(total=len(items), initial=sum(item.item_id in done for item in items), desc="score candidate sets",
              unit="item", disable=not progress) as bar:
        for chunk in chunks(items, ITEMS_PER_SCORE_CALL):
            if all(item.item_id in done for item in chunk):
                continue
            members = [item for item in chunk if item.item_id not in failed_here]
            contexts = {item.item_id: render_conditions(item, envs[item.env]) for item in members}
            stands_for = {i: distinct(c, lambda x: x.messages) for i, c in contexts.items()}
            by_id = {item.item_id: item for item in members}
            requests = {i: [c.candidate_set(by_id[i].candidates) for c in cs
                            if stands_for[i][c.condition] == c.condition] for i, cs in contexts.items()}
            results, failed = call_isolating(scorer.score_candidates, requests, lambda r: r.id)
            for item in members:
                if item.item_id in done:
                    continue
                if item.item_id in failed:
                    err_log.append([_error_record(item, "score", failed[item.item_id])])
                else:
                    by_cond = by_condition(results[item.item_id])
                    conds = {c: _set_record(by_cond[rep]) for c, rep in stands_for[item.item_id].items()}
                    lp_log.append([{"item_id": item.item_id, "env": item.env, "conditions": conds}])
                bar.update(1)
                if after_item is not None:
                    after_item("score", item.item_id)


# ---------------------------------------------------------------- greedy decoding


def same_action(env: str, text: str, failed_action: str) -> bool:
    """Did a greedy completion reproduce the failed action? Text equality up to surrounding whitespace (as the
    decoder's ban compares); for programs, the extracted program in its canonical fenced form."""
    if env == "mbpp":
        from fastscore.study.envs.mbpp.env import extract_program, format_program

        return format_program(extract_program(text)) == failed_action
    return text.strip() == failed_action.strip()


def succeeded(outcome: Any) -> bool:
    """tools_env outcomes say `ok`, mbpp_env outcomes `passed`."""
    return bool(outcome.passed) if hasattr(outcome, "passed") else bool(outcome.ok)


class Evaluator:
    """env.evaluate on a model's text, by source id, each distinct (source, text) run once."""

    def __init__(self, envs: dict, data_dir: Path) -> None:
        self.envs = envs
        self.data_dir = data_dir
        self._sources: dict[str, dict[str, Any]] = {}
        self._cache: dict[tuple[str, str, str], Any] = {}

    def source(self, env: str, source_id: str) -> Any:
        if env not in self._sources:
            loaded = self.envs[env].load_sources(self.data_dir)
            self._sources[env] = {str(getattr(s, "source_id", getattr(s, "task_id", None))): s for s in loaded}
        return self._sources[env][source_id]

    def __call__(self, env: str, source_id: str, text: str) -> Any:
        key = (env, source_id, text)
        if key not in self._cache:
            self._cache[key] = self.envs[env].evaluate(self.source(env, source_id), text)
        return self._cache[key]


def score_rows(item: Item, lp_record: dict[str, Any], greedy: dict[str, GreedyResult], evaluate: Evaluator
               ) -> list[ScoreRow]:
    rows = []
    for cond in CONDITIONS:
        scored, decoded = lp_record["conditions"][cond], greedy[cond]
        cand_lp, n = scored["cand_lp"], scored["cand_n_tokens"]
        if cond == "ban":
            cand_lp = banned_candidate_lp(cand_lp)
            p, p_norm = candidate_probabilities(cand_lp, n)
        else:
            p, p_norm = scored["p"][0], scored["p_norm"][0]
        rows.append(ScoreRow(
            item_id=item.item_id, env=item.env, condition=cond, lp=cand_lp[0], n_tokens=n[0], cand_lp=cand_lp,
            cand_n_tokens=n, p_repeat=p, p_repeat_norm=p_norm, greedy=decoded.text,
            greedy_repeat=same_action(item.env, decoded.text, item.failed_action),
            greedy_success=succeeded(evaluate(item.env, item.source_id, decoded.text)),
            banned_mass=decoded.banned_mass if cond == "ban" else None,
        ))
    return rows


def greedy_budget(cap: int, lp_record: dict[str, Any]) -> int:
    """Greedy tokens for one item: twice its longest candidate (counts include the end-of-turn token), rounded
    up to a multiple of 16, at most `cap`. Enough to reproduce any candidate or write a different answer of similar
    length; a small model's rambling beyond that decides no metric and would dominate the run time."""
    longest = max(max(scored["cand_n_tokens"]) for scored in lp_record["conditions"].values())
    return min(cap, -(-2 * longest // 16) * 16)


def greedy_stage(store: StudyStore, scorer, envs: dict, items: Sequence[Item], data_dir: Path,
                 new_tokens: Callable[[str], int], *, progress: bool = True,
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
    failed_here = _errored_at(errors, "greedy")
    evaluate = Evaluator(envs, data_dir)
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
                for item in members:
                    if item.item_id in done:
                        continue
                    if item.item_id in failed:
                        err_log.append([_error_record(item, "greedy", failed[item.item_id])])
                    else:
                        by_cond = by_condition(results[item.item_id])
                        if attempts[item.item_id] is not None:
                            by_cond["before"] = attempts[item.item_id]
                        greedy = {c: by_cond[rep] for c, rep in stands_for[item.item_id].items()}
                        rows = score_rows(item, lp[item.item_id][0], greedy, evaluate)
                        scores_log.append([row.to_dict() for row in rows])
                    bar.update(1)
                    if after_item is not None:
                        after_item("greedy", item.item_id)


# ---------------------------------------------------------------- on-policy failures


def attempt_record(result: GreedyResult) -> dict[str, Any]:
    return {"text": result.text, "token_ids": list(result.token_ids), "stopped_by": result.stopped_by}


def own_attempt(item: Item) -> GreedyResult | None:
    """The greedy attempt an on-policy item was built from, as the `before` condition's completion.

    Its context is exactly `before`, so decoding it again must give the same text, except that quantised llama.cpp
    arithmetic depends on what else shares the batch (the second decode differed from the first on real items).
    """
    attempt = item.meta.get("attempt") if item.failure_kind == "model" else None
    if attempt is None:
        return None
    return GreedyResult(id=condition_request_id(item.item_id, "before"), text=attempt["text"],
                        token_ids=tuple(attempt["token_ids"]), stopped_by=attempt["stopped_by"])


class ModelFailureBuilder:
    """Items whose failed action is the model's own greedy attempt from the `before` context.

    The environment's seeded items give the sources in its seeded order (and their contexts); each source's attempt
    is evaluated, failing ones become items via env.item_from_failure, passing ones are skipped with a reason.
    """

    def __init__(self, name: str, env, scorer, data_dir: Path, seed: int, max_new_tokens: int) -> None:
        self.name, self.env, self.scorer = name, env, scorer
        self.data_dir, self.seed, self.max_new_tokens = data_dir, seed, max_new_tokens
        self.evaluate = Evaluator({name: env}, data_dir)

    def build(self, limit: int, progress: bool = True) -> tuple[list[Item], list[Skipped]]:
        items: list[Item] = []
        skipped: list[Skipped] = []
        examined = 0
        pool_size = limit + max(2, math.ceil(0.25 * limit))  # a small model fails nearly always
        with tqdm(total=limit, desc=f"{self.name}: model's own failures", unit="item", disable=not progress) as bar:
            while len(items) < limit:
                pool, pool_skipped = self.env.build_items(self.data_dir, pool_size, self.seed)
                if examined >= len(pool):
                    break  # every usable source was tried
                while examined < len(pool) and len(items) < limit:
                    # No more attempts than could still be needed: each one is a full greedy decode.
                    chunk = pool[examined : examined + min(ITEMS_PER_GREEDY_CALL * 4, limit - len(items))]
                    examined += len(chunk)
                    for made in self._attempts(chunk, skipped):
                        if made is not None:
                            items.append(made)
                            bar.update(1)
                seen_skips = {(s.source_id, s.reason) for s in skipped}
                skipped += [s for s in pool_skipped if (s.source_id, s.reason) not in seen_skips]
                pool_size += 2 * (limit - len(items)) + 2
        return items, skipped

    def _attempts(self, seeded: Sequence[Item], skipped: list[Skipped]) -> Iterator[Item | None]:
        requests = {item.item_id: [GreedyRequest(item.item_id, as_messages(self.env.context_messages(item)))]
                    for item in seeded}
        decode = lambda reqs: self.scorer.greedy(reqs, max_new_tokens=self.max_new_tokens)  # noqa: E731
        results, failed = call_isolating(decode, requests, lambda r: r.id)
        for item in seeded:
            if item.item_id in failed:
                skipped.append(Skipped(self.name, item.source_id, error_reason(failed[item.item_id])))
                yield None
                continue
            text = results[item.item_id][0].text
            outcome = self.evaluate(self.name, item.source_id, text)
            if not text.strip():
                skipped.append(Skipped(self.name, item.source_id, "the model's attempt was empty"))
                yield None
            elif succeeded(outcome):
                skipped.append(Skipped(self.name, item.source_id, "the model's own attempt succeeded"))
                yield None
            else:
                try:
                    made = self.env.item_from_failure(self.evaluate.source(self.name, item.source_id), text,
                                                      outcome, self.seed)
                    yield replace(made, meta={**made.meta, "attempt": attempt_record(results[item.item_id][0])})
                except ValueError as exc:
                    skipped.append(Skipped(self.name, item.source_id, f"no item from the model's attempt: {exc}"))
                    yield None
