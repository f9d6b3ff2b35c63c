"""The sweep's grid: cells (model × variant × environment × failure source), each cut into shards that are windows
of the environment's seeded item order. Pure bookkeeping: nothing here loads a model."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastscore import variants
from fastscore.errors import DataError
from fastscore.study.runner import FAILURE_SOURCES


def parse_variant(text: str) -> tuple[str, str]:
    """"f32" (llama.cpp) or "backend:quant" -> (backend, quant), checked against the variant table."""
    backend, _, quant = text.strip().rpartition(":")
    backend = backend or "llamacpp"
    variants.validate(backend, quant)
    return backend, quant


def model_slug(model: str) -> str:
    """A folder name for a model spec: a registry name as it is, a path or hub id made safe and kept unique."""
    if re.fullmatch(r"[A-Za-z0-9._-]+", model):
        return model
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name or model).strip("_") or "model"
    return f"{readable}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Cell:
    model: str  # registry name, hub id or local HF folder, as the user gave it
    backend: str
    quant: str
    env: str
    failures: str  # "seeded" or "model"

    @property
    def variant(self) -> str:
        return f"{self.backend}:{self.quant}"

    @property
    def key(self) -> str:
        return f"{model_slug(self.model)}/{self.backend}-{self.quant}/{self.env}-{self.failures}"


@dataclass(frozen=True)
class Shard:
    """The cell's seeded items [start, stop): under model failures, those of them the model fails."""

    cell: Cell
    index: int
    start: int
    stop: int

    @property
    def key(self) -> str:
        return f"{self.cell.key}/shard-{self.index:05d}"

    @property
    def size(self) -> int:
        return self.stop - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"cell": asdict(self.cell), "index": self.index, "start": self.start, "stop": self.stop}


def cells(models: tuple[str, ...], variant_pairs: tuple[tuple[str, str], ...], envs: tuple[str, ...],
          failures: tuple[str, ...]) -> list[Cell]:
    unknown = [f for f in failures if f not in FAILURE_SOURCES]
    if unknown or not failures:
        raise DataError(f"unknown failure source(s) {unknown or failures}: choose from {', '.join(FAILURE_SOURCES)}")
    if not models or not variant_pairs or not envs:
        raise DataError("a sweep needs at least one model, one variant and one environment")
    return [Cell(m, b, q, e, f) for m in models for b, q in variant_pairs for e in envs for f in failures]


def shards_of(cell: Cell, n_items: int, shard_size: int) -> list[Shard]:
    """Windows of `shard_size` over the first `n_items` seeded items of the cell's environment."""
    if shard_size < 1:
        raise DataError(f"--shard-size must be at least 1 (got {shard_size})")
    return [Shard(cell, k, start, min(start + shard_size, n_items))
            for k, start in enumerate(range(0, n_items, shard_size))]
