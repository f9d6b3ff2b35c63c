"""The Python API: `fastscore.load(...)` opens a model once (an OpenModel); `score` / `score_many` take plain dicts.

    import fastscore
    s = fastscore.load()                      # the embedded default model on llama.cpp, exact f32
    result = s.score([{"role": "user", "content": "2+2?"}], ["4", "5"])
    result.results[0].logprob, result.probs
    rows = fastscore.to_frame([result])       # pandas, one row per candidate

Messages are OpenAI-style dicts (assistant `tool_calls`, tool results with `tool_call_id`), or Message records;
`tools=` (JSON schemas) reach the chat template as in transformers. A raw-text request scores continuations of
`prompt=` without any template. Every result is a frozen dataclass with `to_dict()`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastscore.deps import require
from fastscore.errors import RequestError
from fastscore.records import CandidateSetResult, GreedyRequest, GreedyResult
from fastscore.requests_schema import InputRecord, record_from_dict

log = logging.getLogger(__name__)


class OpenModel:
    """An open model: scores candidate sets with shared prefixes. Close it (or use `with`) to free the backend."""

    def __init__(self, scorer, model: str, backend: str, quant: str) -> None:
        self.scorer = scorer  # fastscore.scorer.Scorer: the lower-level API
        self.model, self.backend, self.quant = model, backend, quant

    @property
    def weights_note(self) -> str:
        return self.scorer.weights_note

    def score(
        self,
        messages: Sequence[Mapping[str, Any]] | None = None,
        candidates: Sequence[str] = (),
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        prompt: str | None = None,
        id: str | int = 0,
    ) -> CandidateSetResult:
        """Score each candidate as the assistant's reply to `messages` (or, with `prompt=`, as raw text after it)."""
        raw: dict[str, Any] = {"id": id, "candidates": list(candidates)}
        if prompt is not None:
            raw["prompt"] = prompt
        else:
            raw["messages"] = list(messages or [])
        if tools:
            raw["tools"] = list(tools)
        return self.score_many([raw])[0]

    def score_many(self, requests: Iterable[Mapping[str, Any]]) -> list[CandidateSetResult]:
        """Score many requests ({"messages", "candidates", "tools"} or {"prompt", "continuations"}; "id" optional)
        in shared backend calls, in order."""
        records = self._records(requests)
        return self.scorer.score_candidates([r.candidate_set() for r in records])

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        banned: Sequence[str] = (),
        ban_prefix: bool = True,
        max_new_tokens: int = 128,
        prompt: str | None = None,
    ) -> GreedyResult:
        """The greedy reply to `messages` (or, with `prompt=`, the greedy continuation of that raw text); it never
        starts with (`ban_prefix=False`: never equals) any of `banned`, compared as text."""
        raw: dict[str, Any] = {"id": 0, "candidates": ["-"], "tools": list(tools), "banned": list(banned)}
        if prompt is not None:
            raw["prompt"] = prompt
        else:
            raw["messages"] = list(messages or [])
        record = self._records([raw])[0]
        request = GreedyRequest(record.key, record.messages, record.banned, record.tools, record.prompt)
        return self.scorer.greedy([request], max_new_tokens, ban_prefix=ban_prefix)[0]

    @staticmethod
    def _records(requests: Iterable[Mapping[str, Any]]) -> list[InputRecord]:
        records, seen = [], set()
        for k, raw in enumerate(requests):
            record = record_from_dict(raw, default_id=k)
            if record.key in seen:
                raise RequestError(f"duplicate id (request {k})", request_id=record.id)
            seen.add(record.key)
            records.append(record)
        return records

    def close(self) -> None:
        self.scorer.close()

    def __enter__(self) -> "OpenModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# The open model's former name, kept so code written against it keeps working ("session" now means nothing else in
# the API).
Session = OpenModel


def load(
    model: str | None = None,
    backend: str = "llamacpp",
    quant: str | None = None,
    *,
    hf_path: Path | str | None = None,
    threads: int | None = None,
    top_k: int = 0,
    include_end_of_turn: bool = True,
    backend_options: Mapping[str, Any] | Sequence[str] | None = None,
    progress: bool = False,
) -> OpenModel:
    """Open `model` (default: the embedded SmolLM2-135M-Instruct; also a local GGUF file, a local HF folder or a hub
    id) on `backend` at `quant` (default: the backend's full-precision, batch-invariant type: llama.cpp f32, for the
    embedded model derived once from its shipped Q4_1 file, ONNX fp32; a local GGUF file's own type). `top_k` > 0
    returns that many alternatives per scored token; `backend_options` are the backend's typed options by name
    (e.g. {"kv_type": "f16", "n_ctx": 8192}) or `key=value` strings (a key given twice with different values is
    refused)."""
    from fastscore.selection import ModelSelection

    selection = ModelSelection.resolve(model, backend, quant, hf_path=hf_path, threads=threads,
                                       backend_options=backend_options)
    scorer = selection.open(progress=progress, include_end_of_turn=include_end_of_turn, top_k=top_k)
    return OpenModel(scorer, selection.model, selection.backend, selection.quant)


def candidate_rows(results: Iterable[CandidateSetResult]) -> list[dict[str, Any]]:
    """One flat dict per candidate: the set's id, the candidate's index and text, and its scores (lists kept)."""
    from fastscore.tables import flatten

    return [row for result in results for row in flatten(result.to_dict())]


def to_frame(results: Iterable[CandidateSetResult]):
    """A pandas DataFrame with one row per candidate (see candidate_rows); needs pandas (`pip install pandas`)."""
    pandas = require("pandas", "frames")
    return pandas.DataFrame(candidate_rows(results))
