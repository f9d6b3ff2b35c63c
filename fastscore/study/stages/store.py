"""The study's output folder: the files a run writes, and how a killed run resumes without losing or duplicating items.

Files (all in out_dir):
- config.json: the settings that determine the results (`--resume` with different settings is refused) and, under
  "provenance", what produced them: fastscore, Python and library versions, the weights and their note (a resumed
  run under other versions appends its own under "resumed_with").
- items.jsonl / skipped.jsonl: the item set and the source records that produced no item. Written atomically
  (temporary file + rename), and rewritten only when the item set differs.
- logprobs.jsonl: one line per item, its candidate sets' log-probs under every condition (the scoring stage).
- scores.jsonl: the final per item x condition rows (metrics.ScoreRow); an item's rows are written together.
- sensitivity.jsonl: one line per item, its candidate sets' log-probs under the harness-realism checks
  (fastscore.study.stages.sensitivity), when the run makes them.
- item_errors.jsonl: items that could not be scored (e.g. a context too long for the model), with the reason.

The three append logs are written one item per write, flushed and fsynced. A kill can leave a partial last line (with
or without its newline), or (for scores.jsonl) some of an item's lines without the rest: on resume both are discarded
and the item is redone. A fresh run replaces the previous run's files only once its settings are valid and its model
is loaded (runner), and a run holds an exclusive lock on its folder (fastscore.outputs.OutDirLock).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastscore.errors import DataError, ResumeConfigError
from fastscore.outputs import write_text_atomic
from fastscore.study.data.items import Item, Skipped

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
ITEMS_FILE = "items.jsonl"
SKIPPED_FILE = "skipped.jsonl"
LOGPROBS_FILE = "logprobs.jsonl"
SCORES_FILE = "scores.jsonl"
ITEM_ERRORS_FILE = "item_errors.jsonl"
SUMMARY_FILE = "summary.json"
SENSITIVITY_FILE = "sensitivity.jsonl"
RUN_FILES = (LOGPROBS_FILE, SCORES_FILE, ITEM_ERRORS_FILE, SUMMARY_FILE, SENSITIVITY_FILE)
# config.json's records of what produced the results: not settings, so never compared on resume
PROVENANCE, RESUMED_WITH = "provenance", "resumed_with"
# Settings added after runs were first written: a config.json without one was run with its default, and resumes.
LATER_SETTINGS = {"sensitivity": False}


def _jsonl(records: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True, allow_nan=False) + "\n" for r in records)


def _with_later_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {**LATER_SETTINGS, **settings}


def _sans_time(provenance: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in provenance.items() if k != "created"}


class AppendLog:
    """A JSONL file appended one item at a time; `load` repairs what a kill left behind.

    `group_size(item_id)` says how many lines make one complete item (1 for per-item records). Lines of an item
    with fewer lines are dropped, as is a final line without its newline or with broken JSON.
    """

    def __init__(self, path: Path, group_size: Callable[[str], int] = lambda _id: 1) -> None:
        self.path = path
        self.group_size = group_size

    def load(self) -> dict[str, list[dict[str, Any]]]:
        """Complete items' records by item id (in file order); rewrites the file if anything was discarded."""
        if not self.path.exists():
            return {}
        text = self.path.read_text(encoding="utf-8")
        lines = text.split("\n")
        # After the final newline split() yields "", so a last non-empty element is a line cut short by a kill.
        dropped = 0 if lines[-1] == "" else 1
        groups: dict[str, list[dict[str, Any]]] = {}
        complete_lines = lines[:-1]
        last_number = max((n for n, line in enumerate(complete_lines, 1) if line.strip()), default=0)
        for number, line in enumerate(complete_lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = record["item_id"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                if number == last_number:  # the last write was cut short, and its newline still reached the disk
                    dropped += 1
                    continue
                raise DataError(f"{self.path}:{number}: unreadable line ({exc}); delete the file to start over")
            groups.setdefault(key, []).append(record)
        complete = {}
        for key, records in groups.items():
            if len(records) == self.group_size(key):
                complete[key] = records
            else:
                dropped += len(records)
        if dropped:
            log.warning("%s: discarded %d line(s) of items a kill left incomplete", self.path.name, dropped)
            write_text_atomic(self.path, _jsonl(r for records in complete.values() for r in records))
        return complete

    def append(self, records: Sequence[dict[str, Any]]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(_jsonl(records))
            fh.flush()
            os.fsync(fh.fileno())


class StudyStore:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)

    def path(self, name: str) -> Path:
        return self.out_dir / name

    def start(self, config: dict[str, Any], resume: bool, provenance: dict[str, Any] | None = None) -> bool:
        """Prepare out_dir for a run with `config` (recorded with `provenance`); return True when it resumes.

        A fresh run (no --resume) discards the previous run's scores but keeps items.jsonl, which it rewrites only
        if its item set differs. --resume with a different config raises ResumeConfigError.
        """
        self.out_dir.mkdir(parents=True, exist_ok=True)
        previous = self.read_config()
        if self.check_resume(config, resume):
            log.info("resuming the run in %s", self.out_dir)
            self._record_resume(provenance)
            return True
        if resume:
            log.warning("nothing to resume in %s: starting a fresh run", self.out_dir)
        for name in RUN_FILES:
            if self.path(name).exists():
                log.info("fresh run: removing the previous %s", name)
                self.path(name).unlink()
        if previous is None or _with_later_settings(previous) != _with_later_settings(config):
            # Items built under another config must not be mistaken for this one's.
            for name in (ITEMS_FILE, SKIPPED_FILE):
                self.path(name).unlink(missing_ok=True)
        record = {**config, **({PROVENANCE: provenance} if provenance is not None else {})}
        write_text_atomic(self.path(CONFIG_FILE), json.dumps(record, indent=2, sort_keys=True) + "\n")
        return False

    def _record_resume(self, provenance: dict[str, Any] | None) -> None:
        """A resume under other versions or weights than the recorded ones appends its own provenance."""
        record = self._read_record() or {}
        known = [record.get(PROVENANCE), *record.get(RESUMED_WITH, [])]
        if provenance is None or _sans_time(provenance) in [_sans_time(p) for p in known if p]:
            return
        log.warning("resuming %s with other versions or weights than it was started with; config.json records both",
                    self.out_dir)
        record[RESUMED_WITH] = [*record.get(RESUMED_WITH, []), provenance]
        write_text_atomic(self.path(CONFIG_FILE), json.dumps(record, indent=2, sort_keys=True) + "\n")

    def provenance(self) -> list[dict[str, Any]]:
        """What produced the results: the starting run's provenance, then any differing resumes'."""
        record = self._read_record() or {}
        return [p for p in (record.get(PROVENANCE), *record.get(RESUMED_WITH, [])) if p]

    def check_resume(self, config: dict[str, Any], resume: bool) -> bool:
        """Read-only: True when `resume` continues a run of the same `config`; ResumeConfigError for another one."""
        previous = self.read_config()
        if not resume or previous is None:
            return False
        previous, config = _with_later_settings(previous), _with_later_settings(config)
        differing = sorted(k for k in set(previous) | set(config) if previous.get(k) != config.get(k))
        if differing:
            details = "; ".join(f"{k}: was {previous.get(k)!r}, now {config.get(k)!r}" for k in differing)
            raise ResumeConfigError(
                f"cannot resume {self.out_dir}: it was run with a different configuration ({details}). "
                "Rerun with the original options, drop --resume to start over, or choose another --out."
            )
        return True

    def read_config(self) -> dict[str, Any] | None:
        """The stored settings (without the provenance records)."""
        record = self._read_record()
        return None if record is None else {k: v for k, v in record.items() if k not in (PROVENANCE, RESUMED_WITH)}

    def _read_record(self) -> dict[str, Any] | None:
        path = self.path(CONFIG_FILE)
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} is not valid JSON ({exc}); delete it or choose another --out") from exc

    # ------------------------------------------------------------ items

    def load_items(self) -> tuple[list[Item], list[Skipped]] | None:
        """The stored item set, or None when none was completely written."""
        items_path, skipped_path = self.path(ITEMS_FILE), self.path(SKIPPED_FILE)
        if not items_path.exists() or not skipped_path.exists():
            return None
        try:
            items = [Item.from_json(line) for line in items_path.read_text(encoding="utf-8").splitlines() if line]
            skipped = [Skipped(**json.loads(line)) for line in skipped_path.read_text(encoding="utf-8").splitlines()
                       if line]
        except (json.JSONDecodeError, TypeError) as exc:
            raise DataError(f"{items_path} or {skipped_path} is unreadable ({exc}); drop --resume to rebuild")
        return items, skipped

    def save_items(self, items: Sequence[Item], skipped: Sequence[Skipped]) -> bool:
        """Write the item set unless the stored one is identical; return True when the files were rewritten."""
        items_text = "".join(item.to_json() + "\n" for item in items)
        skipped_text = _jsonl(asdict(s) for s in skipped)
        items_path, skipped_path = self.path(ITEMS_FILE), self.path(SKIPPED_FILE)
        if (items_path.exists() and skipped_path.exists() and items_path.read_text(encoding="utf-8") == items_text
                and skipped_path.read_text(encoding="utf-8") == skipped_text):
            log.info("items.jsonl unchanged (%d items)", len(items))
            return False
        # skipped first: items.jsonl is the marker that the item set is complete.
        write_text_atomic(skipped_path, skipped_text)
        write_text_atomic(items_path, items_text)
        return True

    # ------------------------------------------------------------ append logs

    def logprobs(self) -> AppendLog:
        return AppendLog(self.path(LOGPROBS_FILE))

    def scores(self, rows_per_item: int) -> AppendLog:
        return AppendLog(self.path(SCORES_FILE), lambda _id: rows_per_item)

    def item_errors(self) -> AppendLog:
        return AppendLog(self.path(ITEM_ERRORS_FILE))

    def sensitivity(self) -> AppendLog:
        return AppendLog(self.path(SENSITIVITY_FILE))

    def existing_files(self) -> list[str]:
        names = (CONFIG_FILE, ITEMS_FILE, SKIPPED_FILE, LOGPROBS_FILE, SCORES_FILE, SENSITIVITY_FILE, ITEM_ERRORS_FILE,
                 SUMMARY_FILE)
        return [name for name in names if self.path(name).exists()]

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = self.path(SUMMARY_FILE)
        write_text_atomic(path, json.dumps(summary, indent=2, sort_keys=False, allow_nan=False) + "\n")
        return path
