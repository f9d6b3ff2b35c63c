"""A study over both failure sources: each source ran as its own study in a subfolder; here the top folder gets a
summary keyed by source and a report that sets the sources side by side."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastscore.outputs import write_text_atomic
from fastscore.study.analysis.prior import MODEL, SEEDED, prior_of_run
from fastscore.study.report.document import REPORT_NAME
from fastscore.study.report.by_source import sources_report
from fastscore.study.report.prior import SUMMARY_KEY as PRIOR_KEY
from fastscore.study.stages.store import SUMMARY_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyOutcome:
    out_dir: Path
    n_items: dict[str, int]  # items scored per env
    n_item_errors: int  # items that could not be scored (item_errors.jsonl)
    n_resumed: int  # items whose results were already stored when this invocation started
    summary: dict[str, Any]
    stage_seconds: dict[str, float]  # this invocation's stages
    total_seconds: float
    files: tuple[Path, ...]
    by_source: dict[str, "StudyOutcome"] | None = None  # --failures both: each source's own outcome


def combine_sources(config, outcomes: dict, total_seconds: float) -> StudyOutcome:
    out = Path(config.out_dir)
    summaries = {source: o.summary for source, o in outcomes.items()}
    # Per-item values the side-by-side summaries do not keep: read back from each source's stored score rows.
    prior = prior_of_run(out, config.n_boot, config.seed) if set(outcomes) >= {SEEDED, MODEL} else None
    summary_path = out / SUMMARY_FILE
    stored = {**summaries, **({PRIOR_KEY: prior} if prior else {})}
    write_text_atomic(summary_path, json.dumps(stored, indent=1, sort_keys=True, allow_nan=False) + "\n")
    stages = {f"{source}: {stage}": seconds for source, o in outcomes.items() for stage, seconds in
              o.stage_seconds.items()}
    meta = [f"Model `{config.model}` ({config.backend}, {config.quant}); seed {config.seed}; "
            f"{'every usable item' if config.limit is None else f'{config.limit} items'} per environment and source; "
            f"measured time {total_seconds:.0f} s (" + ", ".join(f"{s} {o.total_seconds:.0f} s"
                                                            for s, o in outcomes.items()) + ")."]
    text = sources_report(summaries, {s: f"{s}/{REPORT_NAME}" for s in outcomes}, meta, prior)
    report = out / REPORT_NAME
    write_text_atomic(report, text.rstrip() + "\n")
    log.info("wrote %s", report)
    n_items = {f"{s}/{env}": n for s, o in outcomes.items() for env, n in o.n_items.items()}
    files = tuple(f for o in outcomes.values() for f in o.files) + (summary_path, report)
    return StudyOutcome(out, n_items, sum(o.n_item_errors for o in outcomes.values()),
                        sum(o.n_resumed for o in outcomes.values()), summaries, stages, total_seconds, files,
                        by_source=dict(outcomes))
