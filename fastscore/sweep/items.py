"""Each environment's seeded items, built once per sweep by the driver and stored in the sweep folder.

A shard takes its window of the seeded order from the stored list instead of rebuilding the order up to its window's
end: an MBPP build runs every mutated program in the sandbox, so rebuilding per shard repeated that work about
n/(2·shard size) times over a `--limit all` sweep. A resumed sweep reuses the stored list, so a shard redone after a
restart sees exactly the items of the shards committed before it.

One file per environment, `DIR/items/<env>.jsonl`, written atomically: a header line (the format and its version,
the settings the items were built with, the counts), the items, then the sources passed over. A file of another
format version or built under other settings is refused with ResumeConfigError.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastscore.errors import DataError, ResumeConfigError
from fastscore.outputs import write_text_atomic
from fastscore.study.data.envs import open_envs
from fastscore.study.data.items import Item, Skipped
from fastscore.study.runner import SeededItems
from fastscore.version import __version__

log = logging.getLogger(__name__)

ITEMS_DIR = "items"
FORMAT = "fastscore-sweep-items"
VERSION = 1


def items_path(out_dir: Path, env: str) -> Path:
    return Path(out_dir) / ITEMS_DIR / f"{env}.jsonl"


def build_settings(env: str, seed: int, limit: int | None, data_dir: Path) -> dict[str, Any]:
    """What decides an environment's seeded items."""
    return {"env": env, "seed": seed, "limit": "all" if limit is None else limit,
            "data_dir": str(Path(data_dir).resolve())}


def save(out_dir: Path, settings: dict[str, Any], seeded: SeededItems) -> Path:
    items, skipped = seeded
    header = {"format": FORMAT, "version": VERSION, "fastscore_version": __version__, "settings": settings,
              "n_items": len(items), "n_skipped": len(skipped)}
    lines = [json.dumps(header, sort_keys=True), *(item.to_json() for item in items),
             *(json.dumps(asdict(s), ensure_ascii=False, sort_keys=True) for s in skipped)]
    path = items_path(out_dir, settings["env"])
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def read(out_dir: Path, env: str, settings: dict[str, Any] | None = None) -> SeededItems | None:
    """The stored items of `env` (None when none are stored); with `settings`, refused unless built under them."""
    path = items_path(out_dir, env)
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: unreadable header ({exc}); delete the file to rebuild the items") from None
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ResumeConfigError(
            f"{path} is not a {FORMAT} file of version {VERSION} (found {header.get('format')!r} version "
            f"{header.get('version')!r}): continue that sweep with the fastscore that wrote it, or choose another --out")
    if settings is not None and header.get("settings") != settings:
        stored = header.get("settings") or {}
        differing = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
        raise ResumeConfigError(
            f"{path} holds items built under other settings ("
            + "; ".join(f"{k} was {stored.get(k)!r}, now {settings.get(k)!r}" for k in differing)
            + "): choose another --out, or delete the file to rebuild them")
    n_items, n_skipped = header.get("n_items"), header.get("n_skipped")
    if not isinstance(n_items, int) or not isinstance(n_skipped, int) or len(lines) != 1 + n_items + n_skipped:
        raise DataError(f"{path}: the header announces {n_items} items and {n_skipped} skipped sources but the file "
                        f"has {len(lines) - 1} lines; delete it to rebuild the items")
    try:
        items = [Item.from_json(line) for line in lines[1 : 1 + n_items]]
        skipped = [Skipped(**json.loads(line)) for line in lines[1 + n_items :]]
    except (json.JSONDecodeError, TypeError) as exc:
        raise DataError(f"{path}: unreadable item ({exc}); delete the file to rebuild the items") from None
    if any(item.env != env for item in items):
        raise DataError(f"{path}: holds items of another environment than {env!r}")
    return items, skipped


def prepare(out_dir: Path, envs: Sequence[str], seed: int, limit: int | None, data_dir: Path, resume: bool,
            progress: bool = False) -> Mapping[str, SeededItems]:
    """Each environment's seeded items: the stored ones when resuming, else built here once and stored."""
    out: dict[str, SeededItems] = {}
    opened = None
    for env in envs:
        settings = build_settings(env, seed, limit, data_dir)
        stored = read(out_dir, env, settings) if resume else None
        if stored is not None:
            log.info("%s: reusing the %d stored seeded items", env, len(stored[0]))
            out[env] = stored
            continue
        opened = opened or open_envs(envs, Path(data_dir), progress=progress)
        out[env] = opened[env].build_items(limit, seed)
        save(out_dir, settings, out[env])
        log.info("%s: built and stored %d seeded items", env, len(out[env][0]))
    return out
