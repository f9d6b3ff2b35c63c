"""The report of a sharded run: its committed shards' rows merged into one study folder per failure source and fed
through the study's own analysis (runner.summarise_and_report, sources.combine_sources), exactly as a single
`fastscore study --limit all` run over the same items would be summarised.

summary.json, report.md and the plots land in the run folder (top level: both sources side by side; seeded/ and
model/: each source's own). The top summary.json gains one key, "coverage": whether the run is partial, its shards
done and planned, and its items per source and environment; every report.md says the same in its first lines.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fastscore.errors import DataError
from fastscore.outputs import write_text_atomic
from fastscore.study.report.document import REPORT_NAME
from fastscore.study.runner import StageTimer, StudyConfig, summarise_and_report
from fastscore.study.sources import StudyOutcome
from fastscore.study.shards.manifest import Manifest
from fastscore.study.shards.plan import ShardSpec, partition
from fastscore.study.shards.rescore import committed_rows
from fastscore.study.shards.rowfiles import write_jsonl
from fastscore.study.shards.run import config_from_manifest
from fastscore.study.stages.store import CONFIG_FILE, PROVENANCE, RESUMED_WITH, SUMMARY_FILE, StudyStore

log = logging.getLogger(__name__)

COVERAGE_KEY = "coverage"


@dataclass(frozen=True)
class MergeOutcome:
    out_dir: Path
    coverage: dict[str, Any]
    files: tuple[Path, ...]


def coverage(manifest: Manifest, counts: dict[str, int], sources: tuple[str, ...], shard_items: int
             ) -> dict[str, Any]:
    """How much of the plan the committed shards hold: per source and environment, the items scored (an item the
    run recorded an item error for is counted apart: it has no rows, so no estimate holds it) and seeded positions."""
    specs = partition(counts, sources, shard_items)
    done = [s for s in specs if s.key in manifest.shards]

    def total(field: str, source: str, env: str) -> int:
        return sum(manifest.shards[s.key].get(field, 0) for s in done if (s.source, s.env) == (source, env))

    cells = {source: {env: {"n_items": total("n_items", source, env) - total("n_item_errors", source, env),
                            "item_errors": total("n_item_errors", source, env),
                            "positions_done": sum(s.stop - s.start for s in done if (s.source, s.env) == (source, env)),
                            "positions_total": n}
                      for env, n in counts.items()} for source in sources}
    return {"partial": len(done) < len(specs), "shards_done": len(done), "shards_total": len(specs),
            "n_items": {source: {env: c["n_items"] for env, c in by_env.items()} for source, by_env in cells.items()},
            "by_source": cells}


def run_coverage(manifest: Manifest) -> dict[str, Any]:
    settings = manifest.settings
    plan = manifest.record["plan"]
    counts = {env: plan[env]["n_items"] for env in settings["envs"] if env in plan}
    return coverage(manifest, counts, tuple(settings["sources"]), settings["shard_items"])


def coverage_lines(cov: dict[str, Any]) -> list[str]:
    """The label every report of a sharded run opens with."""
    state = "**Partial run**" if cov["partial"] else "**Complete run**"
    cells = "; ".join(f"{source}/{env} n = {c['n_items']} ({c['positions_done']} of {c['positions_total']} seeded "
                      f"positions{_errored(c.get('item_errors', 0), source)})"
                      for source, by_env in cov["by_source"].items() for env, c in by_env.items())
    tail = " Every estimate below comes from these items only." if cov["partial"] else ""
    return [f"> {state}: {cov['shards_done']} of {cov['shards_total']} shards committed; {cells}.{tail}"]


def _errored(n: int, source: str) -> str:
    return f"; {n} item{'s' if n > 1 else ''} could not be scored, reason in {source}/report.md" if n else ""


def _label(report: Path, lines: list[str]) -> None:
    text = report.read_text(encoding="utf-8").splitlines()
    at = 1 if text and text[0].startswith("# ") else 0  # after the title
    rest = text[at:] if text[at:at + 1] == [""] else ["", *text[at:]]
    write_text_atomic(report, "\n".join(text[:at] + [""] * at + lines + rest).rstrip() + "\n")


def _source_keys(manifest: Manifest, envs: tuple[str, ...], source: str) -> list[str]:
    """A source's committed shards in the order one run over all its items would hold them: environment after
    environment, each in its seeded order."""
    keys = [k for k, s in manifest.shards.items() if s["source"] == source]
    return sorted(keys, key=lambda k: (envs.index(manifest.shards[k]["env"]), manifest.shards[k]["index"]))


def _merge_source(run_dir: Path, manifest: Manifest, keys: list[str], folder: Path) -> int:
    """Write one source's committed rows as a study folder's JSONL files, shard after shard."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for key in keys:
        for kind, rows in committed_rows(run_dir, manifest, ShardSpec.of(manifest.shards[key])).items():
            by_kind.setdefault(kind, []).extend(rows)
    folder.mkdir(parents=True, exist_ok=True)
    for kind, rows in by_kind.items():
        write_jsonl(folder / f"{kind}.jsonl", rows)
    return len(by_kind.get("items", []))


