"""An escape probe run *inside* the sandbox by tests/test_sandbox.py (read as text, never imported by pytest).

It tries what a hostile program would and raises RuntimeError with a JSON object: for each attempt 0 if it
succeeded, else the errno it failed with; plus its uid as its user namespace's parent sees it, and its effective
capabilities. Every
attempt is harmless if it succeeds: the sysctl write writes the value already there, the ptrace target is the
probe's own child, a cloned child exits at once.
"""

import ctypes
import json
import os
import platform
import socket
import subprocess
import threading

r = {}
libc = ctypes.CDLL(None, use_errno=True)
r["landlock_abi"] = max(0, libc.syscall(444, None, 0, 1))  # LANDLOCK_CREATE_RULESET_VERSION


def syscall(*args):
    ctypes.set_errno(0)
    return 0 if libc.syscall(*args) >= 0 else ctypes.get_errno()


def attempt(name, act):
    try:
        act()
        r[name] = 0
    except OSError as e:
        r[name] = e.errno or -1


uid = os.getuid()
uid_map = [line.split() for line in open("/proc/self/uid_map")]
r["uid_map_outside"] = next(int(o) + uid - int(i) for i, o, n in uid_map if int(i) <= uid < int(i) + int(n))
r["cap_eff"] = int(next(s for s in open("/proc/self/status") if s.startswith("CapEff")).split()[1], 16)
swappiness = open("/proc/sys/vm/swappiness").read()
attempt("sysctl_write", lambda: open("/proc/sys/vm/swappiness", "w").write(swappiness))
attempt("core_pattern_open", lambda: open("/proc/sys/kernel/core_pattern", "r+").close())
for folder in ("/", "/etc", "/root", "/usr", "/dev", "/dev/shm", "/var/tmp", "/tmp"):
    attempt("write " + folder, lambda: open(os.path.join(folder, "fastscore-probe"), "wb").write(b"x"))
attempt("write cwd", lambda: open("fastscore-probe", "wb").write(b"x"))
for family in ("AF_INET", "AF_INET6", "AF_VSOCK", "AF_NETLINK", "AF_PACKET", "AF_UNIX"):
    attempt(family, lambda: socket.socket(getattr(socket, family), socket.SOCK_DGRAM).close())
nr = {
    "x86_64": dict(ptrace=101, unshare=272, setns=308, clone=56, mount=165, keyctl=250, bpf=321, perf=298),
    "aarch64": dict(ptrace=117, unshare=97, setns=268, clone=220, mount=40, keyctl=219, bpf=280, perf=241),
}[platform.machine()]
child = subprocess.Popen(["sleep", "5"])
r["ptrace_attach"] = syscall(nr["ptrace"], 16, child.pid, 0, 0)  # PTRACE_ATTACH
child.kill()
child.wait()
r["unshare_newuser"] = syscall(nr["unshare"], 0x10000000)
r["setns"] = syscall(nr["setns"], os.open("/proc/self/ns/net", os.O_RDONLY), 0)
ctypes.set_errno(0)
pid = libc.syscall(nr["clone"], 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
if pid == 0:
    os._exit(0)
r["clone_newuser"] = 0 if pid > 0 else ctypes.get_errno()
r["mount"] = syscall(nr["mount"], b"none", b"/tmp", b"tmpfs", 0, None)
r["keyctl"] = syscall(nr["keyctl"], 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
r["bpf"] = syscall(nr["bpf"], 0, 0, 0)
r["perf_event_open"] = syscall(nr["perf"], 0, 0, -1, -1, 0)
thread = threading.Thread(target=lambda: None)  # what still works: threads (clone3 falls back to clone)
thread.start()
thread.join()
r["fork_exec"] = subprocess.run(["true"]).returncode
raise RuntimeError(json.dumps(r, separators=(",", ":")))
