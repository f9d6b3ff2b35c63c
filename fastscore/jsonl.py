"""JSON Lines read one way: every non-blank line is one JSON object; errors name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastscore.errors import DataError


def read_json_objects(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for every non-blank line; DataError on a missing, unreadable or malformed file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON Lines file, in order."""
    return [record for _, record in read_json_objects(path)]
