"""Study environments, one subpackage each; callers reach them only through the contract in envs/base.py."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fastscore.errors import DataError
from fastscore.study.data.items import Item, Skipped

if TYPE_CHECKING:  # the CLI reads ENVS; the contract (and numpy with it) loads with the first environment
    from fastscore.study.data.envs.base import StudyEnv

log = logging.getLogger(__name__)

# name -> (module, class); a module is imported only when its environment is opened.
ENV_CLASSES: dict[str, tuple[str, str]] = {
    "tools": ("fastscore.study.data.envs.tools.env", "ToolsEnv"),
    "mbpp": ("fastscore.study.data.envs.mbpp.env", "MbppEnv"),
}
ENVS = tuple(ENV_CLASSES)


def env_class(name: str) -> type["StudyEnv"]:
    if name not in ENV_CLASSES:
        raise DataError(f"unknown environment {name!r} (expected one of {', '.join(ENVS)})")
    module, cls = ENV_CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def seeded_mix_rules(names: Sequence[str]) -> dict[str, str]:
    """Each named environment's stated rule for drawing its seeded failure kinds (those that state one)."""
    return {name: rule for name in names if (rule := env_class(name).seeded_mix)}


def open_envs(names: Sequence[str], data_dir: Path, progress: bool = False) -> dict[str, "StudyEnv"]:
    """The named environments bound to the data folder (each reads its files once, when first needed)."""
    return {name: env_class(name)(Path(data_dir), progress=progress) for name in names}


def items_for_envs(envs: Mapping[str, "StudyEnv"], limit: int, seed: int,
                   build: Callable[["StudyEnv"], tuple[list[Item], list[Skipped]]] | None = None
                   ) -> tuple[list[Item], list[Skipped]]:
    """Each environment's items in turn: its seeded ones (the runner, the quant check and the bench workload share
    them), or whatever `build(env)` makes (the model's own failures)."""
    items: list[Item] = []
    skipped: list[Skipped] = []
    for name, env in envs.items():
        built, passed_over = env.build_items(limit, seed) if build is None else build(env)
        if len({item.item_id for item in built}) != len(built):
            raise DataError(f"{name}: the environment built items with duplicate ids")
        log.info("%s: %d items, %d source records skipped", name, len(built), len(passed_over))
        items += built
        skipped += passed_over
    return items, skipped
