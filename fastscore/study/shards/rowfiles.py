"""A shard's row files: each JSONL file a study writes (items, logprobs, scores, ...) as one zstd-compressed Parquet
file, read back record for record.

The study's rows change with its science, so nothing here knows their fields. A top-level field that every record
has, with scalars of one Python type (str, int, float or bool; None allowed), becomes a typed column that pandas or
DuckDB read directly (item_id, env, condition, lp, greedy, ...); the remaining fields of each record (lists, nested
mappings, fields of mixed type) are kept as that record's JSON text in the column `_json`. Reading merges both, so a
record comes back equal to the one written: floats are stored as float64 either way, and no key is added or lost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastscore.deps import require
from fastscore.errors import DataError
from fastscore.outputs import write_atomic_with

REST_COLUMN = "_json"  # every other column is a native one
# Rows are written once and read rarely: the smaller file is worth the slower write. Column statistics would store
# each long text (a system prompt) again as its chunk's min and max; without them a 2-item shard's row files took
# 24 KB instead of 37 KB.
WRITE_OPTIONS = {"compression": "zstd", "compression_level": 19, "write_statistics": False}
SCALARS = (str, int, float, bool)


def _jsonl_line(record: dict[str, Any]) -> str:
    # The study store's own formatting (store._jsonl), so a merged file reads as a run's file.
    return json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=False)


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(_jsonl_line(r) + "\n" for r in records), encoding="utf-8")


def _native_columns(records: Sequence[dict[str, Any]]) -> list[str]:
    """Fields present in every record whose values are all None or scalars of one exact type."""
    if not records:
        return []
    shared = [k for k in records[0] if all(k in r for r in records)]
    native = []
    for key in shared:
        types = {type(r[key]) for r in records if r[key] is not None}
        if len(types) == 1 and next(iter(types)) in SCALARS:
            native.append(key)
    return native


def write_rows(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write `records` (JSON-safe dicts) atomically as Parquet with zstd."""
    pa = require("pyarrow", "parquet")
    import pyarrow.parquet as pq

    native = _native_columns(records)
    columns: dict[str, Any] = {k: [r[k] for r in records] for k in native}
    columns[REST_COLUMN] = [_jsonl_line({k: v for k, v in r.items() if k not in native}) for r in records]
    table = pa.table(columns)
    write_atomic_with(path, lambda tmp: pq.write_table(table, tmp, **WRITE_OPTIONS))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The records written by write_rows, in order."""
    require("pyarrow", "parquet")
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if REST_COLUMN not in table.column_names:
        raise DataError(f"{path} is not a fastscore row file (it has no {REST_COLUMN} column)")
    data = table.to_pydict()
    native = [name for name in table.column_names if name != REST_COLUMN]
    records = []
    for i, rest in enumerate(data[REST_COLUMN]):
        record = {k: data[k][i] for k in native}
        record.update(json.loads(rest))
        records.append(record)
    return records
