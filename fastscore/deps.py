"""Import optional dependencies with an error that names the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from fastscore.errors import MissingDependencyError


def require(module: str, extra: str, package: str | None = None) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(package or module.split(".")[0], extra) from exc
