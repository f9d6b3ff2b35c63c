"""A study item: one task, one failed action with its error, and the fixed candidate set scored under every
condition."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Item:
    """One measurement unit of the study, built from real data by an environment.

    `failed_action` is exactly the text scored as the assistant's continuation (the verbatim action).
    `candidates` is the fixed candidate set, the failed action first; `correct_actions` are texts that count
    as success for greedy decoding (the ground truth, in the environment's canonical action format).
    `description` is the runtime-generated description of the failure that the description remedy shows
    in place of the verbatim action (roughly the same length as action + error).
    """

    env: str  # "tools" or "mbpp"
    item_id: str  # unique within the study, stable across runs with the same seed
    source_id: str  # id of the record in the source data set
    system: str  # system prompt (for tools: shows the tool schemas and the call format)
    task: str  # the user turn: the question / programming task with its tests
    failed_action: str
    error_message: str  # what the runtime / test run printed
    failure_kind: str  # e.g. "missing_required", "wrong_type", "comparison_flip", "model" (on-policy)
    correct_actions: tuple[str, ...]
    candidates: tuple[str, ...]  # candidates[0] == failed_action, candidates[1] == a correct action
    description: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "Item":
        raw = json.loads(line)
        raw["correct_actions"] = tuple(raw["correct_actions"])
        raw["candidates"] = tuple(raw["candidates"])
        return cls(**raw)


@dataclass(frozen=True)
class Skipped:
    """A source record that produced no item, with the reason (counted in the report)."""

    env: str
    source_id: str
    reason: str
