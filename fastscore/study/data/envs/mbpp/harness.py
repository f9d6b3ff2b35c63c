"""The script that runs inside the sandbox: the program, its setup code, then the test expressions.

It reports *values*, never verdicts. For each test the caller sends only the expression whose value the test
checks (the `EXPR` of `assert EXPR == EXPECTED`; the expected value stays with the caller), and this script writes
that value as plain data, one JSON line per test, to a pipe the caller reads. The caller decodes the value and
compares it with the expected one itself (verdict.py), so nothing the program redefines in this interpreter
(builtins, `__eq__`, this script's own functions) can turn a wrong value into a pass: at worst the program makes
this script report other plain values, which is no more than a program that returns them.

Standard library only: it runs under `python -S` inside the sandbox, and the caller imports `encode` from it for
its tests. Nothing runs on import.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

MAX_DEPTH = 100  # nesting of a reported value
MAX_ITEMS = 200_000  # scalars and containers in one reported value
MAX_RECORD_BYTES = 4 * 1024 * 1024
MEMORY_EXIT_CODE = 86  # even reporting a MemoryError ran out of memory
DROP_FAILED_EXIT_CODE = 87  # could not become the unprivileged uid: the host, not the program
CONFINE_FAILED_EXIT_CODE = 88  # the seccomp filter or Landlock ruleset was refused
_BIG_INT_BITS = 10_000  # larger ints travel as hex: JSON's decimal form is capped at 4300 digits


class Unreportable(Exception):
    """The value is not plain data (or too deep / too large to report)."""


def encode(value: object) -> object:
    """`value` as JSON-ready data that `verdict.decode` turns back into an equal plain value.

    Only the built-in data types are reported, each read through its base type's own C methods, so a subclass's
    overridden `__eq__`, `__iter__` or `__repr__` has no say; a list, str or None is itself, the other types are
    tagged one-key objects. Anything else (a custom object, a generator, a numpy array) raises Unreportable.
    """
    budget = [MAX_ITEMS]

    def walk(v: object, depth: int) -> object:
        budget[0] -= 1
        if depth > MAX_DEPTH or budget[0] < 0:
            raise Unreportable("value too deep or too large to report")
        if v is None or type(v) is bool:
            return v
        if isinstance(v, int):
            n = int.__int__(v)
            return n if n.bit_length() < _BIG_INT_BITS else {"int": int.__format__(n, "x")}
        if isinstance(v, float):
            return float.__float__(v)
        if isinstance(v, str):
            s = str.__str__(v)
            if not s.isascii():
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError:  # lone surrogates: JSON's \uXXXX escapes would pair two of them up
                    return {"surrogates": s.encode("utf-8", "surrogatepass").hex()}
            return s
        if isinstance(v, complex):
            c = complex.__complex__(v)
            return {"complex": [c.real, c.imag]}
        if isinstance(v, bytes):
            return {"bytes": bytes.__bytes__(v).hex()}
        if isinstance(v, bytearray):
            return {"bytearray": bytes(bytearray.__iter__(v)).hex()}
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in list.__iter__(v)]
        if isinstance(v, tuple):
            return {"tuple": [walk(x, depth + 1) for x in tuple.__iter__(v)]}
        if isinstance(v, dict):
            return {"dict": [[walk(k, depth + 1), walk(x, depth + 1)] for k, x in dict.items(v)]}
        if isinstance(v, frozenset):
            return {"frozenset": [walk(x, depth + 1) for x in frozenset.__iter__(v)]}
        if isinstance(v, set):
            return {"set": [walk(x, depth + 1) for x in set.__iter__(v)]}
        raise Unreportable(f"a value of type {type(v).__name__} is not plain data")

    return walk(value, 0)


def _last_line(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip() if lines else type(exc).__name__


def _raised_in(exc: BaseException, filename: str) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename == filename


def _set_limits(memory: int, cpu: int, fsize: int, nproc: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _become(uid: int) -> None:
    """Become `uid` (and gid `uid`, no supplementary groups) for good: the caller is root, the program must not be."""
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError:
        os._exit(DROP_FAILED_EXIT_CODE)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        os._exit(DROP_FAILED_EXIT_CODE)


# Landlock (linux/landlock.h): the same syscall numbers on every architecture since 5.13.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_FS_WRITE_ABI1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write_file, remove_*, make_*
_FS_REFER, _FS_TRUNCATE, _NET_TCP, _SCOPE_ALL = 1 << 13, 1 << 14, 0b11, 0b11
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _confine(filter_fd: int) -> str:
    """Without bubblewrap (--sandbox rlimits): install the seccomp filter the caller sent on `filter_fd`, and, where
    the kernel has Landlock, allow file writes only beneath the cwd (and to /dev/null), no TCP, and no signals or
    abstract sockets beyond this run's processes. Returns what Landlock could enforce ("" if nothing)."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    program = b""
    while chunk := os.read(filter_fd, 65536):
        program += chunk
    os.close(filter_fd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")
    enforced = ""
    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi >= 1:
        fs = _FS_WRITE_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
        attr = (ctypes.c_uint64 * 3)(fs, _NET_TCP if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
        ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), 8 * (1 + (abi >= 4) + (abi >= 6)), 0)
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        for path, rights in ((".", fs), ("/dev/null", (1 << 1) | (_FS_TRUNCATE if abi >= 3 else 0))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            beneath = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
            if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, beneath, 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule")
            os.close(fd)
        if libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        os.close(ruleset)
        enforced = f"landlock abi {abi}"
    if program:
        code = ctypes.create_string_buffer(program, len(program))
        fprog = struct.pack("HP", len(program) // 8, ctypes.addressof(code))  # struct sock_fprog, native layout
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "seccomp")
    return enforced


def main(argv: list[str]) -> None:
    """argv: job.json, records fd, token fd, then RLIMIT_AS bytes, RLIMIT_CPU s, RLIMIT_FSIZE bytes, RLIMIT_NPROC
    (0: none), the uid to become before the program runs (-1: stay), and the fd of the seccomp filter the harness
    installs itself, with Landlock, when no bubblewrap does (-1: bwrap did)."""
    job_path, records_fd, token_fd = argv[0], int(argv[1]), int(argv[2])
    _set_limits(*(int(v) for v in argv[3:7]))
    sys.set_int_max_str_digits(0)  # a program's own big-int printing is not the harness's business
    # The tests run one frame deeper than at module level (inside main): give that frame back, so a runaway
    # recursion stops at the same call, with the same message, as when tests ran as top-level statements.
    sys.setrecursionlimit(sys.getrecursionlimit() + 1)
    token = os.read(token_fd, 256).decode("ascii")
    os.close(token_fd)  # read before any program text runs; the program never sees it in a file, argv or env
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    if int(argv[7]) >= 0:
        _become(int(argv[7]))  # after reading the job (the inbox is the caller's), before any program text
    if int(argv[8]) >= 0:
        try:
            _confine(int(argv[8]))
        except OSError:
            os._exit(CONFINE_FAILED_EXIT_CODE)
    write, dumps = os.write, json.dumps  # bound before the program can replace them

    def emit(record: dict) -> None:
        line = dumps(record, ensure_ascii=True, allow_nan=True) + "\n"
        if len(line) > MAX_RECORD_BYTES:
            line = dumps({"test": record.get("test", -1), "unreportable": "value too large to report"}) + "\n"
        data = line.encode("ascii")
        while data:
            data = data[write(records_fd, data):]

    emit({"started": True})
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    stage, index = "program", -1
    try:
        exec(compile(job["program"], "program.py", "exec"), namespace)
        stage = "setup"
        if job["setup"]:
            exec(compile(job["setup"], "setup.py", "exec"), namespace)
        stage = "tests"
        for index, test in enumerate(job["tests"]):
            if test["kind"] == "value":
                value = eval(compile(test["expr"], f"<test {index}>", "eval"), namespace)
                try:
                    emit({"test": index, "value": encode(value)})
                except Unreportable as exc:
                    emit({"test": index, "unreportable": str(exc)})
            else:  # a statement: judged by completing without an exception, plus the token at the end
                name = f"<test {index}>"
                try:
                    exec(compile(test["source"], name, "exec"), namespace)
                except AssertionError as exc:
                    if not _raised_in(exc, name):
                        raise
                    emit({"test": index, "failed": True})
                    os._exit(0)
                emit({"test": index, "completed": True})
    except MemoryError:
        namespace.clear()  # the program's data is what filled memory; free it so the record can be written
        try:
            emit({"memory": True, "test": index if stage == "tests" else -1})
        except MemoryError:
            os._exit(MEMORY_EXIT_CODE)
        os._exit(0)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt and RecursionError are outcomes too
        emit({"error": _last_line(exc), "test": index if stage == "tests" else -1})
        os._exit(0)
    emit({"done": token})
    os._exit(0)  # threads or atexit hooks the program left behind get no say after the last record


if __name__ == "__main__":
    main(sys.argv[1:])
