"""Run an untrusted program against its assert-tests in a throw-away subprocess with time and memory limits.

Every way a program can go wrong (failing assert, exception, hang, memory exhaustion, hard crash) comes back as a
`RunOutcome`; nothing the program does raises out of `run_program`.

Why the limits are set by the harness and not in `preexec_fn`: `run_many` starts processes from a thread pool, and
`preexec_fn` is documented as unsafe in the presence of threads (it runs Python code between fork and exec). The harness
sets RLIMIT_AS / RLIMIT_CPU / RLIMIT_FSIZE as its very first statements, with hard == soft so the program cannot raise
them, before any program text is compiled or run.

Why not `python -I`: `-I` implies `-E`, which also ignores PYTHONHASHSEED, and set iteration order of strings would
then vary between runs (a few MBPP references return `tuple(set(...))`), making pass/fail non-deterministic. We pass
`-s -P` (the other two parts of `-I`) and build the child's environment from scratch, so `-E` would protect nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

log = logging.getLogger(__name__)

Status = Literal["passed", "failed", "error", "timeout", "memory", "crash"]

MESSAGE_LIMIT = 1000  # characters of an error message kept (an exception text can be arbitrarily long)
_STDERR_TAIL = 4000
_HARNESS_STATUSES = ("passed", "failed", "error", "memory")
_MEMORY_EXIT_CODE = 86  # the harness exits with this when even reporting a MemoryError ran out of memory

# Only what a plain Python program needs; nothing from the parent's environment leaks through.
_CHILD_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock; the whole process group is killed when it is exceeded
    memory_mb: int = 512  # RLIMIT_AS
    cpu_s: int | None = None  # RLIMIT_CPU; default: the wall timeout rounded up, plus one second
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write into its temp dir

    @property
    def cpu_seconds(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(math.ceil(self.timeout_s)) + 1


@dataclass(frozen=True)
class RunOutcome:
    passed: bool
    status: Status
    message: str  # what the test run printed: the failing assert, the last traceback line, or the limit hit
    seconds: float  # wall time of the subprocess
    failing_test: str = ""  # source of the test that failed or raised ("" if it passed or failed before the tests)


@dataclass(frozen=True)
class RunRequest:
    program: str
    tests: tuple[str, ...]
    setup_code: str = ""


_HARNESS = r'''
import resource, sys
_memory, _cpu, _fsize = (int(v) for v in sys.argv[2:5])
resource.setrlimit(resource.RLIMIT_AS, (_memory, _memory))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

import json, os, traceback

_result_path = sys.argv[1]
with open("job.json", encoding="utf-8") as _f:
    _job = json.load(_f)


def _last_line(exc):
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip() if lines else type(exc).__name__


def _report(status, message, test=""):
    with open(_result_path, "w", encoding="utf-8") as f:
        json.dump({"status": status, "message": message, "test": test}, f)
    os._exit(0)


def _raised_by_test(exc, filename):
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename == filename


_namespace = {"__name__": "solution", "__builtins__": __builtins__}
_stage, _test = "program", ""
try:
    exec(compile(_job["program"], "program.py", "exec"), _namespace)
    _stage = "setup"
    if _job["setup"]:
        exec(compile(_job["setup"], "setup.py", "exec"), _namespace)
    _stage = "tests"
    for _i, _test in enumerate(_job["tests"]):
        _name = "<test %d>" % _i
        try:
            exec(compile(_test, _name, "exec"), _namespace)
        except AssertionError as exc:
            if _raised_by_test(exc, _name):
                _report("failed", "AssertionError: " + _test.strip(), _test)
            raise
except MemoryError:
    _namespace.clear()  # the program's data is what filled memory; free it so the report can be written
    try:
        _report("memory", "MemoryError", _test if _stage == "tests" else "")
    except MemoryError:
        os._exit(86)
except BaseException as exc:  # SystemExit, KeyboardInterrupt and RecursionError are outcomes too
    _report("error", _last_line(exc), _test if _stage == "tests" else "")
_report("passed", "", "")
'''


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _well_formed(report: object) -> bool:
    return (
        isinstance(report, dict)
        and report.get("status") in _HARNESS_STATUSES
        and isinstance(report.get("message"), str)
        and isinstance(report.get("test"), str)
    )


def _outcome_without_report(returncode: int, stderr_tail: str, limits: SandboxLimits, seconds: float) -> RunOutcome:
    """The harness died before writing its report: classify from the exit status and stderr."""
    if returncode == _MEMORY_EXIT_CODE or "MemoryError" in stderr_tail:
        return _memory_outcome(limits, seconds)
    # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL one second later at the hard limit.
    if returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and seconds >= limits.cpu_seconds):
        message = f"Timeout: the tests used more than {limits.cpu_seconds} s of CPU time"
        return RunOutcome(False, "timeout", message, seconds)
    if returncode < 0:
        message = f"Crash: the process was killed by {_signal_name(-returncode)}"
    else:
        message = f"Crash: the process exited with code {returncode} before the tests finished"
    return RunOutcome(False, "crash", message, seconds)


def _memory_outcome(limits: SandboxLimits, seconds: float, test: str = "") -> RunOutcome:
    message = f"MemoryError: the program exceeded the {limits.memory_mb} MB memory limit"
    return RunOutcome(False, "memory", message, seconds, test)


def _timeout_outcome(limits: SandboxLimits, seconds: float) -> RunOutcome:
    message = f"Timeout: the tests did not finish within {limits.timeout_s:g} s"
    return RunOutcome(False, "timeout", message, seconds)


def run_program(
    program: str, tests: Iterable[str], setup_code: str = "", limits: SandboxLimits = SandboxLimits()
) -> RunOutcome:
    """Run `program`, then `setup_code`, then each assert of `tests` in one fresh subprocess; report the first
    failure."""
    tests = tuple(tests)
    with tempfile.TemporaryDirectory(prefix="fastscore-sandbox-", ignore_cleanup_errors=True) as tmp:
        workdir = Path(tmp)
        (workdir / "harness.py").write_text(_HARNESS, encoding="utf-8")
        job = {"program": program, "setup": setup_code, "tests": list(tests)}
        (workdir / "job.json").write_text(json.dumps(job), encoding="utf-8")
        result_path = workdir / "result.json"
        command = [
            sys.executable, "-s", "-P", "harness.py", str(result_path),
            str(limits.memory_mb * 1024 * 1024), str(limits.cpu_seconds), str(limits.file_mb * 1024 * 1024),
        ]  # fmt: skip
        with open(workdir / "stderr.txt", "w+b") as stderr:
            started = time.perf_counter()
            process = subprocess.Popen(
                command, cwd=workdir, env=dict(_CHILD_ENV), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True, close_fds=True,
            )  # fmt: skip
            # A timer kills the group; a blocking wait returns the moment the child exits (wait(timeout) polls).
            expired = threading.Event()
            timer = threading.Timer(limits.timeout_s, lambda: (expired.set(), _kill_group(process.pid)))
            timer.start()
            try:
                process.wait()
            finally:
                timer.cancel()
            seconds = time.perf_counter() - started
            timed_out = expired.is_set()
            _kill_group(process.pid)  # background children the program may have left behind
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _STDERR_TAIL))
            stderr_tail = stderr.read().decode("utf-8", errors="replace")
        if timed_out:
            return _timeout_outcome(limits, seconds)
        try:
            report = json.loads(result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            report = None
        if not _well_formed(report):  # no report, or the program overwrote it
            return _outcome_without_report(process.returncode, stderr_tail, limits, seconds)
    if report["status"] == "memory":
        return _memory_outcome(limits, seconds, report["test"])
    return RunOutcome(report["status"] == "passed", report["status"], _clip(report["message"]), seconds, report["test"])


def run_many(
    requests: Iterable[RunRequest], limits: SandboxLimits = SandboxLimits(), workers: int = 2
) -> list[RunOutcome]:
    """Run a batch of programs, `workers` subprocesses at a time; outcomes come back in request order."""
    requests = list(requests)
    if workers <= 1 or len(requests) <= 1:
        return [run_program(r.program, r.tests, r.setup_code, limits) for r in requests]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda r: run_program(r.program, r.tests, r.setup_code, limits), requests))
