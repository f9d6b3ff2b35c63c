"""Run an untrusted program against its assert-tests, isolated, and judge the result outside the sandbox.

Every way a program can go wrong (failing assert, exception, hang, memory exhaustion, hard crash, tampering with the
report) comes back as a `RunOutcome`; nothing the program does raises out of `run_program`.

Two isolation modes (docs/sandbox-design.md):
- "bwrap" (default): bubblewrap gives the run new pid, net, ipc, uts and cgroup namespaces (and a user namespace
  unless fastscore is root), a read-only root holding a read-only view of the system's /usr and the Python
  installation only, a size-capped private tmpfs as /tmp (the only writable place), a fresh /proc with /proc/sys
  read-only, no network, a seccomp filter (seccomp.py), and no environment but a minimal one; the program is an
  unprivileged host uid (isolation.py). When the run ends, its pid namespace ends with it: no descendant survives,
  however it detached.
- "rlimits": a plain subprocess in its own session with rlimits and a temp cwd, as the user nobody when fastscore
  is root. No isolation: for hosts without bubblewrap, and every study report then says so.
In both modes a cgroup bounds the memory and the number of processes of the whole run where the host lets us create
one (cgroups.py); elsewhere RLIMIT_AS per process and, under bwrap, RLIMIT_NPROC (per user namespace; when fastscore
is root there is none, and it counts every process of the user nobody on the host).

The verdict: see verdict.py (values, not self-reported results) and harness.py (what runs inside). Whatever the
program writes, `run_program` returns a RunOutcome: a flood, a malformed or oversized record is a "crash".

Why the limits are set by the harness and not in `preexec_fn`: `run_many` starts processes from a thread pool, and
`preexec_fn` is unsafe in the presence of threads. The harness sets them as its first statements, hard == soft.
Why `-S`: the program gets the standard library only (no site-packages of whichever venv runs fastscore), and the
interpreter starts in ~15 ms instead of ~80. PYTHONHASHSEED is fixed (a few MBPP references return
`tuple(set(...))`), so `-E`/`-I` is not used.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Literal

from fastscore.errors import SandboxUnavailableError
from fastscore.study.data.envs.mbpp import cgroups
from fastscore.study.data.envs.mbpp.harness import CONFINE_FAILED_EXIT_CODE, MAX_RECORD_BYTES, MEMORY_EXIT_CODE
from fastscore.study.data.envs.mbpp.isolation import (
    DROP_FAILED_EXIT_CODE, ISOLATIONS, Isolation, bwrap_command, child_environment, drop_to, harness_python,
    require_isolation,
)  # fmt: skip
from fastscore.study.data.envs.mbpp.seccomp import filter_program
from fastscore.study.data.envs.mbpp.verdict import Decision, Judge, MalformedRecord, TestPlan, plan_test, read_record

log = logging.getLogger(__name__)

__all__ = ["ISOLATIONS", "RunOutcome", "RunRequest", "SandboxLimits", "run_many", "run_program", "use_isolation"]

Status = Literal["passed", "failed", "error", "timeout", "memory", "crash"]

MESSAGE_LIMIT = 1000  # characters of an error message kept (an exception text can be arbitrarily long)
_STDERR_TAIL = 4000
_RECORDS_BUDGET = 16 * 1024 * 1024  # bytes of records read from one run; a flood beyond it is a crash
_HARNESS = Path(__file__).with_name("harness.py")
_default_isolation: Isolation = "bwrap"


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock; the whole run is killed when it is exceeded
    memory_mb: int = 512  # RLIMIT_AS of each process; with a cgroup, also the bound of all processes together
    cpu_s: int | None = None  # RLIMIT_CPU; default: the wall timeout rounded up, plus one second
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    tmp_mb: int = 64  # size of the private /tmp under bwrap (counts towards the cgroup's memory)
    max_processes: int = 128  # tasks (processes and threads) of the whole run

    @property
    def cpu_seconds(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(-(-self.timeout_s // 1)) + 1


@dataclass(frozen=True)
class RunOutcome:
    passed: bool
    status: Status
    message: str  # what the test run printed: the failing assert, the last traceback line, or the limit hit
    seconds: float  # wall time of the run
    failing_test: str = ""  # source of the test that failed or raised ("" if it passed or failed before the tests)


@dataclass(frozen=True)
class RunRequest:
    program: str
    tests: tuple[str, ...]
    setup_code: str = ""


@contextlib.contextmanager
def use_isolation(isolation: Isolation) -> Iterator[None]:
    """Within the block, runs without an explicit `isolation` use this one (a study's --sandbox option)."""
    global _default_isolation
    require_isolation(isolation)
    previous, _default_isolation = _default_isolation, isolation
    try:
        yield
    finally:
        _default_isolation = previous


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _memory_outcome(limits: SandboxLimits, seconds: float, test: str = "") -> RunOutcome:
    message = f"MemoryError: the program exceeded the {limits.memory_mb} MB memory limit"
    return RunOutcome(False, "memory", message, seconds, test)


def _outcome_without_verdict(
    returncode: int, isolation: Isolation, stderr_tail: str, oom: bool, limits: SandboxLimits, seconds: float
) -> RunOutcome:
    """The harness stopped before a decisive record: classify from the exit status, the cgroup and stderr."""
    # bwrap reports a child killed by signal N as exit status 128 + N; a plain subprocess as -N.
    killed_by = -returncode if returncode < 0 else 0
    if isolation == "bwrap" and returncode > 128:
        killed_by = returncode - 128
    if oom or returncode == MEMORY_EXIT_CODE or "MemoryError" in stderr_tail:
        return _memory_outcome(limits, seconds)
    # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL one second later at the hard limit.
    if killed_by == signal.SIGXCPU or (killed_by == signal.SIGKILL and seconds >= limits.cpu_seconds):
        return RunOutcome(False, "timeout", f"Timeout: the tests used more than {limits.cpu_seconds} s of CPU time",
                          seconds)  # fmt: skip
    if killed_by:
        return RunOutcome(False, "crash", f"Crash: the process was killed by {_signal_name(killed_by)}", seconds)
    message = f"Crash: the process exited with code {returncode} before the tests finished"
    return RunOutcome(False, "crash", message, seconds)


def _outcome(decision: Decision, returncode: int | None, limits: SandboxLimits, seconds: float) -> RunOutcome:
    if decision.status == "memory":
        return _memory_outcome(limits, seconds, decision.failing_test)
    if decision.status == "passed" and returncode != 0:
        return RunOutcome(False, "crash", f"Crash: the run reported its tests but exited with {returncode}", seconds)
    return RunOutcome(decision.status == "passed", decision.status, _clip(decision.message), seconds,
                      decision.failing_test)  # fmt: skip


class _Reader:
    """The caller's end of the records pipe: complete lines, within a deadline and a byte budget."""

    def __init__(self, fd: int, deadline: float):
        self.fd, self.deadline = fd, deadline
        self.selector = selectors.DefaultSelector()
        self.selector.register(fd, selectors.EVENT_READ)
        self.buffer = b""
        self.received = 0

    def lines(self) -> Iterator[bytes]:
        """Yields lines until EOF; raises TimeoutError at the deadline, MalformedRecord past the budget or when a
        line grows longer than any record the harness writes."""
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                yield line
            if len(self.buffer) > MAX_RECORD_BYTES:
                raise MalformedRecord(f"a record longer than the harness writes ({MAX_RECORD_BYTES} bytes)")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or not self.selector.select(remaining):
                raise TimeoutError
            data = os.read(self.fd, 1 << 16)
            if not data:
                return
            self.received += len(data)
            if self.received > _RECORDS_BUDGET:
                raise MalformedRecord("more output on the records channel than any report needs")
            self.buffer += data

    def close(self) -> None:
        self.selector.close()
        os.close(self.fd)


def _judge_run(reader: _Reader, judge: Judge) -> Decision | None:
    """The decision the records settle, or None if the channel closed first. TimeoutError at the deadline."""
    try:
        for line in reader.lines():
            decision = judge.feed(read_record(line))
            if decision is not None:
                return decision
    except MalformedRecord as exc:
        return Decision("crash", f"Crash: the test run's report was malformed ({exc})")
    return None


def _command(isolation: Isolation, inbox: Path, records_fd: int, token_fd: int, limits: SandboxLimits,
             bounded: bool, seccomp_fd: int | None) -> list[str]:  # fmt: skip
    """The command line of the run (its cwd is `inbox`/work; under bwrap the program's cwd is its private /tmp)."""
    # Without a cgroup, RLIMIT_NPROC bounds forks under bwrap (it counts per user namespace there, or, as root, the
    # host's processes of nobody); in the rlimits mode it would count every process of the caller's user: none.
    nproc = 0 if bounded or isolation == "rlimits" else limits.max_processes
    harness_args = [
        str(records_fd), str(token_fd), str(limits.memory_mb * 1024 * 1024), str(limits.cpu_seconds),
        str(limits.file_mb * 1024 * 1024), str(nproc), str(drop_to()),
        str(seccomp_fd if isolation == "rlimits" and seccomp_fd is not None else -1),
    ]  # fmt: skip
    python = [harness_python(), "-S", "-s", "-P", "-B"]
    if isolation == "bwrap":
        inside = ["/sandbox/harness.py", "/sandbox/job.json", *harness_args]
        return bwrap_command(inbox, limits.tmp_mb, [*python, *inside], seccomp_fd)
    return [*python, str(inbox / "harness.py"), str(inbox / "job.json"), *harness_args]


def _run_group(limits: SandboxLimits) -> cgroups.RunGroup | None:
    where = cgroups.layout()
    if where is None:
        return None
    try:
        return cgroups.RunGroup(where, (limits.memory_mb + limits.tmp_mb) * 1024 * 1024, limits.max_processes)
    except OSError as exc:
        log.warning("could not create this run's cgroup (%s); per-process limits only", exc)
        return None


def run_program(
    program: str, tests: Iterable[str], setup_code: str = "", limits: SandboxLimits = SandboxLimits(),
    isolation: Isolation | None = None,
) -> RunOutcome:  # fmt: skip
    """Run `program`, then `setup_code`, then each test of `tests` in one fresh sandbox; report the first failure.

    `isolation` defaults to the one `use_isolation` set ("bwrap" unless told otherwise); SandboxUnavailableError if
    bubblewrap is asked for and does not work here, or if the sandbox fails to start before any program text ran.
    """
    isolation = isolation or _default_isolation
    require_isolation(isolation)
    plans = tuple(plan_test(t) for t in tests)
    group = _run_group(limits)
    token = secrets.token_hex(16)
    try:
        with tempfile.TemporaryDirectory(prefix="fastscore-sandbox-", ignore_cleanup_errors=True) as tmp:
            inbox = Path(tmp)
            (inbox / "work").mkdir()  # the cwd of an rlimits run, and the one place it can write to for sure
            if drop_to() >= 0:
                os.chown(inbox / "work", drop_to(), drop_to())
            (inbox / "harness.py").write_bytes(_HARNESS.read_bytes())
            job = {"program": program, "setup": setup_code, "tests": [p.job() for p in plans]}
            (inbox / "job.json").write_text(json.dumps(job), encoding="utf-8")
            return _run(inbox, plans, token, limits, isolation, group)
    finally:
        if group is not None:
            group.remove()


def _run(inbox: Path, plans: tuple[TestPlan, ...], token: str, limits: SandboxLimits, isolation: Isolation,
         group: cgroups.RunGroup | None) -> RunOutcome:  # fmt: skip
    records_r, records_w = os.pipe()
    token_r = _pipe_holding(token.encode("ascii"))
    seccomp = filter_program()
    # Under bwrap, bwrap installs the filter; without it the harness does, with Landlock (harness._confine), and
    # then needs the pipe even when this architecture has no filter.
    seccomp_r = _pipe_holding(seccomp or b"") if seccomp is not None or isolation == "rlimits" else None
    passed = (records_w, token_r) if seccomp_r is None else (records_w, token_r, seccomp_r)
    command = _command(isolation, inbox, records_w, token_r, limits, group is not None, seccomp_r)
    if group is not None:
        command = ["/bin/sh", "-c", cgroups.JOIN_AND_EXEC, "sh", str(len(group.procs_files)), *group.procs_files,
                   *command]  # fmt: skip
    with open(inbox / "stderr.txt", "w+b") as stderr:
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                command, cwd=inbox / "work", env=child_environment(), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True, close_fds=True, pass_fds=passed,
            )  # fmt: skip
        finally:
            for fd in passed:
                os.close(fd)
        reader = _Reader(records_r, started + limits.timeout_s)
        judge = Judge(plans, token)
        try:
            decision = _judge_run(reader, judge)
            timed_out = False
        except TimeoutError:
            decision, timed_out = None, True
        finally:
            reader.close()
        if decision is not None and decision.status in ("failed", "crash"):
            _kill(process, group, isolation)  # the verdict is settled; what the program does next does not matter
        try:
            returncode = process.wait(timeout=max(0.0, started + limits.timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = decision is None
            _kill(process, group, isolation)
            returncode = process.wait()
        seconds = time.monotonic() - started
        _kill(process, group, isolation)  # descendants the program left behind
        stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _STDERR_TAIL))
        stderr_tail = stderr.read().decode("utf-8", errors="replace")
    host_failed = {
        cgroups.JOIN_FAILED_EXIT_CODE: "the run's cgroup could not be joined",
        DROP_FAILED_EXIT_CODE: f"the harness could not become the unprivileged uid {drop_to()}",
        CONFINE_FAILED_EXIT_CODE: "the kernel refused the seccomp filter or the Landlock rules",
    }  # fmt: skip
    if not judge.started and (returncode in host_failed or stderr_tail.startswith("bwrap:")):
        # Before the harness's first record no program text has run: this is the host, not the program.
        why = host_failed.get(returncode, stderr_tail.strip()[-500:])
        raise SandboxUnavailableError(f"the sandbox did not start (exit {returncode}): {why}")
    if decision is not None:
        return _outcome(decision, returncode, limits, seconds)
    if timed_out:
        return RunOutcome(False, "timeout", f"Timeout: the tests did not finish within {limits.timeout_s:g} s", seconds)
    oom = group is not None and group.oom_killed()
    return _outcome_without_verdict(returncode, isolation, stderr_tail, oom, limits, seconds)


