"""Where the study data lies (its files are JSON Lines: fastscore.jsonl reads them)."""

from __future__ import annotations

import os
from pathlib import Path


DATA_VARIABLE = "FASTSCORE_DATA"


def default_data_dir() -> Path:
    """The study data folder: $FASTSCORE_DATA, else `shared/data` beside the checkout (where the Makefile's
    DATA=../shared/data points), whatever the working directory."""
    chosen = os.environ.get(DATA_VARIABLE)
    beside = Path(__file__).resolve().parents[4]  # fastscore/study/data/datafile.py -> the folder holding the checkout
    return Path(chosen) if chosen else beside / "shared" / "data"
