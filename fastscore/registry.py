"""The registry of checkpoints (models/registry.toml), looked up by name with a "did you mean" on typos."""

from __future__ import annotations

import difflib
import importlib.resources
import tomllib
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, Mapping

from fastscore.errors import UnknownModelError


@dataclass(frozen=True)
class Embedded:
    """Weights shipped inside an installed Python package."""

    package: str
    file: str
    quant: str


@dataclass(frozen=True)
class ModelEntry:
    name: str
    hub_id: str
    family: str
    architecture: str
    params: int
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    embedded: Embedded | None = None
    # The checkpoint's config.json architecture fields (what a random-weight stand-in is built from); may be empty.
    config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@cache
def _load() -> tuple[str, tuple[ModelEntry, ...]]:
    text = importlib.resources.files("fastscore.models").joinpath("registry.toml").read_text()
    data = tomllib.loads(text)
    entries = []
    for name, raw in data["models"].items():
        embedded = raw.get("embedded")
        entries.append(
            ModelEntry(
                name=name,
                hub_id=raw["hub_id"],
                family=raw["family"],
                architecture=raw["architecture"],
                params=int(raw["params"]),
                chat_template_kwargs=MappingProxyType(dict(raw.get("chat_template_kwargs", {}))),
                embedded=Embedded(**embedded) if embedded else None,
                config=MappingProxyType(dict(raw.get("config", {}))),
            )
        )
    return data["default"], tuple(entries)


def default_model() -> str:
    return _load()[0]


def all_models() -> tuple[ModelEntry, ...]:
    return _load()[1]


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


def get(name: str) -> ModelEntry:
    by_name = {entry.name: entry for entry in all_models()}
    if name in by_name:
        return by_name[name]
    known = sorted(by_name)
    raise UnknownModelError(f"unknown model {name!r}.{suggest(name, known)} Known models: {', '.join(known)}")
