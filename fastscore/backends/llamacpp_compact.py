"""f32 weights run from their compact file: the GGUF that holds the same f32 values in Q4_1 / Q8_0 blocks.

The embedded model's f32 GGUF is its shipped Q4_1 file dequantized (conversion/shipped_f32.py, checked tensor by
tensor), so every weight of it is a value the shipped blocks hold exactly: Q4_1 is d*q + m with d, m half floats
and q < 16 (d*q exact, one rounding), Q8_0 is d*q (exact). llamacpp/0004 lets a model loaded with the kv override
`fastscore.src1_f32` keep every weight product's activations in f32; the CPU backend then decodes such weights to
those f32 values a panel at a time and multiplies them on tinyBLAS's f32 kernel, which sums each output element in
one order whatever its tile. So the compact file computes the f32 file's bits while a decoding step reads a fifth
of the weight bytes (538 MB of f32 weights, 97 MB of blocks). docs/performance.md, "Weights decoded from their
compact file".

That it does is checked, not trusted: the first time a build, a CPU and a pair of files meet, a prefill and a
one-row decoding step run on both files and their logits must be equal to the bit; the verdict is cached under
FASTSCORE_HOME. A build without the patch, another architecture or a pair that differs runs the f32 file.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import logging
import os
import platform
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SRC1_F32_KEY = b"fastscore.src1_f32"
FIRST_DECODING_BUILD = 4  # llama-cpp-python 0.3.36+fastscoreN decodes Q4_1 / Q8_0 weights exactly from N = 4
FIRST_STEP_MATCHING_BUILD = 3  # ... and its decoding steps give the bits of a prefill from N = 3 (llamacpp/0003)
X86 = ("x86_64", "AMD64")  # the decoded products are built for x86 (AVX, AVX2, AVX-512) only
CHECK_TOKENS = 48  # the prefill of the check: enough for 16-row tiles and a tail


def _patched_from(first: int, version: str, machine: str | None) -> bool:
    """Whether llama-cpp-python `version` is this repo's build +fastscoreN with N >= first, on x86."""
    label = re.search(r"\+fastscore(\d+)$", version)
    return label is not None and int(label.group(1)) >= first and (machine or platform.machine()) in X86


def build_decodes_weights(version: str, machine: str | None = None) -> bool:
    """Whether llama-cpp-python `version` (its local label) decodes compact weights exactly on this machine."""
    return _patched_from(FIRST_DECODING_BUILD, version, machine)


def build_steps_match_prefill(version: str, machine: str | None = None) -> bool:
    """Whether a decoding step of llama-cpp-python `version` gives the bits of a prefill (llamacpp/0003: every f32
    product on tinyBLAS, one-row products too, on x86; PyPI's build sums a one-row step in another order)."""
    return _patched_from(FIRST_STEP_MATCHING_BUILD, version, machine)


def src1_f32_override(L) -> ctypes.Array:
    """llama_model_params.kv_overrides asking for f32 activations in every weight product (ends with an empty key,
    as llama.cpp expects)."""
    overrides = (L.llama_model_kv_override * 2)()
    overrides[0].tag = L.LLAMA_KV_OVERRIDE_TYPE_BOOL
    overrides[0].key = SRC1_F32_KEY
    overrides[0].value.val_bool = True
    overrides[1].key = b""
    return overrides


def _file_identity(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def cpu_flags() -> str:
    """The CPU's instruction sets (llama.cpp is compiled for the host's, and its kernels differ by them)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(("flags", "Features"))), "")


def _libraries(module) -> list[str]:
    """The loaded llama.cpp libraries: a wheel rebuilt under the same version label (other compiler flags, another
    patch) is another build to check."""
    folder = Path(getattr(module, "__file__", "") or ".").parent / "lib"
    return sorted(_file_identity(lib) for lib in folder.glob("*.so*") if lib.is_file()) if folder.is_dir() else []


def _check_key(module, f32_path: Path, compact_path: Path) -> str:
    record = json.dumps([getattr(module, "__version__", ""), _libraries(module), platform.machine(), cpu_flags(),
                         _file_identity(f32_path), _file_identity(compact_path)])
    return hashlib.sha256(record.encode()).hexdigest()[:16]


def _check_logits(open_backend: Callable, path: Path, compact: Path | None) -> np.ndarray:
    """A prefill's logits rows and a one-row step's, for a fixed token sequence."""
    tokens = [int(t) for t in np.arange(CHECK_TOKENS) * 37 % 1000 + 1]
    with open_backend(path, compact) as backend:
        with backend.decoder(2) as decoder:
            prefilled = np.array(decoder.start([tokens, tokens[:-1]]))
            stepped = np.array(decoder.step([1], [tokens[-1]]))
    return np.concatenate([prefilled, stepped])


def _read_verdict(marker: Path) -> dict | None:
    try:
        verdict = json.loads(marker.read_text())
    except (OSError, ValueError):  # absent, or a partial write from a killed process: check again
        return None
    return verdict if isinstance(verdict, dict) and isinstance(verdict.get("equal"), bool) else None


def _verdict(module, f32_path: Path, compact_path: Path, open_backend: Callable) -> dict:
    """The cached verdict, or the check run now under a file lock (processes opening the model at once, e.g. a
    sweep's workers, check once)."""
    from fastscore import cache

    marker = cache.home() / "compact-weights-checks" / f"{_check_key(module, f32_path, compact_path)}.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    with open(marker.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        verdict = _read_verdict(marker)
        if verdict is None:
            want = _check_logits(open_backend, f32_path, None)
            got = _check_logits(open_backend, f32_path, compact_path)
            verdict = {"equal": bool(np.array_equal(want, got)), "max_abs_diff": float(np.abs(want - got).max()),
                       "version": getattr(module, "__version__", ""), "f32": str(f32_path),
                       "compact": str(compact_path)}
            partial = marker.with_suffix(f".partial-{os.getpid()}")
            partial.write_text(json.dumps(verdict) + "\n")
            os.replace(partial, marker)
    verdict["marker"] = str(marker)
    return verdict


def compact_matches(module, f32_path: Path, compact_path: Path, open_backend: Callable) -> bool:
    """Whether the compact file computes the f32 file's logits to the bit on this build and CPU (checked once,
    cached). `open_backend(path, compact)` opens the plain llama.cpp backend without this check (not a subclass:
    the check must not run through instrumentation). A check that cannot run (an unreadable compact file, llama.cpp
    refusing it) is a no: the f32 file."""
    from fastscore.errors import FastscoreError

    try:
        verdict = _verdict(module, f32_path, compact_path, open_backend)
    except (FastscoreError, OSError, ValueError) as exc:
        log.warning("compact weights %s could not be checked (%s): computing from the f32 file", compact_path, exc)
        return False
    if verdict["equal"]:
        log.info("compact weights %s give the bits of %s on this build (checked once: %s)", compact_path.name,
                 f32_path, verdict["marker"])
    else:
        log.warning("compact weights %s differ from %s by up to %.3g on this build (%s): computing from the f32 "
                    "file", compact_path, f32_path, verdict["max_abs_diff"], verdict["marker"])
    return verdict["equal"]
