"""The bubblewrap command line of a sandbox run, who the program runs as, and whether the sandbox works here.

Who the program is on the host: never the caller's root. When fastscore runs as root, bubblewrap runs privileged
without a user namespace (one would map the program to host uid 0, i.e. root for every file permission and
/proc/sys), and the harness itself becomes `nobody` (uid and gid 65534, no supplementary groups) before any program
text runs; bwrap keeps only CAP_SETUID and CAP_SETGID for that, and no_new_privs means nothing is regained by exec.
As a normal user, bubblewrap's user namespace maps the program's uid 65534 to that user. Either way the program is an
unprivileged host uid. The --sandbox rlimits mode drops to `nobody` the same way when run as root
(docs/sandbox-design.md).
"""

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
# One definition, in the harness (the exit code it uses; the Landlock syscall it calls): the host side reads them.
from fastscore.study.data.envs.mbpp.harness import _LANDLOCK_CREATE_RULESET, DROP_FAILED_EXIT_CODE  # noqa: F401
from fastscore.study.data.envs.mbpp.seccomp import filter_program

log = logging.getLogger(__name__)

Isolation = Literal["bwrap", "rlimits"]
ISOLATIONS: tuple[Isolation, ...] = ("bwrap", "rlimits")
INSTALL_HINT = "sudo apt-get install -y bubblewrap"
NOT_ISOLATED_NOTE = "MBPP verdicts: --sandbox rlimits, NOT ISOLATED"
NOBODY = 65534
PYTHON_ENV = "FASTSCORE_SANDBOX_PYTHON"  # the interpreter programs run under, if not the one running fastscore

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


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 without Landlock (harness._confine uses it under --sandbox rlimits)."""
    import ctypes

    try:
        return max(0, ctypes.CDLL(None, use_errno=True).syscall(_LANDLOCK_CREATE_RULESET, None, 0, 1))  # its version
    except (OSError, AttributeError):
        return 0


def rlimits_note() -> str:
    """What a study report says of --sandbox rlimits: what its programs could and could not do."""
    writes = ("refused by Landlock" if landlock_abi() else "NOT refused (this kernel has no Landlock): world-writable "
              "folders such as /tmp were writable")  # fmt: skip
    who = "as the user nobody" if drop_to() >= 0 else "as the user running fastscore"
    return (f"{NOT_ISOLATED_NOTE}: programs ran {who} in the host's namespaces, able to read world-readable files and "
            f"see host processes; writes outside their temp directory were {writes}; "
            + ("a seccomp filter refused sockets other than AF_UNIX" if filter_program() else "no seccomp filter"))


def child_environment() -> dict[str, str]:
    return dict(_CHILD_ENV)


def harness_python() -> str:
    """$FASTSCORE_SANDBOX_PYTHON, else the base interpreter behind the running one (a venv's python is a symlink to
    it), fully resolved."""
    return os.path.realpath(os.environ.get(PYTHON_ENV) or getattr(sys, "_base_executable", None) or sys.executable)


def drop_to() -> int:
    """The uid (= gid) the harness becomes before running the program, or -1 to stay (not root: nothing to drop)."""
    return NOBODY if os.geteuid() == 0 else -1


def _python_prefix() -> str:
    """The installation holding the interpreter and its standard library."""
    python = harness_python()
    if os.environ.get(PYTHON_ENV):
        return os.path.dirname(os.path.dirname(python))  # <prefix>/bin/python3.x
    return os.path.realpath(sys.base_prefix)


def _system_binds() -> list[str]:
    args: list[str] = []
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    python_dir = os.path.dirname(harness_python())
    for folder in dict.fromkeys((_python_prefix(), python_dir)):  # e.g. a pyenv or /opt install outside /usr
        if not any(folder == d or folder.startswith(d + "/") for d in _SYSTEM_DIRS):
            # bwrap copies the modes of the folders above a bind (e.g. /root's 0700): open them for `nobody`.
            parents = Path(folder).parents
            for parent in reversed([str(p) for p in parents if str(p) != "/"]):
                args += ["--perms", "0755", "--dir", parent]
            args += ["--ro-bind", folder, folder]
    return args + ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]


def bwrap_command(inbox: Path, tmp_mb: int, argv: list[str], seccomp_fd: int | None = None) -> list[str]:
    """bwrap around `argv`: new pid, net, ipc, uts and cgroup namespaces (and a user namespace unless root: see the
    module's docstring), a read-only root with the system read-only in it, `inbox` read-only at /sandbox, /proc
    with /proc/sys read-only, a read-only /dev, a private size-capped tmpfs at /tmp as the cwd and the only writable
    place, the seccomp filter read from `seccomp_fd`, and the minimal environment."""
    if os.geteuid() == 0:
        who = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        who = ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    command = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", *who,
        "--hostname", "sandbox", "--die-with-parent", "--new-session",
        *_system_binds(),
        "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
        "--dev", "/dev", "--remount-ro", "/dev",
        "--perms", "1777", "--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
        "--ro-bind", str(inbox), "/sandbox",
        "--remount-ro", "/",
        "--chdir", "/tmp",
        "--clearenv",
    ]  # fmt: skip
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    for name, value in _CHILD_ENV.items():
        command += ["--setenv", name, value]
    return [*command, "--", *argv]


def _why_it_fails(command: list[str], what: str, **popen) -> str | None:
    """None if `command` runs and exits 0, else why not in one clause starting with `what`."""
    try:
        done = subprocess.run(command, capture_output=True, timeout=30, env=child_environment(), **popen)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{what}: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return f"{what} ({detail[-1] if detail else f'exit {done.returncode}'})"
    return None


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run sandboxes here, or None if it can (checked once per process)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    probe = bwrap_command(Path("/"), 1, [harness_python(), "-S", "-c", "pass"])
    return _why_it_fails(probe, "bwrap cannot create its sandbox here")


def rlimits_problem() -> str | None:
    """Why --sandbox rlimits cannot run programs here, or None: as root it runs them as `nobody`, who must be able
    to start the interpreter and import its standard library (a pyenv under /root, mode 0700, is out of reach)."""
    return None if drop_to() < 0 else _nobody_cannot_run(harness_python())


@lru_cache(maxsize=4)
def _nobody_cannot_run(python: str) -> str | None:
    return _why_it_fails([python, "-S", "-c", "import json, collections"], f"the user nobody cannot run {python}",
                         cwd="/", user=NOBODY, group=NOBODY, extra_groups=[])  # fmt: skip


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
    elif (problem := rlimits_problem()) is not None:
        raise SandboxUnavailableError(
            f"--sandbox rlimits runs programs as the user nobody when fastscore runs as root, but {problem}. Run "
            f"fastscore as a normal user, use --sandbox bwrap, or set {PYTHON_ENV} to an interpreter nobody can run."
        )
