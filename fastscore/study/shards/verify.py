"""`fastscore study-shards verify`: a seeded random sample of a run's committed items re-scored from scratch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fastscore.errors import DataError, ReproductionError
from fastscore.study.shards.manifest import Manifest
from fastscore.study.shards.plan import load_plan
from fastscore.study.shards.rescore import Comparison, named, rescore, sample
from fastscore.study.shards.run import config_from_manifest


def verify_run(run_dir: Path, n_items: int = 2, seed: int = 0, data_dir: Path | None = None,
               threads: int | None = None, sandbox: str = "bwrap", item_ids: Sequence[str] = ()) -> Comparison:
    """Re-score `n_items` committed items (seeded sample), or the items named by `item_ids`, with the running code;
    the comparison with their rows."""
    run_dir = Path(run_dir).resolve()
    manifest = Manifest.open(run_dir, None)
    config = config_from_manifest(manifest, run_dir, data_dir)
    picks = named(run_dir, manifest, item_ids) if item_ids else sample(run_dir, manifest, n_items, seed)
    if not picks:
        raise DataError(f"{run_dir} has no committed item to verify")
    plans = {env: load_plan(run_dir, manifest, env) for env in {spec.env for spec, _ in picks}}
    return rescore(run_dir, manifest, picks, plans, config.data_dir, threads, sandbox)


def require_reproduced(comparison: Comparison, run_dir: Path) -> None:
    if not comparison.passed:
        raise ReproductionError(f"the committed rows of {run_dir} are not reproduced by the running code "
                                f"(re-scored {', '.join(comparison.items)}); see the differences above")
