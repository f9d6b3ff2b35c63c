"""Read a study data file of JSON objects, one per line, with errors that name the file and the line."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastscore.errors import DataError

DATA_VARIABLE = "FASTSCORE_DATA"


def default_data_dir() -> Path:
    """The study data folder: $FASTSCORE_DATA, else `shared/data` beside the checkout (where the Makefile's
    DATA=../shared/data points), whatever the working directory."""
    chosen = os.environ.get(DATA_VARIABLE)
    return Path(chosen) if chosen else Path(__file__).resolve().parents[3] / "shared" / "data"


def read_json_objects(path: Path) -> list[tuple[int, dict]]:
    """(1-based line number, object) for every non-blank line; DataError on a missing, unreadable or malformed file."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {number}: invalid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}: line {number}: expected a JSON object, got {type(record).__name__}")
        records.append((number, record))
    return records
