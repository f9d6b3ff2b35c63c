"""Build llama-cpp-python from its PyPI sdist with this folder's patches applied; print the wheel's path.

The wheel is cached under $FASTSCORE_HOME/wheels (default ~/.cache/fastscore), keyed by the sdist, the patches,
CMAKE_ARGS and the host CPU's instruction sets (llama.cpp is compiled for them), so a fresh clone on the same
machine installs it in seconds instead of compiling llama.cpp again (minutes). Its version carries a local label
(0.3.36+fastscore8), so `pip show`, every run's recorded library versions and the shard manifests name the patched
build; the label still satisfies `==0.3.36`.

Standard library only: it runs before fastscore is installed (the Makefile installs this wheel first, so that
`pip install -e .[all]` keeps it instead of fetching the unpatched one). What the patches change and what they gain:
docs/performance.md, "llama.cpp with three patches", "Weights decoded from their compact file", "Attention cut at
each block's last cell" and "The softmax cut at each row's last cell" (which also covers 0007, the V cache's writes).

    python llamacpp/build_wheel.py [--pip .venv/bin/pip]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LOCAL_LABEL = "fastscore8"  # bump with every change to the patch set
HERE = Path(__file__).resolve().parent
# Some x86 VMs report AMX in CPUID but trap on its tile instructions (SIGILL in llama_decode, seen on the study's
# machine), and llama.cpp builds for the host CPU (GGML_NATIVE), so AMX kernels are switched off unless CMAKE_ARGS
# says otherwise. Only on x86-64: other architectures' compilers do not know these flags.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
DEFAULT_CMAKE_ARGS = f"-DCMAKE_C_FLAGS='{NO_AMX}' -DCMAKE_CXX_FLAGS='{NO_AMX}'" if platform.machine() == "x86_64" else ""


def patches() -> list[Path]:
    return sorted(HERE.glob("*.patch"))


def cmake_args() -> str:
    return os.environ.get("CMAKE_ARGS", DEFAULT_CMAKE_ARGS)


def cpu_flags() -> str:
    """The host CPU's instruction sets: llama.cpp is compiled for them (GGML_NATIVE), so a wheel built on another
    CPU may not run here."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(("flags", "Features"))), "")


def build_key() -> str:
    """What decides the wheel's contents: the sdist, the patches, the label, the compiler flags and the CPU."""
    digest = hashlib.sha256(f"{SDIST_SHA256}\n{LOCAL_LABEL}\n{cmake_args()}\n{platform.machine()}\n"
                            f"{cpu_flags()}\n".encode())
    for patch in patches():
        digest.update(patch.name.encode() + b"\n" + patch.read_bytes())
    return digest.hexdigest()[:16]


def wheel_dir() -> Path:
    home = Path(os.environ.get("FASTSCORE_HOME") or Path.home() / ".cache" / "fastscore").expanduser()
    return home / "wheels" / f"{PACKAGE}-{VERSION}+{LOCAL_LABEL}-{build_key()}"


def cached_wheel(folder: Path) -> Path | None:
    found = sorted(folder.glob("llama_cpp_python-*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(pip: str, into: Path) -> Path:
    # Children write to stderr: this script's stdout is the wheel's path, read by the Makefile.
    subprocess.run([pip, "download", "-q", f"{PACKAGE}=={VERSION}", "--no-binary", ":all:", "--no-deps",
                    "-d", str(into)], check=True, stdout=sys.stderr)
    sdist = into / SDIST
    got = sha256_file(sdist)
    if got != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {got}, expected {SDIST_SHA256}")
    return sdist


def patched_source(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    source = into / f"llama_cpp_python-{VERSION}"
    # git apply checks every hunk. Inside another repository's work tree (a TMPDIR under a checkout) it would
    # resolve paths against that repository and skip these files without an error, so the source is made a
    # repository of its own first, and each patch must then reverse-apply: proof that it is in.
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=source, check=True, stdout=sys.stderr)
    for patch in patches():
        subprocess.run([*git, "apply", "--verbose", str(patch)], cwd=source, check=True, stdout=sys.stderr)
        subprocess.run([*git, "apply", "--reverse", "--check", str(patch)], cwd=source, check=True)
    init = source / "llama_cpp" / "__init__.py"
    text, n = re.subn(rf'__version__ = "{re.escape(VERSION)}"', f'__version__ = "{VERSION}+{LOCAL_LABEL}"',
                      init.read_text())
    if n != 1:
        sys.exit(f"{init}: no __version__ = {VERSION!r} to label")
    init.write_text(text)
    return source


def build(pip: str) -> Path:
    out = wheel_dir()
    wheel = cached_wheel(out)
    if wheel is not None:
        return wheel
    with tempfile.TemporaryDirectory(prefix="fastscore-llamacpp-") as tmp:
        source = patched_source(fetch_sdist(pip, Path(tmp)), Path(tmp) / "src")
        print(f"building {PACKAGE} {VERSION}+{LOCAL_LABEL} with {', '.join(p.name for p in patches())} "
              f"(a few minutes on 2 cores, once per machine)", file=sys.stderr)
        staging = Path(tmp) / "wheel"
        subprocess.run([pip, "wheel", "-q", "--no-deps", "-w", str(staging), str(source)], check=True,
                       stdout=sys.stderr, env={**os.environ, "CMAKE_ARGS": cmake_args()})
        out.mkdir(parents=True, exist_ok=True)
        for built in staging.glob("*.whl"):
            # Copied under a temporary name, then renamed: an interrupted copy never looks like a cached wheel.
            partial = out / f".{built.name}.partial-{os.getpid()}"
            shutil.copyfile(built, partial)
            os.replace(partial, out / built.name)
    wheel = cached_wheel(out)
    if wheel is None:
        sys.exit(f"pip wheel left no wheel in {out}")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pip", default=str(Path(sys.executable).parent / "pip"), help="the pip that builds it")
    args = parser.parse_args()
    print(build(args.pip))


if __name__ == "__main__":
    main()
