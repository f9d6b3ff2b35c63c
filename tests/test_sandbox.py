"""The sandbox really enforces its limits and reports every way a program can go wrong as an outcome."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

from fastscore.study.envs.mbpp.sandbox import RunOutcome, RunRequest, SandboxLimits, run_many, run_program

FAST = SandboxLimits(timeout_s=1.0)
TESTS = ("assert add(1, 2) == 3", "assert add(2, 2) == 4")


def test_passing_program_passes():
    outcome = run_program("def add(a, b):\n    return a + b", TESTS)
    assert outcome == RunOutcome(True, "passed", "", outcome.seconds, "")


def test_failing_assert_reports_its_source_text():
    outcome = run_program("def add(a, b):\n    return a + b + (a == 2)", TESTS)
    assert (outcome.passed, outcome.status) == (False, "failed")
    assert outcome.message == "AssertionError: assert add(2, 2) == 4"
    assert outcome.failing_test == "assert add(2, 2) == 4"


def test_exception_reports_last_traceback_line_and_the_test():
    outcome = run_program("def add(a, b):\n    return a / 0", TESTS)
    assert outcome.status == "error"
    assert outcome.message == "ZeroDivisionError: division by zero"
    assert outcome.failing_test == TESTS[0]


def test_assertion_inside_the_program_is_an_error_not_a_failed_test():
    outcome = run_program("def add(a, b):\n    assert a > 5\n    return a + b", TESTS)
    assert outcome.status == "error"
    assert outcome.message == "AssertionError"


def test_syntax_error_is_an_error_before_the_tests():
    outcome = run_program("def add(a, b)\n    return a + b", TESTS)
    assert outcome.status == "error"
    assert outcome.message.startswith("SyntaxError")
    assert outcome.failing_test == ""


def test_setup_code_runs_between_program_and_tests():
    program = "class Box:\n    def __init__(self, v):\n        self.v = v\ndef get(b):\n    return b.v"
    outcome = run_program(program, ["assert get(box) == 7"], setup_code="box = Box(7)")
    assert outcome.passed, outcome


def test_infinite_loop_times_out():
    outcome = run_program("while True:\n    pass", TESTS, limits=FAST)
    assert outcome.status == "timeout"
    assert outcome.message == "Timeout: the tests did not finish within 1 s"
    print("timeout run took", outcome.seconds)


def test_cpu_time_limit_stops_a_busy_loop_before_the_wall_timeout():
    outcome = run_program("while True:\n    pass", TESTS, limits=SandboxLimits(timeout_s=30.0, cpu_s=1))
    assert outcome.status == "timeout"
    assert outcome.message == "Timeout: the tests used more than 1 s of CPU time"  # not the 30 s wall-clock timer


def test_allocating_two_gigabytes_hits_the_memory_limit():
    outcome = run_program("data = bytearray(2 * 1024 ** 3)", TESTS, limits=FAST)
    assert outcome.status == "memory"
    assert "512 MB" in outcome.message


def test_hard_exit_and_segfault_are_crashes():
    exited = run_program("import os\nos._exit(3)", TESTS, limits=FAST)
    assert exited.status == "crash"
    assert "code 3" in exited.message
    segfault = run_program("import ctypes\nctypes.string_at(0)", TESTS, limits=FAST)
    assert segfault.status == "crash"
    assert "SIGSEGV" in segfault.message


def test_cwd_is_a_private_temp_dir_removed_afterwards():
    outcome = run_program("import os\nraise RuntimeError(os.getcwd())", TESTS, limits=FAST)
    cwd = Path(outcome.message.removeprefix("RuntimeError: "))
    assert cwd.name.startswith("fastscore-sandbox-")
    assert cwd.parent == Path(tempfile.gettempdir())
    assert cwd != Path.cwd()
    assert not cwd.exists()


def test_environment_is_minimal_and_stdin_is_closed(monkeypatch):
    monkeypatch.setenv("FASTSCORE_SANDBOX_CANARY", "leaked")
    outcome = run_program("import os\nraise RuntimeError(sorted(os.environ))", TESTS, limits=FAST)
    names = set(re.findall(r"'([A-Z_]+)'", outcome.message))
    assert "PATH" in names
    assert "FASTSCORE_SANDBOX_CANARY" not in names and "HOME" not in names
    reading = run_program("line = input()", TESTS, limits=FAST)
    assert reading.message.startswith("EOFError")


def test_background_children_are_killed_with_the_process_group():
    program = "import subprocess\np = subprocess.Popen(['sleep', '30'])\nraise RuntimeError(p.pid)"
    outcome = run_program(program, TESTS, limits=FAST)
    pid = int(outcome.message.removeprefix("RuntimeError: "))
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return
        if state == "Z":  # killed, waiting to be reaped by its new parent
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    raise AssertionError(f"background child {pid} survived the sandbox run")


def test_run_many_keeps_request_order():
    requests = [
        RunRequest("def add(a, b):\n    return a + b", TESTS),
        RunRequest("def add(a, b):\n    return a - b", TESTS),
        RunRequest("def add(a, b):\n    return a + b", TESTS),
        RunRequest("raise ValueError('x')", TESTS),
    ]
    outcomes = run_many(requests, FAST)
    assert [o.status for o in outcomes] == ["passed", "failed", "passed", "error"]
