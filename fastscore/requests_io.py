"""Scoring files: JSONL requests in, one JSON line of results per request out, streamed.

Input line: {"id": ..., "messages": [{"role": ..., "content": ...}, ...], "candidates": ["...", ...],
"tools": [...], "banned": ["...", ...]} ("banned" is optional and only used with greedy generation), or the raw-text
form {"id", "prompt", "continuations"}: see fastscore.requests_schema. The file is read lazily and
validated line by line; a bad line (bad JSON, bad UTF-8, a lone surrogate, nesting too deep, a bad field, more
bytes than `max_line_bytes`) raises RequestError naming its line (1-based) and id, or with on_error="skip" is
listed in OUT.skipped.jsonl instead. A line's size is checked as it is read, before it is decoded, parsed or
tokenized: by default a line may hold LINE_WINDOWS context windows of text (n_ctx tokens of the longest token's
bytes each), and a longer one is read past in pieces, never held whole.
Output goes to OUT.partial and is renamed over OUT only once complete (fastscore.outputs): a failed run leaves OUT
untouched and every valid line before the error in OUT.partial (fsynced), where `resume=True` continues it and
`restart=True` discards it; a note on the error says which. "-" reads stdin or writes stdout (streamed, not
atomic, no resume).

Output line: {"id", "scored_end_of_turn", "candidates": [{"index", "text", "logprob", "n_tokens",
"logprob_per_token", "token_ids", "token_texts", "token_logprobs", "token_ranks", "token_is_argmax", "boundary_straddles",
"prob", "prob_per_token"} (+ "top_k": per token [{"id", "token", "logprob"}, ...] with top_k > 0), ...]} and, when
generating, "greedy": {"text", "stopped_by", "banned_mass", "banned_steps"}. "prob" is normalised over the line's
candidates; "token_texts" are the scored tokens' text pieces; a rank is 1 + the number of tokens the model found
strictly more likely.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tqdm.auto import tqdm

from fastscore.errors import DamagedArtefactError, FastscoreError, OutputError, RequestError
from fastscore.outputs import PartialOutput, is_stdio, write_text_atomic
from fastscore.records import CandidateSetResult, GreedyRequest, GreedyResult
from fastscore.requests_schema import InputRecord, parse_record
from fastscore.score_outputs import SKIPPED_SUFFIX, ScoreOutputs, skipped_path  # noqa: F401 (SKIPPED_SUFFIX: API)

log = logging.getLogger(__name__)

# A request line holds a context and its candidates, each (context + candidate) at most one context window; the
# default line limit leaves room for this many windows of text, and --max-line-bytes sets another.
LINE_WINDOWS = 16
_DRAIN = 1 << 20  # the piece size in which the rest of an over-long line is read past


def _decode_line(data: bytes, line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at byte {exc.start + 1} of the line)",
                           line=line) from None


def read_requests(source: Path | str | IO[bytes], max_line_bytes: int | None = None) -> Iterator[InputRecord]:
    """Parse and validate a JSONL request file lazily; blank lines are skipped; ids must be unique."""
    for record in iter_requests(source, max_line_bytes):
        if isinstance(record, RequestError):
            raise record
        yield record


def _bounded_lines(fh: IO[bytes], limit: int | None) -> Iterator[tuple[int, bytes | RequestError]]:
    """(line number, its bytes), or a RequestError for a line of more than `limit` bytes (its newline not counted),
    which is read past in pieces and never held whole."""
    line = 0
    while data := (fh.readline() if limit is None else fh.readline(limit + 2)):
        line += 1
        content = data[:-1] if data.endswith(b"\n") else data
        if limit is None or len(content) <= limit:
            yield line, data
            continue
        size, tail = len(content), data
        while not tail.endswith(b"\n") and (tail := fh.readline(_DRAIN)):
            size += len(tail) - tail.endswith(b"\n")
        yield line, RequestError(f"the line is {size:,} bytes, more than the {limit:,} a request line may hold "
                                 "(--max-line-bytes): it cannot fit the context; split its candidates over several "
                                 "lines", line=line)


def iter_requests(source: Path | str | IO[bytes], max_line_bytes: int | None = None
                  ) -> Iterator[InputRecord | RequestError]:
    """read_requests, but a bad line is yielded as its RequestError, so the caller decides to stop or skip it."""
    seen: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        fh = source if hasattr(source, "read") else stack.enter_context(open(source, "rb"))
        for line, data in _bounded_lines(fh, max_line_bytes):
            if isinstance(data, RequestError):
                yield data
                continue
            if not data.strip():
                continue
            try:
                record = parse_record(_decode_line(data, line), line)
                if record.key in seen:
                    raise RequestError(f"duplicate id (first used on line {seen[record.key]})", line=line,
                                       request_id=record.id)
            except RequestError as exc:
                yield exc
                continue
            seen[record.key] = line
            yield record


# An output candidate's fields after "index" and "text", in order (ScoreResult.to_dict names).
CANDIDATE_FIELDS = ("logprob", "n_tokens", "logprob_per_token", "token_ids", "token_texts", "token_logprobs",
                    "token_ranks", "token_is_argmax", "boundary_straddles", "prob", "prob_per_token")


def output_line(record: InputRecord, scored: CandidateSetResult, greedy: GreedyResult | None = None) -> dict:
    candidates = []
    for result, full in zip(scored.results, scored.to_dict()["candidates"], strict=True):
        candidate = {"index": result.index, "text": result.continuation}
        candidate |= {key: full[key] for key in CANDIDATE_FIELDS}
        if result.top_k:
            candidate["top_k"] = full["top_k"]
        candidates.append(candidate)
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


@dataclass(frozen=True)
class Generation:
    """Greedy decoding per request (`score --generate`): its token cap and whether bans match as prefixes."""

    max_new_tokens: int = 128
    ban_prefix: bool = False


def _compute(scorer, records: Sequence[InputRecord], generation: Generation | None) -> list[dict]:
    scored = scorer.score_candidates([r.candidate_set() for r in records])
    greedy: Sequence[GreedyResult | None] = [None] * len(records)
    if generation is not None:
        greedy = scorer.greedy([GreedyRequest(r.key, r.messages, r.banned, r.tools, r.prompt) for r in records],
                               generation.max_new_tokens, ban_prefix=generation.ban_prefix)
    return [output_line(r, s, g) for r, s, g in zip(records, scored, greedy, strict=True)]


@dataclass(frozen=True)
class FileSummary:
    n_requests: int  # scored by this call
    n_candidates: int
    out: Path | str
    n_resumed: int = 0  # already in the output when resuming
    n_skipped: int = 0  # bad lines listed in the skipped file (on_error="skip")
    skipped_file: Path | None = None


class _Sink:
    """Where finished lines go: OUT.partial (atomic on commit) or stdout (streamed)."""

    def __init__(self, out: Path | str, settings: dict, resume: bool, restart: bool) -> None:
        self.stdout = is_stdio(out)
        if self.stdout:
            if resume:
                raise OutputError("--resume needs an output file, not stdout")
            self.partial, self.done = None, set()
        else:
            self.partial = PartialOutput(Path(out), settings, resume, restart)
            self.done = self.partial.done

    def write(self, lines: Sequence[dict]) -> None:
        if self.partial is not None:
            self.partial.write(lines)
            return
        for line in lines:
            sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
        sys.stdout.flush()


class _ChunkWriter:
    """Computes and writes one chunk; if the chunk fails, redoes it line by line so the lines before the bad
    one are written, and the error names the bad line (or, skipping, the bad line is set aside)."""

    def __init__(self, scorer, sink: _Sink, bar, generation: Generation | None, skip: bool) -> None:
        self.scorer, self.sink, self.bar = scorer, sink, bar
        self.generation, self.skip = generation, skip
        self.n_requests = self.n_candidates = 0
        self.skipped: list[dict] = []

    def flush(self, chunk: list[InputRecord]) -> None:
        if not chunk:
            return
        try:
            lines = _compute(self.scorer, chunk, self.generation)
        except DamagedArtefactError:
            raise
        except FastscoreError as chunk_error:
            for record in chunk:
                try:
                    lines = _compute(self.scorer, [record], self.generation)
                except RequestError as exc:
                    error = exc if exc.line is not None else type(exc)(str(exc), line=record.line)
                    self.set_aside(error, record.id)
                    continue
                self._done([record], lines)
            log.warning("lines %d-%d failed together (%s); scored them one by one",
                        chunk[0].line, chunk[-1].line, chunk_error)
            return
        self._done(chunk, lines)

    def set_aside(self, error: RequestError, request_id: object = None) -> None:
        if not self.skip:
            raise error
        log.warning("skipped %s", error)
        self.skipped.append({"line": error.line, "id": request_id if request_id is not None else error.request_id,
                             "error": str(error)})
        self.bar.update(1)

    def _done(self, records: Sequence[InputRecord], lines: Sequence[dict]) -> None:
        self.sink.write(lines)
        self.n_requests += len(records)
        self.n_candidates += sum(len(r.candidates) for r in records)
        self.bar.update(len(records))


def _count_lines(fh: IO[bytes]) -> int:
    """Non-blank lines, read in pieces (a huge line is never held whole)."""
    total, blank = 0, True
    while piece := fh.readline(_DRAIN):
        blank = blank and not piece.strip()
        if piece.endswith(b"\n"):
            total, blank = total + (not blank), True
    return total + (not blank)


def _read_source(requests: Path | str) -> tuple[IO[bytes], int]:
    """A binary stream of the requests (stdin is read whole: it is read twice) and its number of non-blank lines."""
    if is_stdio(requests):
        source: IO[bytes] = io.BytesIO(sys.stdin.buffer.read())
    else:
        source = open(requests, "rb")
    total = _count_lines(source)
    source.seek(0)
    return source, total


def default_line_limit(scorer) -> int:
    """Bytes a request line may hold by default: LINE_WINDOWS windows of the most text one window can take."""
    return LINE_WINDOWS * scorer.max_text_bytes


def score_settings(scorer, generation: Generation | None) -> dict[str, Any]:
    """What decides an output line's numbers: a resumed output must be continued with the same."""
    return {"backend": scorer.backend.name, "weights": str(scorer.backend.path), "weights_note": scorer.weights_note,
            "include_end_of_turn": scorer.include_end_of_turn, "generate": generation is not None,
            "max_new_tokens": generation.max_new_tokens if generation else None, "top_k": scorer.top_k,
            **({"ban_prefix": True} if generation and generation.ban_prefix else {})}


