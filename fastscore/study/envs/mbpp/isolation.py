"""The bubblewrap command line of a sandbox run, and whether bubblewrap works on this host."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal

from fastscore.errors import SandboxUnavailableError

log = logging.getLogger(__name__)

Isolation = Literal["bwrap", "rlimits"]
ISOLATIONS: tuple[Isolation, ...] = ("bwrap", "rlimits")
INSTALL_HINT = "sudo apt-get install -y bubblewrap"
NOT_ISOLATED_NOTE = "MBPP verdicts: rlimits only, not isolated"
NOBODY = "65534"

# Only what a plain Python program needs; nothing from the parent's environment leaks through.
_CHILD_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}
# Top-level system folders the interpreter may need; on merged-/usr systems all but /usr are symlinks into it.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def child_environment() -> dict[str, str]:
    return dict(_CHILD_ENV)


def harness_python() -> str:
    """The base interpreter behind the running one (a venv's python is a symlink to it), fully resolved."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _system_binds() -> list[str]:
    args: list[str] = []
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    prefix = os.path.realpath(sys.base_prefix)
    python_dir = os.path.dirname(harness_python())
    for folder in dict.fromkeys((prefix, python_dir)):  # e.g. a pyenv or /opt install outside /usr
        if not any(folder == d or folder.startswith(d + "/") for d in _SYSTEM_DIRS):
            args += ["--ro-bind", folder, folder]
    return args + ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]


def bwrap_command(inbox: Path, tmp_mb: int, argv: list[str]) -> list[str]:
    """bwrap around `argv`: every namespace new, the system read-only, `inbox` read-only at /sandbox, a private
    size-capped tmpfs at /tmp as the cwd and the only writable place, and the minimal environment."""
    command = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all", "--unshare-user", "--uid", NOBODY, "--gid", NOBODY, "--hostname", "sandbox",
        "--die-with-parent", "--new-session",
        *_system_binds(),
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
        "--ro-bind", str(inbox), "/sandbox",
        "--chdir", "/tmp",
        "--clearenv",
    ]  # fmt: skip
    if os.geteuid() == 0:
        command += ["--cap-drop", "ALL"]
    for name, value in _CHILD_ENV.items():
        command += ["--setenv", name, value]
    return [*command, "--", *argv]


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run sandboxes here, or None if it can (checked once per process)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    probe = bwrap_command(Path("/"), 1, [harness_python(), "-S", "-c", "pass"])
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, env=child_environment())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not be started: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return f"bwrap cannot create its sandbox here ({detail[-1] if detail else f'exit {done.returncode}'})"
    return None


def require_isolation(isolation: str) -> None:
    """SandboxUnavailableError unless `isolation` can be used on this host."""
    if isolation not in ISOLATIONS:
        raise SandboxUnavailableError(f"unknown sandbox {isolation!r}: choose from {', '.join(ISOLATIONS)}")
    if isolation == "bwrap":
        problem = bwrap_problem()
        if problem is not None:
            raise SandboxUnavailableError(
                f"{problem}. Install it with `{INSTALL_HINT}`, or run the study's MBPP programs without isolation "
                f"with `fastscore study --sandbox rlimits` (the report then says: {NOT_ISOLATED_NOTE})."
            )
