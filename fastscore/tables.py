"""Scores as a flat table: one row per candidate, written as CSV or Parquet (or returned to pandas).

A row holds the request id, the candidate's index and text, its scalar scores, and its per-token lists (token ids,
text pieces, log-probs, ranks, argmax flags, top-k alternatives). CSV writes each list as a JSON string; Parquet
keeps lists as list columns (pyarrow, the `parquet` extra).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastscore.deps import require
from fastscore.errors import DataError, OutputError, RequestError
from fastscore.jsonl import read_jsonl
from fastscore.outputs import write_atomic_with, write_text_atomic

FORMATS = ("jsonl", "parquet", "csv")


def flatten(line: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One output line ({"id", "candidates": [...], "greedy"?}) or a CandidateSetResult.to_dict() as rows."""
    rows = []
    greedy = {f"greedy_{k}": v for k, v in (line.get("greedy") or {}).items()}
    extra = {k: v for k, v in line.items() if k not in ("id", "candidates", "greedy")}
    for candidate in line["candidates"]:
        row = {"id": str(line["id"]), "index": candidate["index"]}  # ids may mix ints and strings: one type
        row["text"] = candidate["text"] if "text" in candidate else candidate["continuation"]
        row |= {k: v for k, v in candidate.items() if k not in ("index", "text", "continuation", "request_id")}
        rows.append(row | extra | greedy)
    return rows


def read_rows(jsonl: Path) -> list[dict[str, Any]]:
    return [row for record in read_jsonl(jsonl) for row in flatten(record)]


# The per-token columns a CSV holds as JSON strings; the scalar columns compare reads back as numbers.
_LIST_COLUMNS = ("token_ids", "token_texts", "token_logprobs", "token_ranks", "token_is_argmax", "top_k")
_EXPECTED = "a `fastscore score` output (.jsonl, .csv or .parquet, one scored candidate per row or line)"


def table_format(path: Path) -> str:
    """A score output's format from its name: .csv and .parquet are tables, anything else is read as JSONL."""
    suffix = Path(path).suffix.lower()
    return {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}.get(suffix, "jsonl")


def read_score_rows(path: Path) -> list[dict[str, Any]]:
    """The rows (one per candidate, as `flatten` makes them) of a score output in any of FORMATS.

    A file that is not a score output (a requests file, a study folder, another table) raises RequestError naming
    the file and what was expected, never a KeyError from deep inside."""
    path = Path(path)
    if path.is_dir():
        raise RequestError(f"{path} is a folder; expected {_EXPECTED}")
    fmt = table_format(path)
    try:
        rows = _read_csv(path) if fmt == "csv" else _read_parquet(path) if fmt == "parquet" else _read_jsonl(path)
    except (DataError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        reason = str(exc).replace(str(path), "it")[:120]
        raise RequestError(f"{path}: expected {_EXPECTED}; cannot read it as {fmt} ({reason})") from None
    if not rows:
        raise RequestError(f"{path} holds no scored candidate; expected {_EXPECTED}")
    for number, row in enumerate(rows, start=1):
        missing = [key for key in ("id", "text", "logprob") if row.get(key) in (None, "")]
        if missing:
            raise RequestError(f"{path}: expected {_EXPECTED}; candidate {number} has no {', '.join(missing)}")
        try:
            row["logprob"] = float(row["logprob"])
        except (TypeError, ValueError):
            raise RequestError(f"{path}: candidate row {number}'s logprob {row['logprob']!r} is not a number") from None
        row["id"] = str(row["id"])
    return rows


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in read_jsonl(path):
        if not isinstance(line.get("candidates"), list) or not all(isinstance(c, dict) for c in line["candidates"]):
            raise ValueError("a line without a list of scored candidates")
        # hand-written outputs may leave out the index: the candidates' order is their index
        line = line | {"candidates": [{"index": k} | c for k, c in enumerate(line["candidates"])]}
        rows.extend(flatten(line))
    return rows


def _read_csv(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        for key in _LIST_COLUMNS:
            if row.get(key):
                row[key] = json.loads(row[key])
        if row.get("index"):
            row["index"] = int(row["index"])
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    require("pyarrow", "parquet")
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except pyarrow.ArrowException as exc:
        raise ValueError(str(exc)) from None


def _csv_text(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v
                         for k, v in row.items()})
    return buffer.getvalue()


def write_table(rows: Iterable[dict[str, Any]], out: Path, fmt: str) -> None:
    """Write rows atomically as `fmt` ("csv" or "parquet")."""
    rows = list(rows)
    if fmt == "csv":
        write_text_atomic(out, _csv_text(rows))
    elif fmt == "parquet":
        pyarrow = require("pyarrow", "parquet")
        import pyarrow.parquet as pq

        table = pyarrow.Table.from_pylist(rows)
        write_atomic_with(out, lambda tmp: pq.write_table(table, tmp))
    else:
        raise OutputError(f"unknown table format {fmt!r}; known: csv, parquet")


def check_format(fmt: str) -> None:
    """Refuse a format whose writer is missing before anything is scored."""
    if fmt not in FORMATS:
        raise OutputError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt == "parquet":
        require("pyarrow", "parquet")
