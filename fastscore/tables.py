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
from fastscore.errors import OutputError
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
    with open(jsonl, encoding="utf-8") as fh:
        return [row for text in fh if text.strip() for row in flatten(json.loads(text))]


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
