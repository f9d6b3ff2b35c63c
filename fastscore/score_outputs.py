"""Every file a `score` run writes, named in one place, and what is checked before any of them is touched.

A run on OUT writes the JSONL record (OUT itself, or OUT.jsonl beside a --format csv/parquet table), its
RECORD.partial and RECORD.partial.json while it runs, RECORD.skipped.jsonl (--on-error skip), OUT.meta.json, the
temporary files of atomic writes (`.NAME.PID.tmp`), and its lock `.OUT.lock` (+ `.holder`) beside OUT. None of them
may be an input, and no two may be the same file, whatever the spelling (`./`, `..`, absolute, symlink, hard link):
`ScoreOutputs.check` refuses that before anything is opened. `ScoreOutputs.lock` holds OUT for the whole run, so a
second run on the same OUT is refused in one line (OutputBusyError, exit code 10) instead of interleaving lines.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fastscore.errors import OutputError
from fastscore.outputs import ExclusiveLock, atomic_tmp_path, holder_path, is_stdio, partial_path, settings_path
from fastscore.provenance import meta_path

SKIPPED_SUFFIX = ".skipped.jsonl"  # beside the record: the lines on_error="skip" set aside, with their reasons
RECORD_SUFFIX = ".jsonl"  # beside a table output: the resumable JSONL record the table is made from

# Lock files held, with the thread holding each: run_score locks OUT, and score_file inside it (same thread) may
# again; another thread of the process scoring the same OUT must wait like another process.
_HELD: dict[str, int] = {}


def skipped_path(record: Path) -> Path:
    return record.with_name(record.name + SKIPPED_SUFFIX)


def _where(path: Path) -> str:
    """The directory entry a path names, whatever its spelling (the folder resolved, the name itself kept: a
    symlink named OUT is replaced, not followed, by a rename)."""
    return os.path.join(os.path.realpath(path.parent), path.name)


def same_file(a: Path | str, b: Path | str) -> bool:
    """The same directory entry, or (both existing) the same file through a symlink or a hard link."""
    if _where(Path(a)) == _where(Path(b)):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@dataclass(frozen=True)
class ScoreOutputs:
    out: Path  # as given by --out: the table, or the JSONL record itself
    record: Path  # the JSONL the lines are streamed into

    @classmethod
    def of(cls, out: Path | str, out_format: str = "jsonl") -> "ScoreOutputs":
        out = Path(out)
        if out_format != "jsonl":
            if is_stdio(out):
                raise OutputError(f"--format {out_format} needs an output file, not stdout")
            return cls(out, out.with_name(out.name + RECORD_SUFFIX))
        return cls(out, out)

    @property
    def table(self) -> Path | None:
        return None if self.record == self.out else self.out

    @property
    def lock_file(self) -> Path:
        return Path(os.path.realpath(self.out.parent)) / f".{self.out.name}.lock"

    def files(self) -> dict[str, Path]:
        """Every file the run may write, by what it is."""
        meta = meta_path(self.out)
        lock = self.lock_file
        files = {"--out": self.out}
        if self.table is not None:
            files |= {"the table's temporary file": atomic_tmp_path(self.out), "the JSONL record": self.record}
        return files | {
            "the partial file": partial_path(self.record),
            "the partial file's settings": settings_path(self.record),
            "the skipped-lines list": skipped_path(self.record),
            "its temporary file": atomic_tmp_path(skipped_path(self.record)),
            "the metadata sidecar": meta,
            "the metadata's temporary file": atomic_tmp_path(meta),
            "the lock file": lock,
            "the lock's holder file": holder_path(lock),
        }

    def check(self, inputs: Iterable[Path | str]) -> None:
        """OutputError, before anything is touched, when a file of the run is an input or another of its files."""
        if is_stdio(self.out):
            return
        files = list(self.files().items())
        derived = "" if self.record == self.out else f" (derived from --out {self.out})"
        for source in inputs:
            if is_stdio(source):
                continue
            for role, path in files:
                if same_file(path, source):
                    named = f"--out {path}" if role == "--out" else f"{role} {path} (derived from --out {self.out})"
                    raise OutputError(f"{named} is the input file {source}: writing it would destroy the input; "
                                      "choose another --out")
        for k, (role, path) in enumerate(files):
            for other_role, other in files[k + 1:]:
                if same_file(path, other):
                    raise OutputError(f"{role} {path} and {other_role} {other}{derived} are the same file: "
                                      "choose another --out")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold OUT for the run (re-entrant within this process); stdout takes no lock."""
        key = str(self.lock_file)
        if is_stdio(self.out) or _HELD.get(key) == threading.get_ident():
            yield
            return
        with ExclusiveLock(self.lock_file, f"--out {self.out}", "wait for it to finish or choose another --out"):
            _HELD[key] = threading.get_ident()
            try:
                yield
            finally:
                del _HELD[key]
