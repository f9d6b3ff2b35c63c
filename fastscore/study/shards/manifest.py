"""manifest.json of a sharded run: its settings, its plan, and for each committed shard who made it, where and when.

A shard's record names its producer: the code (git commit, dirty flag and a hash of the fastscore sources actually
imported, so an uncommitted edit is a different producer too), the library versions, the hash of the weights file
actually scored, and the machine. Shards of different producers are mixed only after the current producer has
re-scored committed items and matched them (fastscore.study.shards.rescore); each such check is recorded under
"checks" and makes its producer one that may add shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from fastscore import provenance
from fastscore.cache import sha256
from fastscore.errors import DataError, ResumeConfigError
from fastscore.outputs import write_text_atomic

MANIFEST_FILE = "manifest.json"
FORMAT = "fastscore-study-shards"
VERSION = 1
PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the fastscore package whose code is running
CODE_FOLDERS = ("fastscore", "bench", "conversion", "models", "pyproject.toml")  # in the checkout; the package maps
# bench/, conversion/ and models/ into itself


sha256_file = sha256  # the cache's file hash: one definition


def sha256_tree(folder: Path, suffixes: tuple[str, ...] | None = None) -> str:
    """One hash over a folder's files (relative names and contents, sorted), following symlinked folders (the
    package maps bench/, conversion/ and models/ in that way)."""
    digest = hashlib.sha256()
    files = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        files += [Path(root) / n for n in names if suffixes is None or n.endswith(suffixes)]
    for path in sorted(files, key=lambda p: p.relative_to(folder).as_posix()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + sha256_file(path).encode() + b"\n")
    return digest.hexdigest()


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_version(folder: Path) -> dict[str, Any]:
    """The git commit of the checkout holding `folder` and whether its code differs from it (None for both outside a
    checkout)."""
    commit = _git(folder, "rev-parse", "HEAD")
    # Only the code's folders: a run's own uncommitted result files do not make its code dirty.
    status = _git(folder, "status", "--porcelain", "--", *(f":(top){name}" for name in CODE_FOLDERS))
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def code_record() -> dict[str, Any]:
    """The running code: its git commit and dirty flag (None outside a checkout) and a hash of its sources."""
    return {**git_version(PACKAGE_DIR), "source_sha256": sha256_tree(PACKAGE_DIR, (".py", ".json", ".jinja", ".txt"))}


def model_record(model: str, backend: str, quant: str) -> dict[str, Any]:
    """The weights a run scores: the file (or folder) the backend loads, and its SHA-256."""
    from fastscore.selection import ModelSelection

    artefact = ModelSelection.resolve(model, backend, quant).artefact()
    path = Path(artefact.path)
    return {"model": model, "backend": backend, "quant": quant, "weights": path.name,
            "sha256": sha256_tree(path) if path.is_dir() else sha256_file(path), "weights_note": artefact.weights_note}


def machine_record() -> dict[str, Any]:
    cpu = platform.processor() or None
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version()}


def producer(model: dict[str, Any]) -> dict[str, Any]:
    """Everything that decides the numbers a shard holds, but its settings: code, libraries, weights, machine."""
    return {"code": code_record(), "libraries": provenance.versions()["libraries"],
            "model_sha256": model["sha256"], "machine": machine_record()}


def producer_key(record: dict[str, Any]) -> str:
    """Producers with equal keys give the same numbers by construction; any other must be checked."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


class Manifest:
    """The run folder's manifest.json, rewritten atomically after each change."""

    def __init__(self, run_dir: Path, record: dict[str, Any]) -> None:
        self.path = Path(run_dir) / MANIFEST_FILE
        self.record = record

    @classmethod
    def open(cls, run_dir: Path, settings: dict[str, Any] | None) -> Manifest:
        """The run's manifest; a new one for `settings` if none exists; refused if made under other settings.
        `settings` None: an existing manifest only (report, verify)."""
        path = Path(run_dir) / MANIFEST_FILE
        if not path.is_file():
            if settings is None:
                raise DataError(f"{run_dir} holds no {MANIFEST_FILE}: not a sharded study run")
            return cls(run_dir, {"format": FORMAT, "version": VERSION, "settings": settings, "plan": {},
                                 "shards": {}, "checks": []})
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} is not valid JSON ({exc})") from None
        if record.get("format") != FORMAT or record.get("version") != VERSION:
            raise ResumeConfigError(f"{path} is not a {FORMAT} manifest of version {VERSION}")
        if settings is not None and record["settings"] != settings:
            stored = record["settings"]
            differing = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
            raise ResumeConfigError(
                f"{run_dir} was run with other settings ("
                + "; ".join(f"{k}: was {stored.get(k)!r}, now {settings.get(k)!r}" for k in differing)
                + "): continue it with the original options, or choose another --out")
        return cls(run_dir, record)

    @property
    def settings(self) -> dict[str, Any]:
        return self.record["settings"]

    @property
    def shards(self) -> dict[str, dict[str, Any]]:
        return self.record["shards"]

    def trusted_producers(self) -> set[str]:
        """Producers whose rows may be mixed: those that made shards or passed a re-scoring check."""
        made = {s["producer_key"] for s in self.shards.values()}
        return made | {c["producer_key"] for c in self.record["checks"] if c["passed"]}

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.record, indent=1, sort_keys=True) + "\n")