def score_file(
    scorer,
    requests_path: Path | str,
    out_path: Path | str,
    *,
    generate: bool = False,
    max_new_tokens: int = 128,
    ban_prefix: bool = False,
    chunk_size: int = 64,
    progress: bool = True,
    resume: bool = False,
    restart: bool = False,
    on_error: str = "stop",
    max_line_bytes: int | None = None,
) -> FileSummary:
    """Score every line of `requests_path` into `out_path`, `chunk_size` lines per scorer call ("-": stdin/stdout).

    The output is written to OUT.partial and renamed over OUT when every line is done; OUT is locked meanwhile.
    With `resume`, the ids already in OUT.partial are not scored again; with `restart` an interrupted run's
    OUT.partial is discarded. on_error="skip" sets bad lines aside in OUT.skipped.jsonl (with their reasons) instead
    of stopping at the first. A line of more than `max_line_bytes` (default: `default_line_limit`) is a bad line.
    """
    if on_error not in ("stop", "skip"):
        raise ValueError(f"on_error must be 'stop' or 'skip', not {on_error!r}")
    if resume and restart:
        raise OutputError("--resume continues an interrupted run and --restart discards it: give one of them")
    names = ScoreOutputs.of(out_path)
    names.check([requests_path])
    generation = Generation(max_new_tokens, ban_prefix) if generate else None
    limit = default_line_limit(scorer) if max_line_bytes is None else max_line_bytes
    source, total = _read_source(requests_path)
    with source, names.lock():
        sink = _Sink(out_path, score_settings(scorer, generation), resume, restart)
        try:
            summary = _score_stream(scorer, source, total, sink, out_path, generation, chunk_size,
                                    progress, on_error == "skip", limit)
        except BaseException as exc:
            if sink.partial is not None:
                sink.partial.close()
                exc.add_note(sink.partial.kept())
            raise
    log.info("scored %d requests (%d candidates) into %s", summary.n_requests, summary.n_candidates, out_path)
    return summary


