"""A memory and process-count bound for a whole sandbox run (every process it starts), through a cgroup.

cgroup v2 where the unified hierarchy offers the memory and pids controllers and the caller may create groups; else
cgroup v1's memory and pids hierarchies (some VMs and older hosts); else nothing, and the sandbox falls back to
per-process limits (see sandbox.py). The caller's process never enters the group: a tiny shell writes its own pid
into the group's `cgroup.procs` and then execs the sandbox, so every descendant is born inside it.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()
# Joins the groups named by the first $1 arguments, then execs the rest. Exit 125 when a group cannot be joined.
JOIN_AND_EXEC = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
JOIN_FAILED_EXIT_CODE = 125


@dataclass(frozen=True)
class _Layout:
    version: int
    parents: tuple[Path, ...]  # v2: one folder; v1: the memory folder, then the pids folder


def _own_path(controller: str) -> str:
    """This process's group in a v1 hierarchy (`memory`, `pids`) or in v2 (`""`), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    raise OSError(f"no {controller or 'unified'} cgroup for this process")


def _try_v2() -> _Layout:
    controllers = (ROOT / "cgroup.controllers").read_text().split()
    if not {"memory", "pids"} <= set(controllers):
        raise OSError("the cgroup v2 root lacks the memory or pids controller")
    # A group with processes cannot enable controllers for children ("no internal processes"): our own folder's
    # subtree is used only if enabling works; the root's always does for root.
    parent = ROOT / "fastscore-sandbox"
    parent.mkdir(exist_ok=True)
    (ROOT / "cgroup.subtree_control").write_text("+memory +pids")
    (parent / "cgroup.subtree_control").write_text("+memory +pids")
    return _Layout(2, (parent,))


def _try_v1() -> _Layout:
    parents = []
    for controller in ("memory", "pids"):
        mount = ROOT / controller
        if not (mount / "cgroup.procs").exists():
            raise OSError(f"no cgroup v1 {controller} hierarchy at {mount}")
        parent = mount / _own_path(controller) / "fastscore-sandbox"
        parent.mkdir(exist_ok=True)
        parents.append(parent)
    return _Layout(1, tuple(parents))


@lru_cache(maxsize=1)
def layout() -> _Layout | None:
    """Where run groups go, found once per process; None if this host offers no writable cgroup."""
    reasons = []
    for attempt in (_try_v2, _try_v1):
        try:
            found = attempt()
            log.info("sandbox runs are bounded by cgroup v%d (%s)", found.version, ", ".join(map(str, found.parents)))
            return found
        except OSError as exc:
            reasons.append(f"{attempt.__name__[5:]}: {exc}")
    log.info("no writable cgroup (%s); sandbox runs fall back to per-process limits", "; ".join(reasons))
    return None


class RunGroup:
    """One run's cgroup: `memory_bytes` for all its processes together (no swap) and at most `max_tasks` tasks."""

    def __init__(self, where: _Layout, memory_bytes: int, max_tasks: int):
        self.version = where.version
        name = f"run-{os.getpid()}-{next(_counter)}"
        self.folders = tuple(parent / name for parent in where.parents)
        for folder in self.folders:
            folder.mkdir()
        if self.version == 2:
            (folder,) = self.folders
            self._write(folder / "memory.max", memory_bytes)
            self._write(folder / "memory.swap.max", 0, optional=True)
            self._write(folder / "pids.max", max_tasks)
        else:
            memory, pids = self.folders
            self._write(memory / "memory.limit_in_bytes", memory_bytes)
            self._write(memory / "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
            self._write(pids / "pids.max", max_tasks)

    @staticmethod
    def _write(path: Path, value: int, optional: bool = False) -> None:
        try:
            path.write_text(str(value))
        except OSError:
            if not optional:
                raise

    @property
    def procs_files(self) -> tuple[str, ...]:
        return tuple(str(folder / "cgroup.procs") for folder in self.folders)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this run for exceeding the memory bound."""
        events = self.folders[0] / ("memory.events" if self.version == 2 else "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def _pids(self) -> list[int]:
        try:
            return [int(p) for p in Path(self.procs_files[-1]).read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        if self.version == 2 and (self.folders[0] / "cgroup.kill").exists():
            self._write(self.folders[0] / "cgroup.kill", 1, optional=True)
            return
        for _ in range(3):  # a process forking while we read the list: go again
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def remove(self) -> None:
        """Kill what is left and remove the folders (a group can be removed once its processes are gone)."""
        self.kill_all()
        deadline = time.monotonic() + 2.0
        for folder in self.folders:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s", folder)
                        break
                    time.sleep(0.01)