def _provenance(records: list[dict[str, Any]]) -> dict[str, Any]:
    """config.json's provenance entries: the first shard's, then each differing one (as a resumed run records)."""
    seen, distinct = set(), []
    for record in records:
        key = json.dumps({k: v for k, v in record.items() if k != "created"}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            distinct.append(record)
    return {PROVENANCE: distinct[0], **({RESUMED_WITH: distinct[1:]} if distinct[1:] else {})} if distinct else {}


def _analyse_source(config: StudyConfig, shards: list[dict[str, Any]]) -> StudyOutcome:
    """The study's own analysis of one source's merged folder, as if one run had written it."""
    record = {**config.result_settings(), **_provenance([s["provenance"] for s in shards if s["provenance"]])}
    write_text_atomic(Path(config.out_dir) / CONFIG_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")
    store = StudyStore(Path(config.out_dir))
    items, skipped = store.load_items()
    timer = StageTimer()  # the shards' own stage times, summed
    for shard in shards:
        for stage, seconds in shard["stage_seconds"].items():
            timer.seconds[stage] = timer.seconds.get(stage, 0.0) + seconds
    errors = [r for records in store.item_errors().load().values() for r in records]
    outcome = summarise_and_report(config, store, items, skipped, shards[0]["weights_note"], timer, errors=errors,
                                   resumed=False, started=0.0, n_resumed=0)
    return replace(outcome, total_seconds=sum(s["seconds"] for s in shards))


def write_report(run_dir: Path, data_dir: Path | None = None, n_boot: int = 2000) -> MergeOutcome:
    """Rebuild summary.json, report.md and plots of `run_dir` from every committed shard."""
    run_dir = Path(run_dir).resolve()
    manifest = Manifest.open(run_dir, None)
    config = config_from_manifest(manifest, run_dir, data_dir)
    cov = run_coverage(manifest)
    if not manifest.shards:
        raise DataError(f"{run_dir} has no committed shard yet: nothing to report")
    study = replace(config.study(), n_boot=n_boot)
    outcomes: dict[str, StudyOutcome] = {}
    with tempfile.TemporaryDirectory(prefix="fastscore-merge-") as tmp:
        merged = Path(tmp)
        for source in config.sources:
            keys = _source_keys(manifest, config.envs, source)
            if not keys or _merge_source(run_dir, manifest, keys, merged / source) == 0:
                continue
            outcomes[source] = _analyse_source(replace(study, failures=source, out_dir=merged / source),
                                               [manifest.shards[k] for k in keys])
        if not outcomes:
            raise DataError(f"the committed shards of {run_dir} hold no item yet: nothing to report")
        from fastscore.study.sources import combine_sources

        combine_sources(replace(study, out_dir=merged), outcomes, sum(o.total_seconds for o in outcomes.values()))
        summary_path = merged / SUMMARY_FILE
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        summary[COVERAGE_KEY] = cov
        write_text_atomic(summary_path, json.dumps(summary, indent=1, sort_keys=True, allow_nan=False) + "\n")
        for report in merged.rglob(REPORT_NAME):
            _label(report, coverage_lines(cov))
        files = []
        for path in sorted(merged.rglob("*")):
            if path.is_file() and path.suffix != ".jsonl" and path.name != CONFIG_FILE:
                target = run_dir / path.relative_to(merged)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                files.append(target)
    log.info("report of %s: %d of %d shards", run_dir, cov["shards_done"], cov["shards_total"])
    return MergeOutcome(run_dir, cov, tuple(files))