def _score_stream(scorer, source: IO[bytes], total: int, sink: _Sink, out_path, generation: Generation | None,
                  chunk_size: int, progress: bool, skip: bool, max_line_bytes: int | None) -> FileSummary:
    with tqdm(total=total, initial=len(sink.done), unit="req", desc="scoring", disable=not progress,
              dynamic_ncols=True, file=sys.stderr) as bar:
        writer = _ChunkWriter(scorer, sink, bar, generation, skip)
        chunk: list[InputRecord] = []
        for record in iter_requests(source, max_line_bytes):
            if isinstance(record, RequestError):
                writer.flush(chunk)  # the valid lines read before the bad one are written first
                chunk = []
                writer.set_aside(record)
                continue
            if record.key in sink.done:
                continue
            chunk.append(record)
            if len(chunk) >= chunk_size:
                writer.flush(chunk)
                chunk = []
        writer.flush(chunk)
    skipped_file = None
    if not sink.stdout:
        skipped_file = skipped_path(Path(out_path))
        if writer.skipped:
            write_text_atomic(skipped_file, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in writer.skipped))
        else:
            skipped_file.unlink(missing_ok=True)  # a previous run's list would now be wrong
            skipped_file = None
        sink.partial.commit()
    return FileSummary(writer.n_requests, writer.n_candidates, out_path, len(sink.done), len(writer.skipped),
                       skipped_file)
