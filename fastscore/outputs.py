"""Writing results without ever losing a user's file.

- `check_not_an_input`: an output path that is one of the inputs (the same inode, whatever the spelling) is refused
  before anything is opened for writing.
- `PartialOutput`: a JSONL output written line by line into `OUT.partial` beside OUT, then fsynced and renamed over
  OUT only when complete. A failed or interrupted run leaves OUT as it was and its finished lines in OUT.partial,
  with the settings that produced them (`OUT.partial.json`), so `--resume` can continue it, or `--restart`
  discard them. A partial file that holds no finished line is removed, so it never stands in the way of a retry.
- `ExclusiveLock`: an exclusive lock for a whole run (the `filelock` package); a second run is refused with the
  holder's pid, host, start time and command. `OutDirLock` locks a run's output folder; `score` locks a file
  beside OUT (fastscore.score_outputs).
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

from fastscore.errors import OutputBusyError, OutputError, ResumeConfigError

log = logging.getLogger(__name__)

STDIO = "-"
PARTIAL_SUFFIX = ".partial"
SETTINGS_SUFFIX = ".partial.json"
LOCK_FILE = ".fastscore.lock"
HOLDER_SUFFIX = ".holder"
HOLDER_FILE = LOCK_FILE + HOLDER_SUFFIX


def holder_path(lock_file: Path) -> Path:
    """The file beside a lock that names its holder (pid, host, start, command)."""
    return lock_file.with_name(lock_file.name + HOLDER_SUFFIX)


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


def complete_lines(data: bytes) -> tuple[int, int]:
    """(number, bytes) of the complete, readable JSON lines at the start of a partial file: a torn tail (no newline,
    or cut JSON) and what follows it do not count."""
    count = keep = 0
    for line in data.splitlines(keepends=True):
        try:
            str(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            break
        if not line.endswith(b"\n"):
            break
        count += 1
        keep += len(line)
    return count, keep


def discard_partial(out: Path) -> None:
    partial_path(Path(out)).unlink(missing_ok=True)
    settings_path(Path(out)).unlink(missing_ok=True)


def refuse_unresumed_partial(out: Path, resume: bool, restart: bool = False) -> None:
    """A fresh run must not throw away the finished lines of an interrupted one; a partial file holding none (or
    `restart`) is deleted, so it never stands in the way of the retry."""
    partial = partial_path(Path(out))
    if resume or not partial.exists():
        return
    try:
        n_lines, _ = complete_lines(partial.read_bytes())
    except OSError as exc:
        raise OutputError(f"cannot read {partial}: {exc.strerror or exc}") from None
    if n_lines and not restart:
        raise OutputError(f"{partial} holds the {n_lines} finished lines of an interrupted run: pass --resume to "
                          "continue it, or --restart to discard them and start over")
    if n_lines:
        log.warning("--restart: discarding the %d finished lines of %s", n_lines, partial)
    discard_partial(Path(out))


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
    """OUT.partial, opened for a fresh run (`restart`: discarding an interrupted run's lines) or for resuming one;
    `commit()` turns it into OUT.

    `done` holds the ids (as strings) already written when resuming; their lines are kept as they are. Every
    `write` is fsynced, and `n_durable` / `durable_bytes` say what is on disk: a write that fails (a full disk) is
    cut back to them, so the file never ends in a torn line and a message can say exactly what was kept.
    """

    def __init__(self, out: Path, settings: Mapping[str, Any], resume: bool, restart: bool = False) -> None:
        self.out = Path(out)
        self.partial = partial_path(self.out)
        self.settings_file = settings_path(self.out)
        self.settings = dict(settings)
        self.done: set[str] = set()
        self.fd: int | None = None
        self.committed = False  # OUT.partial has been renamed to OUT: the lines are in OUT, whatever fails after
        ensure_parent(self.out)
        if self.partial.exists() and resume:
            self.durable_bytes = self._reopen()
        else:
            refuse_unresumed_partial(self.out, resume, restart)
            if resume:
                log.warning("nothing to resume for %s (no %s): starting a fresh run", self.out, self.partial.name)
            self._write_settings()
            self.fd = self._open(os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            self.durable_bytes = 0
        self.n_written = self.n_durable = len(self.done)

    def _open(self, flags: int) -> int:
        try:
            return os.open(self.partial, flags, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot write {self.partial}: {exc.strerror or exc}") from None

    def _write_settings(self) -> None:
        try:
            self.settings_file.write_text(json.dumps(self.settings, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        except OSError as exc:
            self.settings_file.unlink(missing_ok=True)
            raise OutputError(f"cannot write {self.settings_file}: {exc.strerror or exc}") from None

    def _reopen(self) -> int:
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
                                    "Rerun with the original options, or with --restart to discard it and start over.")
        raw = self.partial.read_bytes()
        _, keep = complete_lines(raw)
        self.done = {str(json.loads(line)["id"]) for line in raw[:keep].splitlines()}
        if keep < len(raw):
            log.warning("%s: dropped %d byte(s) of a line an interruption left incomplete", self.partial, len(raw) - keep)
        self.fd = self._open(os.O_WRONLY)
        try:
            os.ftruncate(self.fd, keep)
            os.lseek(self.fd, keep, os.SEEK_SET)
        except OSError as exc:
            raise OutputError(f"cannot write {self.partial}: {exc.strerror or exc}") from None
        log.info("resuming %s: %d requests already scored", self.partial, len(self.done))
        return keep

    def write(self, lines: Iterable[dict]) -> None:
        """Append the lines and fsync them; OutputError (the file cut back to its last complete line) on failure."""
        lines = list(lines)
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
            os.fsync(self.fd)
        except OSError as exc:
            self._cut_back()
            raise OutputError(f"cannot write {self.partial}: {exc.strerror or exc}") from None
        self.n_written += len(lines)
        self.n_durable = self.n_written
        self.durable_bytes += len(data)

    def _cut_back(self) -> None:
        """After a failed write: drop its bytes (a torn line), so the file holds exactly the fsynced lines."""
        try:
            os.ftruncate(self.fd, self.durable_bytes)
            os.lseek(self.fd, self.durable_bytes, os.SEEK_SET)
            os.fsync(self.fd)
        except OSError as exc:  # --resume drops a torn tail all the same
            log.warning("cannot cut %s back to its %d complete lines: %s", self.partial, self.n_durable, exc)

    def kept(self) -> str:
        """What a failed run leaves on disk, and what to do next (a note for the error message)."""
        if self.committed:
            return (f"all {self.n_durable} lines are in {self.out} (the rename from {self.partial.name} was done; only "
                    "what follows it failed): the output is complete")
        if self.n_durable:
            return (f"the {self.n_durable} finished lines are kept in {self.partial} ({self.durable_bytes} bytes, "
                    "fsynced): rerun with --resume to continue, or with --restart to start over")
        return f"nothing was kept (no line had finished; {self.partial.name} removed): rerun as it was"

    def commit(self) -> None:
        """fsync, then rename OUT.partial over OUT: OUT is either the old file or the complete new one."""
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            os.replace(self.partial, self.out)
            self.committed = True
            self.settings_file.unlink(missing_ok=True)
            fsync_path(self.out.parent)
        except OSError as exc:
            raise OutputError(f"cannot write {self.out}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """After a failure: keep what was written (for --resume), cut back to the fsynced lines (an interrupt may
        have landed inside a write), or remove a partial file that holds nothing."""
        if self.fd is not None:
            self._cut_back()
            os.close(self.fd)
            self.fd = None
        if not self.n_durable and not self.committed:
            discard_partial(self.out)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader never sees a half-written file (temporary file in the same folder,
    fsync, rename). Our own temporary name rather than mkstemp, whose files are private (0600): results are shared."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    write_atomic_with(path, write)


def atomic_tmp_path(path: Path) -> Path:
    """The temporary file `write_atomic_with` writes before renaming it over `path`."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic_with(path: Path, write) -> None:
    """write_text_atomic for any writer: `write(tmp)` writes the whole file at tmp, which then replaces `path`."""
    ensure_parent(path)
    tmp = atomic_tmp_path(path)
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


class ExclusiveLock:
    """An exclusive, non-blocking lock held for a whole run (the `filelock` package): a second run is refused with
    the holder's pid, host, start time and command, read from `HOLDER` beside the lock file (filelock truncates the
    lock file itself when it opens it). The lock file stays (deleting it would let a waiting run lock a stale inode)."""

    def __init__(self, lock_file: Path, what: str, hint: str) -> None:
        self.lock_file, self.what, self.hint = Path(lock_file), what, hint
        self.holder_file = holder_path(self.lock_file)
        self._lock = None

    def __enter__(self) -> "ExclusiveLock":
        from filelock import FileLock, Timeout

        ensure_parent(self.lock_file)
        try:  # filelock reports a lock file it cannot create as a timeout: tell "not writable" apart first
            os.close(os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644))
        except OSError as exc:
            raise OutputError(f"cannot write {self.lock_file} (the lock of {self.what}): {exc.strerror or exc}"
                              ) from None
        self._lock = FileLock(str(self.lock_file))
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise OutputBusyError(f"{self.what} is in use by another run ({self._holder()}); {self.hint}") from None
        except OSError as exc:
            raise OutputError(f"cannot lock {self.what} ({self.lock_file}): {exc.strerror or exc}") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                  "command": " ".join(["fastscore", *sys.argv[1:]])}
        try:
            self.holder_file.write_text(json.dumps(holder) + "\n", encoding="utf-8")
        except OSError:  # a full disk: the lock holds all the same, a refused run only lacks the holder's name
            log.warning("cannot write %s", self.holder_file)
        return self

    def _holder(self) -> str:
        try:
            h = json.loads(self.holder_file.read_text(encoding="utf-8"))
            return f"pid {h['pid']} on {h['host']}, started {h['started']}: {h['command']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def __exit__(self, *exc) -> None:
        self.holder_file.unlink(missing_ok=True)
        self._lock.release()


class OutDirLock(ExclusiveLock):
    """The lock on a run's output folder (created if missing)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        super().__init__(self.folder / LOCK_FILE, str(self.folder), "wait for it to finish or choose another --out")
