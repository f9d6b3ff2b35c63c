"""Scoring files: JSONL requests in, one JSON line of results per request out, streamed.

Input line: {"id": ..., "messages": [{"role": ..., "content": ...}, ...], "candidates": ["...", ...],
"banned": ["...", ...]} ("banned" is optional and only used with greedy generation). The file is read lazily and
validated line by line; a bad line raises RequestError naming its line (1-based) and id. Output is written and
flushed line by line, so every valid line before an error is in the output file.

Output line: {"id", "scored_end_of_turn", "candidates": [{"text", "logprob", "n_tokens", "logprob_per_token",
"token_logprobs", "token_is_argmax", "boundary_straddles", "prob", "prob_per_token"}, ...]} and, when generating,
"greedy": {"text", "stopped_by", "banned_mass", "banned_steps"}. "prob" is normalised over the line's candidates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tqdm.auto import tqdm

from fastscore.chat import ALLOWED_ROLES
from fastscore.errors import FastscoreError, RequestError
from fastscore.records import CandidateSet, CandidateSetResult, GreedyRequest, GreedyResult, Message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputRecord:
    line: int
    id: str | int  # as written in the file (echoed in the output)
    messages: tuple[Message, ...]
    candidates: tuple[str, ...]
    banned: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return str(self.id)


def _string_list(value: Any, field: str, line: int, rid: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequestError(f"{field!r} must be a list of strings", line=line, request_id=rid)
    return tuple(value)


def parse_record(text: str, line: int) -> InputRecord:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"malformed JSON: {exc.msg} (at character {exc.pos + 1})", line=line) from None
    if not isinstance(raw, dict):
        raise RequestError(f"expected a JSON object, got {type(raw).__name__}", line=line)
    for field in ("id", "messages", "candidates"):
        if field not in raw:
            raise RequestError(f"missing field {field!r}", line=line, request_id=raw.get("id"))
    rid = raw["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise RequestError(f"'id' must be a string or an integer, not {json.dumps(rid)}", line=line)
    if not isinstance(raw["messages"], list):
        raise RequestError("'messages' must be a list", line=line, request_id=rid)
    messages = []
    for k, message in enumerate(raw["messages"]):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"message {k} must be an object with a string 'role'", line=line, request_id=rid)
        if message["role"] not in ALLOWED_ROLES:
            raise RequestError(
                f"message {k} has unknown role {message['role']!r}; allowed roles: {', '.join(ALLOWED_ROLES)}",
                line=line,
                request_id=rid,
            )
        if not isinstance(message.get("content"), str):
            raise RequestError(f"message {k} must have a string 'content'", line=line, request_id=rid)
        messages.append(Message(message["role"], message["content"]))
    candidates = _string_list(raw["candidates"], "candidates", line, rid)
    if not candidates:
        raise RequestError("empty candidate list", line=line, request_id=rid)
    for k, candidate in enumerate(candidates):
        if not candidate:
            raise RequestError(f"candidate {k} is an empty continuation", line=line, request_id=rid)
    banned = _string_list(raw.get("banned", []), "banned", line, rid)
    return InputRecord(line, rid, tuple(messages), candidates, banned)


def read_requests(path: Path | str) -> Iterator[InputRecord]:
    """Parse and validate a JSONL request file lazily; blank lines are skipped; ids must be unique."""
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            record = parse_record(text, line)
            if record.key in seen:
                raise RequestError(
                    f"duplicate id (first used on line {seen[record.key]})", line=line, request_id=record.id
                )
            seen[record.key] = line
            yield record


def output_line(record: InputRecord, scored: CandidateSetResult, greedy: GreedyResult | None = None) -> dict:
    candidates = [
        {
            "text": result.continuation,
            "logprob": result.logprob,
            "n_tokens": result.n_tokens,
            "logprob_per_token": result.logprob_per_token,
            "token_logprobs": list(result.token_logprobs),
            "token_is_argmax": list(result.token_is_argmax),
            "boundary_straddles": result.boundary_straddles,
            "prob": prob,
            "prob_per_token": prob_per_token,
        }
        for result, prob, prob_per_token in zip(scored.results, scored.probs, scored.probs_per_token, strict=True)
    ]
    out: dict[str, Any] = {
        "id": record.id,
        "scored_end_of_turn": scored.results[0].includes_end_of_turn,
        "candidates": candidates,
    }
    if greedy is not None:
        out["greedy"] = {
            "text": greedy.text,
            "stopped_by": greedy.stopped_by,
            "banned_mass": greedy.banned_mass,
            "banned_steps": greedy.banned_steps,
        }
    return out


def _compute(scorer, records: Sequence[InputRecord], generate: bool, max_new_tokens: int) -> list[dict]:
    sets = [CandidateSet(r.key, r.messages, r.candidates) for r in records]
    scored = scorer.score_candidates(sets)
    greedy: Sequence[GreedyResult | None] = [None] * len(records)
    if generate:
        greedy = scorer.greedy([GreedyRequest(r.key, r.messages, r.banned) for r in records], max_new_tokens)
    return [output_line(r, s, g) for r, s, g in zip(records, scored, greedy, strict=True)]


def _write(fh: IO[str], lines: Sequence[dict]) -> None:
    for line in lines:
        fh.write(json.dumps(line, ensure_ascii=False) + "\n")
        fh.flush()


@dataclass(frozen=True)
class FileSummary:
    n_requests: int
    n_candidates: int
    out: Path


class _ChunkWriter:
    """Computes and writes one chunk; if the chunk fails, redoes it line by line so the lines before the bad
    one are written, and the error names the bad line."""

    def __init__(self, scorer, fh: IO[str], bar, generate: bool, max_new_tokens: int) -> None:
        self.scorer, self.fh, self.bar = scorer, fh, bar
        self.generate, self.max_new_tokens = generate, max_new_tokens
        self.n_requests = self.n_candidates = 0

    def flush(self, chunk: list[InputRecord]) -> None:
        if not chunk:
            return
        try:
            lines = _compute(self.scorer, chunk, self.generate, self.max_new_tokens)
        except FastscoreError as chunk_error:
            for record in chunk:
                try:
                    lines = _compute(self.scorer, [record], self.generate, self.max_new_tokens)
                except RequestError as exc:
                    if exc.line is None:
                        raise type(exc)(str(exc), line=record.line) from exc
                    raise
                self._done([record], lines)
            log.warning("lines %d-%d failed together but not one by one (%s); scored them one by one",
                        chunk[0].line, chunk[-1].line, chunk_error)
            return
        self._done(chunk, lines)

    def _done(self, records: Sequence[InputRecord], lines: Sequence[dict]) -> None:
        _write(self.fh, lines)
        self.n_requests += len(records)
        self.n_candidates += sum(len(r.candidates) for r in records)
        self.bar.update(len(records))


def score_file(
    scorer,
    requests_path: Path | str,
    out_path: Path | str,
    *,
    generate: bool = False,
    max_new_tokens: int = 128,
    chunk_size: int = 64,
    progress: bool = True,
) -> FileSummary:
    """Score every line of `requests_path` into `out_path`, `chunk_size` lines per scorer call, streaming output."""
    requests_path, out_path = Path(requests_path), Path(out_path)
    with open(requests_path, encoding="utf-8") as fh:
        total = sum(1 for text in fh if text.strip())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as out, tqdm(
        total=total, unit="req", desc="scoring", disable=not progress, dynamic_ncols=True
    ) as bar:
        writer = _ChunkWriter(scorer, out, bar, generate, max_new_tokens)
        chunk: list[InputRecord] = []
        records = read_requests(requests_path)
        while True:
            try:
                record = next(records)
            except StopIteration:
                break
            except RequestError:
                writer.flush(chunk)  # the valid lines read before the bad one are written first
                raise
            chunk.append(record)
            if len(chunk) >= chunk_size:
                writer.flush(chunk)
                chunk = []
        writer.flush(chunk)
    log.info("scored %d requests (%d candidates) into %s", writer.n_requests, writer.n_candidates, out_path)
    return FileSummary(writer.n_requests, writer.n_candidates, out_path)
