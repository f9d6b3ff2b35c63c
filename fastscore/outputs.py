"""Writing results without ever losing a user's file.

- `check_not_an_input`: an output path that is one of the inputs (the same inode, whatever the spelling) is refused
  before anything is opened for writing.
- `PartialOutput`: a JSONL output written line by line into `OUT.partial` beside OUT, then fsynced and renamed over
  OUT only when complete. A failed or interrupted run leaves OUT as it was and its finished lines in OUT.partial,
  with the settings that produced them (`OUT.partial.json`), so `--resume` can continue it.
- `OutDirLock`: an exclusive lock on a run's output folder (the `filelock` package); a second run is refused with
  the holder's pid, host, start time and command.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from fastscore.errors import OutputError, ResumeConfigError

log = logging.getLogger(__name__)

STDIO = "-"
PARTIAL_SUFFIX = ".partial"
SETTINGS_SUFFIX = ".partial.json"
LOCK_FILE = ".fastscore.lock"
HOLDER_FILE = ".fastscore.lock.holder"


def is_stdio(path: Path | str | None) -> bool:
    return path is not None and str(path) == STDIO


def check_not_an_input(out: Path, inputs: Iterable[Path | str], what: str = "--out") -> None:
    """OutputError when `out` (or its partial file) is the same file as one of `inputs`."""
    candidates = [Path(out), partial_path(Path(out)), settings_path(Path(out))]
    for source in inputs:
        if is_stdio(source) or not Path(source).exists():
            continue
        for target in candidates:
            if target.exists() and os.path.samefile(target, source):
                raise OutputError(f"{what} {out} is the input file {source}: writing it would destroy the input; "
                                  "choose another output path")


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + PARTIAL_SUFFIX)


def settings_path(out: Path) -> Path:
    return out.with_name(out.name + SETTINGS_SUFFIX)


def refuse_unresumed_partial(out: Path, resume: bool) -> None:
    """A fresh run must not throw away the finished lines of an interrupted one."""
    partial = partial_path(Path(out))
    if partial.exists() and not resume:
        raise OutputError(f"{partial} holds the finished lines of an interrupted run: pass --resume to continue it, "
                          "or delete it to start over")


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a rename is durable only once its folder is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_parent(out: Path) -> None:
    """Create `out`'s folder; OutputError (one line) when it cannot be created or written into."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder of {out}: {exc.strerror or exc}") from None
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write into {out.parent} (permission denied)")


class PartialOutput:
    """OUT.partial, opened for a fresh run or for resuming one; `commit()` turns it into OUT.

    `done` holds the ids (as strings) already written when resuming; their lines are kept as they are.
    """

    def __init__(self, out: Path, settings: Mapping[str, Any], resume: bool) -> None:
        self.out = Path(out)
        self.partial = partial_path(self.out)
        self.settings_file = settings_path(self.out)
        self.settings = dict(settings)
        self.done: set[str] = set()
        ensure_parent(self.out)
        if self.partial.exists() and resume:
            self._reopen()
        else:
            refuse_unresumed_partial(self.out, resume)
            if resume:
                log.warning("nothing to resume for %s (no %s): starting a fresh run", self.out, self.partial.name)
            self._write_settings()
            self.fh = self._open("w")
        self.n_written = len(self.done)

    def _open(self, mode: str) -> IO[str]:
        try:
            return open(self.partial, mode, encoding="utf-8")
        except OSError as exc:
            raise OutputError(f"cannot write {self.partial}: {exc.strerror or exc}") from None

    def _write_settings(self) -> None:
        try:
            self.settings_file.write_text(json.dumps(self.settings, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        except OSError as exc:
            raise OutputError(f"cannot write {self.settings_file}: {exc.strerror or exc}") from None

    def _reopen(self) -> None:
        try:
            previous = json.loads(self.settings_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            previous = None
        if previous != self.settings:
            differing = sorted(k for k in set(previous or {}) | set(self.settings)
                               if (previous or {}).get(k) != self.settings.get(k))
            details = "; ".join(f"{k}: was {(previous or {}).get(k)!r}, now {self.settings.get(k)!r}"
                                for k in differing) or f"{self.settings_file.name} is missing or unreadable"
            raise ResumeConfigError(f"cannot resume {self.partial}: it was written with other settings ({details}). "
                                    "Rerun with the original options, or delete it to start over.")
        raw = self.partial.read_bytes()
        keep = 0  # bytes of complete, readable lines; a torn tail (no newline, or cut JSON) is dropped
        for line in raw.splitlines(keepends=True):
            try:
                record = json.loads(line)
                key = str(record["id"])
            except (ValueError, KeyError, TypeError):
                break
            if not line.endswith(b"\n"):
                break
            self.done.add(key)
            keep += len(line)
        if keep < len(raw):
            log.warning("%s: dropped %d byte(s) of a line an interruption left incomplete", self.partial, len(raw) - keep)
        self.fh = self._open("r+")
        self.fh.truncate(keep)
        self.fh.seek(keep)
        log.info("resuming %s: %d requests already scored", self.partial, len(self.done))

    def write(self, lines: Iterable[dict]) -> None:
        for line in lines:
            self.fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            self.n_written += 1
        self.fh.flush()

    def commit(self) -> None:
        """fsync, then rename OUT.partial over OUT: OUT is either the old file or the complete new one."""
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.partial, self.out)
        self.settings_file.unlink(missing_ok=True)
        fsync_path(self.out.parent)

    def close(self) -> None:
        """Keep what was written (for --resume) after a failure."""
        if not self.fh.closed:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self.fh.close()


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader never sees a half-written file (temporary file in the same folder,
    fsync, rename). Our own temporary name rather than mkstemp, whose files are private (0600): results are shared."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    write_atomic_with(path, write)


def write_atomic_with(path: Path, write) -> None:
    """write_text_atomic for any writer: `write(tmp)` writes the whole file at tmp, which then replaces `path`."""
    ensure_parent(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class OutDirLock:
    """An exclusive, non-blocking lock on an output folder for the whole run (created if missing)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._lock = None

    def __enter__(self) -> "OutDirLock":
        from filelock import FileLock, Timeout

        ensure_parent(self.folder / LOCK_FILE)
        self._lock = FileLock(str(self.folder / LOCK_FILE))
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise OutputError(f"{self.folder} is in use by another run ({self._holder()}); wait for it to finish "
                              "or choose another --out") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                  "command": " ".join(["fastscore", *sys.argv[1:]])}
        (self.folder / HOLDER_FILE).write_text(json.dumps(holder) + "\n", encoding="utf-8")
        return self

    def _holder(self) -> str:
        try:
            h = json.loads((self.folder / HOLDER_FILE).read_text(encoding="utf-8"))
            return f"pid {h['pid']} on {h['host']}, started {h['started']}: {h['command']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def __exit__(self, *exc) -> None:
        (self.folder / HOLDER_FILE).unlink(missing_ok=True)
        self._lock.release()
