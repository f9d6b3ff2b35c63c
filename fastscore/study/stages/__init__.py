"""The study's model-bound stages, item by item: candidate-set scoring (score.py), greedy decoding (decode.py), the
harness-realism checks (sensitivity.py) and the model's own attempts (onpolicy.py), with what they run on: the
per-item store (store.py), the score rows (rows.py), the run-level bar (progress.py) and item isolation (isolate.py).

Scoring and decoding walk fixed chunks of the item list and store each item's result, or its item-level error,
through one loop (`store_results`), so a killed run resumes exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastscore.study.stages.isolate import error_reason
from fastscore.study.data.items import Item
from fastscore.study.stages.store import AppendLog


def error_record(item: Item, stage: str, exc: Exception) -> dict[str, Any]:
    return {"item_id": item.item_id, "env": item.env, "source_id": item.source_id, "stage": stage,
            "reason": error_reason(exc), "detail": str(exc)}


def errored_at(errors: dict[str, list[dict[str, Any]]], stage: str) -> set[str]:
    return {item_id for item_id, records in errors.items() if records[0]["stage"] == stage}


def store_results(stage: str, members: Sequence[Item], done: set[str], failed: dict[str, Exception],
                  err_log: AppendLog, store: Callable[[Item], None], bar,
                  after_item: Callable[[str, str], None] | None) -> None:
    """For each member not yet done: its error record if it failed, else store(item); then the bar and the hook."""
    for item in members:
        if item.item_id in done:
            continue
        if item.item_id in failed:
            err_log.append([error_record(item, stage, failed[item.item_id])])
        else:
            store(item)
        bar.update(1)
        if after_item is not None:
            after_item(stage, item.item_id)
