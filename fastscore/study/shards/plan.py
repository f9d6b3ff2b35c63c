"""The plan of a sharded run: each environment's seeded items in the seed's order, built once and committed, and its
partition into shards.

The seed's order is a random permutation of the usable sources (StudyEnv.build_items), so the first shards of a run
are a random sample of the whole and a partial run estimates what the full one measures. A shard is a window of
`shard_items` consecutive positions of that order: under seeded failures its items are the window's seeded items,
under the model's own failures the window's sources whose greedy attempt fails (so a model shard holds fewer items).
Together the shards of an environment and source hold exactly the items of `fastscore study --limit all`.

The order is committed (plan/<env>.items.parquet and .skipped.parquet) rather than rebuilt: building MBPP's runs
every mutated program in a sandbox, whose timeouts may differ on another machine, and the partition must not move
under the committed shards.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from fastscore.errors import DataError
from fastscore.study.data.items import Item, Skipped
from fastscore.study.runner import SeededItems
from fastscore.study.shards.manifest import Manifest, sha256_file
from fastscore.study.shards.rowfiles import read_rows, write_rows
from fastscore.sweep.grid import Cell, Shard

log = logging.getLogger(__name__)

PLAN_DIR = "plan"
ROWS_DIR = "rows"


@dataclass(frozen=True)
class ShardSpec:
    source: str  # "seeded" or "model"
    env: str
    index: int
    start: int  # positions [start, stop) of the environment's seeded order
    stop: int

    @classmethod
    def of(cls, record: dict) -> ShardSpec:
        """The shard a manifest record describes."""
        return cls(record["source"], record["env"], record["index"], record["start"], record["stop"])

    @property
    def key(self) -> str:
        return f"{self.source}/{self.env}/{self.index:05d}"

    def folder(self, run_dir: Path) -> Path:
        return Path(run_dir) / ROWS_DIR / self.source / self.env / f"shard-{self.index:05d}"

    def sweep_shard(self, model: str, backend: str, quant: str) -> Shard:
        """The same window as the sweep's shard, which the sweep's worker runs with the study's own runner."""
        return Shard(Cell(model, backend, quant, self.env, self.source), self.index, self.start, self.stop)


def partition(counts: dict[str, int], sources: tuple[str, ...], shard_items: int) -> list[ShardSpec]:
    """Every shard of the run, in the order they run: the k-th shard of each source and environment before any
    (k+1)-th, so a run stopped anywhere holds about as many positions of every environment and source."""
    if shard_items < 1:
        raise DataError(f"--shard-items must be at least 1 (got {shard_items})")
    rounds = max((-(-n // shard_items) for n in counts.values()), default=0)
    return [ShardSpec(source, env, k, k * shard_items, min((k + 1) * shard_items, n))
            for k in range(rounds) for source in sources for env, n in counts.items() if k * shard_items < n]


def _paths(run_dir: Path, env: str) -> tuple[Path, Path]:
    folder = Path(run_dir) / PLAN_DIR
    return folder / f"{env}.items.parquet", folder / f"{env}.skipped.parquet"


def load_plan(run_dir: Path, manifest: Manifest, env: str) -> SeededItems:
    """The committed seeded order of `env`, checked against the hashes the manifest recorded."""
    recorded = manifest.record["plan"].get(env)
    items_path, skipped_path = _paths(run_dir, env)
    if recorded is None or not items_path.is_file() or not skipped_path.is_file():
        raise DataError(f"{run_dir} holds no committed plan for {env}")
    for path, key in ((items_path, "items_sha256"), (skipped_path, "skipped_sha256")):
        if sha256_file(path) != recorded[key]:
            raise DataError(f"{path} differs from the file the manifest recorded: restore it from git")
    items = [Item.from_json(json.dumps(r, ensure_ascii=False)) for r in read_rows(items_path)]
    skipped = [Skipped(**r) for r in read_rows(skipped_path)]
    return items, skipped


def ensure_plan(run_dir: Path, manifest: Manifest, envs: tuple[str, ...], seed: int, data_dir: Path,
                progress: bool = False) -> dict[str, SeededItems]:
    """Each environment's committed order; built from the data (and recorded in the manifest) where none is."""
    from fastscore.study.data.envs import open_envs

    plans = {}
    for env in envs:
        if env in manifest.record["plan"]:
            plans[env] = load_plan(run_dir, manifest, env)
            continue
        log.info("%s: building every seeded item (once per run; committed under %s/)", env, PLAN_DIR)
        items, skipped = open_envs([env], Path(data_dir), progress=progress)[env].build_items(None, seed)
        items_path, skipped_path = _paths(run_dir, env)
        write_rows(items_path, [json.loads(item.to_json()) for item in items])
        write_rows(skipped_path, [asdict(s) for s in skipped])
        manifest.record["plan"][env] = {"n_items": len(items), "n_skipped": len(skipped),
                                        "items_sha256": sha256_file(items_path),
                                        "skipped_sha256": sha256_file(skipped_path)}
        manifest.save()
        plans[env] = load_plan(run_dir, manifest, env)  # what later sessions will read, also in this one
    return plans
