"""What `report-html` will need before it starts: the study's scoring backend, when the tokens are still to score."""

from __future__ import annotations

import json
from pathlib import Path

from fastscore.study.report.html import TOKENS_FILE, study_parts


def scoring_backend(out_dir: Path, rescore: bool) -> str | None:
    """The backend report-html scores tokens.jsonl with (the study's own), or None when nothing is to be scored or
    the study's config.json cannot say (write_report_html then names the problem itself)."""
    out_dir = Path(out_dir)
    for part in study_parts(out_dir):  # a top-level folder: the first part that still has tokens to score
        backend = scoring_backend(part, rescore)
        if backend is not None:
            return backend
    if not rescore and (out_dir / TOKENS_FILE).is_file():
        return None
    try:
        backend = json.loads((out_dir / "config.json").read_text(encoding="utf-8")).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return backend if isinstance(backend, str) else None
