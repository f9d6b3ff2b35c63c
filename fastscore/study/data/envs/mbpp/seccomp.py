"""The seccomp filter of a sandbox run: a classic-BPF program, assembled here, that bubblewrap installs (`--seccomp`).

It denies what a Python function under test never needs and what widens the kernel surface a program could attack
from inside the namespaces: sockets of any family but AF_UNIX (the network namespace has no route, but AF_VSOCK or
AF_NETLINK reach the host or the kernel), ptrace and cross-process memory access, mounting, the kernel keyring, eBPF,
perf events, userfaultfd, io_uring, and new namespaces (unshare, setns, clone with CLONE_NEWUSER). Denied calls fail
with EPERM, so the program sees an ordinary error rather than being killed. clone3 fails with ENOSYS: its flags sit
in memory a filter cannot read, and ENOSYS makes the C library fall back to clone, whose flags it can. Any other
architecture than the native one (e.g. 32-bit calls on x86_64, or x32 numbers) is denied outright.

No dependency: libseccomp's Python bindings are a Debian package, not a PyPI one, and the program is ~50
instructions. Architectures other than x86_64 and aarch64 get no filter (`filter_program` returns None).
"""

from __future__ import annotations

import errno
import logging
import platform
import struct
from functools import lru_cache

log = logging.getLogger(__name__)

# struct sock_filter opcodes (linux/bpf_common.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (low word first on little-endian)
_NR, _ARCH, _ARG0 = 0, 4, 16

AF_UNIX = 1
CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000

_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "setns",
)  # fmt: skip
# Syscall numbers from the kernel headers (asm/unistd_64.h; asm-generic/unistd.h for aarch64).
_ARCHES = {
    "x86_64": (0xC000003E, {
        "socket": 41, "clone": 56, "clone3": 435, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "mount": 165, "umount2": 166, "pivot_root": 155, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "unshare": 272, "setns": 308, "userfaultfd": 323,
    }),
    "aarch64": (0xC00000B7, {
        "socket": 198, "clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "mount": 40, "umount2": 39, "pivot_root": 41, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "unshare": 97, "setns": 268, "userfaultfd": 282,
    }),
}  # fmt: skip
_COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
           "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442}


class _Assembler:
    """Classic BPF with symbolic jump targets (labels), resolved to the relative offsets the kernel wants."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def load(self, offset: int) -> None:
        self.code.append((_LD_W_ABS, 0, 0, offset))

    def jump(self, op: int, k: int, true: str | int, false: str | int) -> None:
        self.code.append((op, true, false, k))  # an int target is "this many instructions on"

    def ret(self, value: int) -> None:
        self.code.append((_RET_K, 0, 0, value))

    def assemble(self) -> bytes:
        out = b""
        for at, (op, true, false, k) in enumerate(self.code):
            jt, jf = (self.labels[t] - at - 1 if isinstance(t, str) else t for t in (true, false))
            assert 0 <= jt < 256 and 0 <= jf < 256, "jump out of a classic-BPF jump's range"
            out += struct.pack("=HBBI", op, jt, jf, k)
        return out


@lru_cache(maxsize=1)
def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one) as bwrap's --seccomp expects it, or None if unsupported."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        log.warning("no seccomp filter for %s: sandbox runs go without one (docs/sandbox.md)", machine)
        return None
    audit_arch, numbers = _ARCHES[machine]
    numbers = {**numbers, **_COMMON}
    a = _Assembler()
    a.load(_ARCH)
    a.jump(_JEQ_K, audit_arch, 0, "deny")
    a.load(_NR)
    if machine == "x86_64":
        a.jump(_JGE_K, _X32_SYSCALL_BIT, "deny", 0)
    a.jump(_JEQ_K, numbers["socket"], "socket", 0)
    a.jump(_JEQ_K, numbers["clone"], "clone", 0)
    a.jump(_JEQ_K, numbers["clone3"], "nosys", 0)
    for name in _DENIED:
        a.jump(_JEQ_K, numbers[name], "deny", 0)
    a.ret(_RET_ALLOW)
    a.label("socket")
    a.load(_ARG0)
    a.jump(_JEQ_K, AF_UNIX, "allow", "deny")
    a.label("clone")
    a.load(_ARG0)
    a.jump(_JSET_K, CLONE_NEWUSER, "deny", "allow")
    a.label("allow")
    a.ret(_RET_ALLOW)
    a.label("deny")
    a.ret(_RET_ERRNO | errno.EPERM)
    a.label("nosys")
    a.ret(_RET_ERRNO | errno.ENOSYS)
    return a.assemble()
