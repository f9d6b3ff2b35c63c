"""On-policy failures: items whose failed action is the model's own greedy attempt from the `before` context."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from tqdm import tqdm

from fastscore.decode import END_OF_TURN, ActionDone
from fastscore.records import EmittedContinuation, GreedyRequest, GreedyResult, Message
from fastscore.study.data.conditions import condition_request_id
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.stages.isolate import call_isolating, error_reason
from fastscore.study.data.items import Item, Skipped

log = logging.getLogger(__name__)

# Attempts per decoder call, at most: batched decoding with one KV stream per context ran 129 tok/s at 8 contexts,
# 187 at 32 and 214 at 64 (docs/performance.md, "KV stream per context"). A run with a limit asks for at
# most twice the items it still lacks, so a small run does not decode sources it will not need.
ATTEMPTS_PER_CALL = 64
# Sources examined per wanted item, at most: a model that rarely fails usably (the 135M model's MBPP attempts are
# mostly cut off or unfinished) would otherwise decode its way through the whole data set for a limit of 20.
EXAMINED_PER_ITEM = 4
MIN_EXAMINED = 16  # ... and at least this many, however small the limit
CUT_AT_CAP = "the model's attempt was cut off at the token cap"  # the skip reason the report's cut rate counts
ATTEMPT_REASONS = ("the model's", "no item from the model's attempt")  # skip reasons of an examined attempt


def attempt_record(result: GreedyResult) -> dict[str, Any]:
    return {"text": result.text, "token_ids": list(result.token_ids), "stopped_by": result.stopped_by}


def emitted_action(attempt: GreedyResult, rule: ActionDone | None, token_bytes: Sequence[bytes]
                   ) -> tuple[tuple[int, ...], bool]:
    """The model's action as it emitted it, up to where the harness cut it: its token ids and whether its own
    end-of-turn token followed them.

    The cut is the same rule decoding stopped by: the first token after which the environment's action_done rule
    holds (checked on the text decoded so far, as the decoder checks it). The one token the decoder reads after it
    only tells whether the turn ended there; it is not part of the action. An attempt that ended its turn ends with
    its end-of-turn; one the harness cut (or the cap) has none, and none is scored after it under any condition."""
    ids = tuple(attempt.token_ids)
    if attempt.stopped_by == END_OF_TURN:
        return ids, True  # the rule, if it held, held at the last token (the decoder stops one token after it)
    if rule is not None:
        text = b""
        for k, token in enumerate(ids, 1):
            text += token_bytes[token] if token < len(token_bytes) else b""
            if rule(text.decode("utf-8", errors="replace")):
                return ids[:k], False
    return ids, False


def scored_candidates(item: Item) -> tuple[str | EmittedContinuation, ...]:
    """The candidates as the scorer gets them: an on-policy item's failed action as the token ids the model emitted
    (up to the harness's cut, see emitted_action), the others as texts. Items built before actions were kept as
    emitted (no meta["emitted"]) score their failed action's text."""
    emitted = item.meta.get("emitted") if item.failure_kind == "model" else None
    if emitted is None:
        return item.candidates
    failed = EmittedContinuation(item.failed_action, tuple(emitted["token_ids"]), bool(emitted["end_of_turn"]))
    return (failed, *item.candidates[1:])


class KnownAttempts:
    """Greedy completions of seeded items' `before` contexts that a run's seeded source already made, for the model's
    own attempts at the same sources when the run goes on to on-policy items (--failures both).

    An attempt is a greedy decode of that very context under the same action rule and model, only with the
    environment's cap instead of the item's smaller budget, so on an exact type whose decoding steps give the bits
    of a prefill (Backend.steps_match_prefill: the same bits on any batch or lane) it is that completion: given as
    the attempt's start tokens (GreedyRequest.start_ids), a completion that ended (its end-of-turn, or its action
    rule) is taken whole and runs no sequence, one that its budget cut is decoded on from where it stopped. A
    `before` completion read off the scoring pass's argmax chain stands for the decode here as it does in the seeded
    rows (stages.decode.chain_completion). A run resumed after its seeded source has none and decodes every attempt,
    with the same results. Elsewhere a second decode may differ (see own_attempt): the runner keeps none."""

    def __init__(self) -> None:
        self._by_item: dict[str, tuple[tuple[Message, ...], GreedyResult]] = {}

    def __len__(self) -> int:
        return len(self._by_item)

    def remember(self, item_id: str, messages: tuple[Message, ...], completion: GreedyResult) -> None:
        self._by_item[item_id] = (tuple(messages), completion)

    def start_ids(self, item_id: str, messages: tuple[Message, ...], stop_id: int) -> tuple[int, ...]:
        """The tokens an attempt from `messages` begins with (ending with `stop_id` where the completion ended its
        turn); () where no completion of exactly this context is known."""
        known = self._by_item.get(item_id)
        if known is None or known[0] != tuple(messages):
            return ()
        completion = known[1]
        ids = tuple(completion.token_ids)
        return ids + (stop_id,) if completion.stopped_by == END_OF_TURN else ids


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
    `seeded(limit)` gives the first `limit` seeded items and the sources passed over (default: the environment
    builds them; a sweep passes the list its driver built once). `known`: completions of the same contexts the run's
    seeded source made (KnownAttempts; only on an exact type), which attempts begin with instead of decoding again.
    """

    def __init__(self, env: StudyEnv, scorer, seed: int, max_new_tokens: int,
                 seeded: Callable[[int | None], tuple[list[Item], list[Skipped]]] | None = None,
                 known: KnownAttempts | None = None) -> None:
        self.name, self.env, self.scorer = env.name, env, scorer
        self.seed, self.max_new_tokens = seed, max_new_tokens
        self.known = known
        self.seeded = seeded if seeded is not None else (lambda limit: env.build_items(limit, seed))

    def build(self, limit: int | None, progress: bool = False) -> tuple[list[Item], list[Skipped]]:
        """Up to `limit` items (None: from every usable source)."""
        items: list[Item] = []
        skipped: list[Skipped] = []
        examined = 0
        target = math.inf if limit is None else limit
        budget = math.inf if limit is None else max(EXAMINED_PER_ITEM * limit, MIN_EXAMINED)
        # A small model fails nearly always; None builds the whole pool at once.
        pool_size = None if limit is None else limit + max(2, math.ceil(0.25 * limit))
        with tqdm(total=limit, desc=f"{self.name}: model's own failures", unit="item", disable=not progress) as bar:
            while len(items) < target and examined < budget:
                pool, pool_skipped = self.seeded(pool_size)
                if examined >= len(pool):
                    break  # every usable source was tried
                while examined < len(pool) and len(items) < target and examined < budget:
                    # A few more attempts than still needed, decoded side by side: many attempts are skipped (cut
                    # off, passing, no item), and one attempt per call would decode them one after the other.
                    want = int(min(ATTEMPTS_PER_CALL, max(4, 2 * (target - len(items))), budget - examined))
                    chunk = pool[examined : examined + want]
                    examined += len(chunk)
                    for made in self._attempts(chunk, skipped):
                        if made is not None and len(items) < target:
                            items.append(made)
                            bar.update(1)
                seen_skips = {(s.source_id, s.reason) for s in skipped}
                skipped += [s for s in pool_skipped if (s.source_id, s.reason) not in seen_skips]
                if pool_size is not None:
                    pool_size += 2 * (int(target) - len(items)) + 2
        if len(items) < target and examined >= budget:
            log.warning("%s: %d of %d items after examining %d sources (at most %d per wanted item); the reasons the "
                        "others were skipped are counted in the report", self.name, len(items), limit, examined,
                        EXAMINED_PER_ITEM)
        return items, skipped

    def build_window(self, start: int, stop: int, progress: bool = False) -> tuple[list[Item], list[Skipped]]:
        """Items from the seeded sources [start, stop) of the environment's order that the model fails (a sweep's
        shard: each window attempts its own sources once, so shards never redo each other's decoding)."""
        pool, pool_skipped = self.seeded(stop)
        window = pool[start:stop]
        items: list[Item] = []
        skipped: list[Skipped] = list(pool_skipped) if start == 0 else []
        with tqdm(total=len(window), desc=f"{self.name}: model's own attempts", unit="item",
                  disable=not progress) as bar:
            for first in range(0, len(window), ATTEMPTS_PER_CALL):
                chunk = window[first : first + ATTEMPTS_PER_CALL]
                items += [made for made in self._attempts(chunk, skipped) if made is not None]
                bar.update(len(chunk))
        return items, skipped

    def _attempts(self, seeded: Sequence[Item], skipped: list[Skipped]) -> Iterator[Item | None]:
        # The environment's action_done rule (MBPP: one token after the closed program) ends an attempt where its
        # action is decided: the program extracted and whether the turn ended right after it are what a decode to
        # the cap would give, without the explanation a small model writes on after its program.
        action_done = self.env.action_done()
        token_bytes = self.scorer.tokenizer.token_bytes
        stop_id = self.scorer.tokenizer.end_of_turn_id

        def request(item: Item) -> GreedyRequest:
            messages = self.env.context_messages(item)
            start = self.known.start_ids(item.item_id, messages, stop_id) if self.known is not None else ()
            return GreedyRequest(item.item_id, messages, action_done=action_done, start_ids=start)

        requests = {item.item_id: [request(item)] for item in seeded}
        decode = lambda reqs: self.scorer.greedy(reqs, max_new_tokens=self.max_new_tokens)  # noqa: E731
        results, failed = call_isolating(decode, requests, lambda r: r.id)
        for item in seeded:
            if item.item_id in failed:
                skipped.append(Skipped(self.name, item.source_id, error_reason(failed[item.item_id])))
                yield None
                continue
            attempt = results[item.item_id][0]
            text = attempt.text
            if not text.strip():
                skipped.append(Skipped(self.name, item.source_id, "the model's attempt was empty"))
                yield None
                continue
            if not self.env.finished_action(text, attempt.stopped_by):
                # Not a finished action: it would be scored with an end-of-turn token the model never emitted.
                skipped.append(Skipped(self.name, item.source_id, CUT_AT_CAP))
                yield None
                continue
            # The action is what the model emitted up to the harness's cut: judged, shown in every record and scored
            # (as these very ids) under every condition.
            ids, end_of_turn = emitted_action(attempt, action_done, token_bytes)
            action = self.scorer.tokenizer.decode(ids)
            outcome = self.env.evaluate(item.source_id, action)
            if outcome.ok:
                skipped.append(Skipped(self.name, item.source_id, "the model's own attempt succeeded"))
                yield None
            else:
                try:
                    made = self.env.item_from_failure(item.source_id, action, outcome, self.seed)
                    emitted = {"token_ids": list(ids), "end_of_turn": end_of_turn}
                    yield replace(made, meta={**made.meta, "attempt": attempt_record(attempt), "emitted": emitted})
                except ValueError as exc:
                    skipped.append(Skipped(self.name, item.source_id, f"no item from the model's attempt: {exc}"))
                    yield None
