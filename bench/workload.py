"""The benchmark's fixed requests: a slice of study items, every distinct condition context x every candidate.

Conditions whose messages equal another's (clean_retry shows `before`'s messages, ban shows `after`'s) are scored
once: counting them twice would flatter prefix sharing with requests the study never needs to recompute.
The slice is written to a JSON file that every benchmark worker reads, so all configurations score the same text.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastscore.records import CandidateSet, TokenRequest
from fastscore.study.data.envs import ENVS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workload:
    sets: tuple[CandidateSet, ...]
    envs: tuple[str, ...]
    items_per_env: int
    seed: int
    n_items: int

    @property
    def n_requests(self) -> int:
        return sum(len(s.candidates) for s in self.sets)

    def to_json(self) -> str:
        return json.dumps({
            "envs": list(self.envs), "items_per_env": self.items_per_env, "seed": self.seed, "n_items": self.n_items,
            "sets": [{"id": s.id, "messages": [m.template_dict() for m in s.messages],
                      "candidates": list(s.candidates), "tools": list(s.tools), "prompt": s.prompt}
                     for s in self.sets],
        }, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Workload":
        from fastscore.requests_schema import parse_message

        raw = json.loads(text)
        sets = tuple(
            CandidateSet(id=s["id"], messages=tuple(parse_message(m, k) for k, m in enumerate(s["messages"])),
                         candidates=tuple(s["candidates"]), tools=tuple(s.get("tools", ())), prompt=s.get("prompt"))
            for s in raw["sets"]
        )
        return cls(sets, tuple(raw["envs"]), raw["items_per_env"], raw["seed"], raw["n_items"])


def context_ids(scorer, candidate_set: CandidateSet) -> list[int]:
    """The token ids greedy decoding starts from for one set: its raw prompt, or its messages (and tools) rendered
    with a generation prompt."""
    if candidate_set.prompt is not None:
        return scorer.prompt_ids(candidate_set.prompt, candidate_set.id)
    return scorer.context_ids(candidate_set.messages, candidate_set.id, tools=candidate_set.tools)


def build_workload(data_dir: Path, items_per_env: int, envs: Sequence[str] = ENVS, seed: int = 0,
                   conditions: Sequence[str] | None = None) -> Workload:
    """`conditions`: a subset of the study's conditions (default all), e.g. for a quick smoke run."""
    from fastscore.study.data.conditions import CONDITIONS, distinct, render_conditions
    from fastscore.study.data.envs import items_for_envs, open_envs

    conditions = tuple(conditions or CONDITIONS)
    opened = open_envs(envs, Path(data_dir))
    items, _ = items_for_envs(opened, items_per_env, seed)
    n_items = len(items)
    sets: list[CandidateSet] = []
    for item in items:
        contexts = render_conditions(item, opened[item.env], conditions)
        stands_for = distinct(contexts, lambda c: c.messages)
        sets += [c.candidate_set(item.candidates) for c in contexts if stands_for[c.condition] == c.condition]
    log.info("workload: %d items, %d contexts, %d requests", n_items, len(sets), sum(len(s.candidates) for s in sets))
    return Workload(tuple(sets), tuple(envs), items_per_env, seed, n_items)


def workload_from_requests(path: Path) -> Workload:
    """A user's scoring file (fastscore score's input) as the workload: every request kind `score` takes (chat, with
    tools and tool calls, or raw text), each with its candidates."""
    from fastscore.errors import RequestError
    from fastscore.requests_io import read_requests

    sets = [record.candidate_set() for record in read_requests(path)]
    if not sets:
        raise RequestError(f"{path} holds no requests")
    log.info("workload from %s: %d contexts, %d requests", path, len(sets), sum(len(s.candidates) for s in sets))
    return Workload(tuple(sets), ("requests",), 0, 0, len(sets))


# ---------------------------------------------------------------- token-level facts of a request list


def all_positions(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """Positions of every token of every sequence, each run whole (no sharing)."""
    return np.concatenate([np.arange(len(s)) for s in sequences]) if sequences else np.zeros(0, dtype=np.int64)


def requests_digest(requests: Sequence[TokenRequest]) -> str:
    """A short hash of the token requests: equal digests mean the configurations scored identical tokens."""
    h = hashlib.sha256()
    for r in requests:
        h.update(np.asarray(r.tokens, dtype=np.int64).tobytes())
        h.update(r.score_from.to_bytes(4, "little"))
    return h.hexdigest()[:16]