def _pipe_holding(data: bytes) -> int:
    """The read end of a pipe that holds `data` and then EOF (`data` fits in the pipe's buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def _kill(process: subprocess.Popen, group: cgroups.RunGroup | None, isolation: Isolation) -> None:
    """SIGKILL the run: bwrap (its pid namespace, with every descendant, ends with it), or the session of a plain
    subprocess (which a program can leave with setsid: only a cgroup catches those), and the run's cgroup."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if isolation == "rlimits":
            os.killpg(process.pid, signal.SIGKILL)  # the session leader's pid stays reserved while its group lives
        process.kill()  # a no-op once the process has been waited for
    if group is not None:
        group.kill_all()


def run_many(
    requests: Iterable[RunRequest], limits: SandboxLimits = SandboxLimits(), workers: int = 2,
    isolation: Isolation | None = None,
) -> list[RunOutcome]:  # fmt: skip
    """Run a batch of programs, `workers` sandboxes at a time; outcomes come back in request order."""
    requests = list(requests)
    isolation = isolation or _default_isolation

    def one(r: RunRequest) -> RunOutcome:
        return run_program(r.program, r.tests, r.setup_code, limits, isolation)

    if workers <= 1 or len(requests) <= 1:
        return [one(r) for r in requests]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, requests))
