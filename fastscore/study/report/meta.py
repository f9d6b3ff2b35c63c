"""The run's metadata for the report (report_meta): its settings, the command, the stage timings and the counts of
what was skipped."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from fastscore.study.data.envs import env_class
from fastscore.study.data.items import Skipped
from fastscore.study.report.control import seeded_mix_text


def skipped_counts(skipped: Sequence[Skipped], errors: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{env: {reason: count}} over source records passed over and items that could not be scored."""
    counts: dict[str, dict[str, int]] = {}
    for env, reason in [(s.env, s.reason) for s in skipped] + [(e["env"], e["reason"]) for e in errors]:
        by_reason = counts.setdefault(env, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return counts


def report_meta(config, weights: str, skipped: Sequence[Skipped], errors: Sequence[dict[str, Any]],
                 stage_seconds: dict[str, float], resumed: bool, stage_tokens: dict[str, int] | None = None
                 ) -> dict[str, Any]:
    return {
        "weights": weights,
        "model": config.model,
        "backend": config.backend,
        "quant": config.quant,
        "seed": config.seed,
        "limit": config.limit,
        "failure_source": config.failures,
        "seeded_mix": "none (the model's own failures)" if config.failures == "model" else seeded_mix_text(config.envs),
        "retries": config.retries if config.failures == "model" else "none (seeded failures)",
        "end_of_turn": config.include_end_of_turn,
        "n_boot": config.n_boot,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(["fastscore", *sys.argv[1:]]) + (" (resumed)" if resumed else ""),
        "stage_seconds": {k: round(v, 1) for k, v in stage_seconds.items()},
        "stage_tokens": dict(stage_tokens or {}),
        "skipped": skipped_counts(skipped, errors),
        "sandbox_note": next((note for name in config.envs
                              if (note := env_class(name).isolation_note(config.sandbox))), None),
    }
