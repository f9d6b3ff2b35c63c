"""/v1/score: fastscore's own request format over HTTP.

The body is one request object of `fastscore score`'s JSONL schema ({"id", "messages", "candidates", "tools"} or
{"id", "prompt", "continuations"}; see fastscore.requests_schema), or a JSON list of them; "id" may be left out
(the object's place in the list). The answer is the output line `fastscore score` writes for each (a list for a
list), so a client reads the server's answers and the CLI's files with the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastscore.errors import RequestError, RequestTooLargeError
from fastscore.records import CandidateSet, CandidateSetResult
from fastscore.requests_schema import InputRecord


@dataclass(frozen=True)
class ScoreCall:
    records: tuple[InputRecord, ...]
    single: bool  # the body was one object, not a list: so is the answer

    def candidate_sets(self) -> list[CandidateSet]:
        return [record.candidate_set() for record in self.records]


def parse_score(body: Any, max_candidates: int) -> ScoreCall:
    single = not isinstance(body, list)
    raws = [body] if single else body
    if not raws:
        raise RequestError("an empty list of requests")
    from fastscore.api import OpenModel

    records = OpenModel._records(raws)  # the Python API's validation: ids default to the place in the list, unique
    n_candidates = sum(len(record.candidates) for record in records)
    if n_candidates > max_candidates:
        raise RequestTooLargeError(f"{n_candidates} candidates in one request; at most {max_candidates}")
    return ScoreCall(tuple(records), single)


def score_response(call: ScoreCall, results: Sequence[CandidateSetResult]) -> Any:
    from fastscore.requests_io import output_line

    lines = [output_line(record, result) for record, result in zip(call.records, results, strict=True)]
    return lines[0] if call.single else lines
