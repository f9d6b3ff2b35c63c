"""Re-score committed items from scratch with the running code and compare them with their committed rows.

Each sampled item is redone alone, by the study's own runner, from its position in the committed seeded order:
under the model's own failures that includes the model's attempt, so the item itself must come out again. Every row
kind the shard holds for the item is compared field by field: numbers with a fraction within TOLERANCE (log-probs in
nats, and the probabilities computed from them), everything else (texts, token ids, greedy completions, verdicts,
counts) equal. Used by `fastscore study-shards verify` and before a run mixes in shards of a new producer.
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastscore.errors import DataError
from fastscore.study.runner import SeededItems
from fastscore.study.shards.manifest import Manifest, sha256_file
from fastscore.study.shards.plan import ShardSpec
from fastscore.jsonl import read_jsonl
from fastscore.study.shards.rowfiles import read_rows
from fastscore.variants import BATCH_INVARIANCE_TOL

log = logging.getLogger(__name__)

TOLERANCE = BATCH_INVARIANCE_TOL  # nats: what "the same score" means between runs of exact code
NO_ITEM_KINDS = ("skipped",)  # row kinds whose records belong to no item (sources passed over)


@dataclass
class Comparison:
    """max |Δ| per score kind ("scores:lp", "logprobs:cand_token_lp", ...) and every non-numeric difference."""

    items: list[str] = field(default_factory=list)
    max_abs: dict[str, float] = field(default_factory=dict)
    n_values: dict[str, int] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.mismatches and all(d <= TOLERANCE for d in self.max_abs.values())

    def number(self, label: str, a: float, b: float) -> None:
        self.max_abs[label] = max(self.max_abs.get(label, 0.0), abs(float(a) - float(b)))
        self.n_values[label] = self.n_values.get(label, 0) + 1

    def lines(self) -> list[str]:
        out = [f"{'score kind':<32} {'values':>7}  max |Δ|"]
        out += [f"{label:<32} {self.n_values[label]:>7}  {self.max_abs[label]:.3g}"
                + ("  > tolerance" if self.max_abs[label] > TOLERANCE else "") for label in sorted(self.max_abs)]
        out += [f"differs: {m}" for m in self.mismatches[:20]]
        if len(self.mismatches) > 20:
            out.append(f"... and {len(self.mismatches) - 20} more differences")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"items": self.items, "max_abs": self.max_abs, "mismatches": self.mismatches[:20],
                "passed": self.passed, "tolerance": TOLERANCE}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def compare(kind: str, name: str, got: Any, want: Any, where: str, out: Comparison) -> None:
    """Walk two JSON values; `name` is the nearest field name, which labels the numbers under it."""
    numbers = (int, float)
    if isinstance(got, dict) and isinstance(want, dict):
        if set(got) != set(want):
            out.mismatches.append(f"{where}: fields {sorted(set(got) ^ set(want))} only on one side")
        for key in sorted(set(got) & set(want)):
            compare(kind, key, got[key], want[key], f"{where}.{key}", out)
    elif isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            out.mismatches.append(f"{where}: {len(got)} values, committed {len(want)}")
        for i, (a, b) in enumerate(zip(got, want)):
            compare(kind, name, a, b, f"{where}[{i}]", out)
    elif (isinstance(got, numbers) and isinstance(want, numbers) and not isinstance(got, bool)
          and not isinstance(want, bool) and (isinstance(got, float) or isinstance(want, float))):
        out.number(f"{kind}:{name}", got, want)
    elif got != want or type(got) is not type(want):
        out.mismatches.append(f"{where}: {_short(got)}, committed {_short(want)}")


def committed_rows(run_dir: Path, manifest: Manifest, spec: ShardSpec) -> dict[str, list[dict[str, Any]]]:
    """A committed shard's rows by kind, each file checked against the hash the manifest recorded."""
    record = manifest.shards[spec.key]
    rows = {}
    for kind, entry in record["files"].items():
        path = Path(run_dir) / entry["file"]
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            raise DataError(f"{path} is missing or differs from the file the manifest recorded: restore it from git")
        rows[kind] = read_rows(path)
    return rows


def sample(run_dir: Path, manifest: Manifest, k: int, seed: int, *,
           excluding: Collection[tuple[str, str]] = ()) -> list[tuple[ShardSpec, str]]:
    """A seeded random sample of `k` committed items, as (shard, item id), leaving out the (shard, item id) pairs in
    `excluding` (the items the run recorded an item error for have no log-prob or score rows)."""
    left_out = set(excluding)
    pool = [pick for pick in _committed_items(run_dir, manifest) if pick not in left_out]
    picked = random.Random(seed).sample(pool, min(k, len(pool)))
    return [(ShardSpec.of(manifest.shards[key]), item_id) for key, item_id in sorted(picked)]


def named(run_dir: Path, manifest: Manifest, item_ids: Sequence[str]) -> list[tuple[ShardSpec, str]]:
    """The committed items with these ids, as (shard, item id); an id no committed shard holds is refused."""
    wanted = set(item_ids)
    found = {item_id: key for key, item_id in _committed_items(run_dir, manifest) if item_id in wanted}
    missing = [i for i in item_ids if i not in found]
    if missing:
        raise DataError(f"no committed shard of {run_dir} holds item(s) {', '.join(missing)}")
    return [(ShardSpec.of(manifest.shards[key]), item_id) for key, item_id in sorted((k, i) for i, k in found.items())]


def errored_items(run_dir: Path, manifest: Manifest) -> Iterator[tuple[str, str]]:
    """(shard key, item id) of every committed item error (an item the run could not score: too long, ...)."""
    return _item_ids(run_dir, manifest, "item_errors")


def _committed_items(run_dir: Path, manifest: Manifest) -> Iterator[tuple[str, str]]:
    """(shard key, item id) of every committed item, shard after shard in key order."""
    return _item_ids(run_dir, manifest, "items")


def _item_ids(run_dir: Path, manifest: Manifest, kind: str) -> Iterator[tuple[str, str]]:
    for key in sorted(manifest.shards):
        entry = manifest.shards[key]["files"].get(kind)
        if entry is not None:
            yield from ((key, r["item_id"]) for r in read_rows(Path(run_dir) / entry["file"]))


def _position(spec: ShardSpec, item: dict[str, Any], plan: SeededItems) -> int:
    """The item's position in the seeded order: its own (seeded), or its source's (the model's own failure)."""
    seeded = plan[0]
    for p in range(spec.start, spec.stop):
        if (seeded[p].item_id == item["item_id"] if spec.source == "seeded"
                else seeded[p].source_id == item["source_id"]):
            return p
    raise DataError(f"item {item['item_id']} of shard {spec.key} is not in the shard's window of the seeded order")


def rescore(run_dir: Path, manifest: Manifest, picks: list[tuple[ShardSpec, str]], plans: Mapping[str, SeededItems],
            data_dir: Path, threads: int | None = None, sandbox: str = "bwrap") -> Comparison:
    """Redo each picked item alone in a temporary folder and compare all its rows with the committed ones."""
    from fastscore.sweep import items as sweep_items
    from fastscore.sweep.worker import ShardRunner, ShardSettings, shard_dir

    settings = manifest.settings
    out = Comparison(items=[f"{spec.key}:{item_id}" for spec, item_id in picks])
    with tempfile.TemporaryDirectory(prefix="fastscore-rescore-") as tmp:
        for env in {spec.env for spec, _ in picks}:
            sweep_items.save(Path(tmp), {"env": env, "seed": settings["seed"]}, plans[env])
        runner = ShardRunner(ShardSettings(out_dir=Path(tmp), data_dir=Path(data_dir), seed=settings["seed"],
                                           max_new_tokens=settings["max_new_tokens_option"], threads=threads,
                                           sandbox=sandbox))
        try:
            for spec, item_id in picks:
                committed = committed_rows(run_dir, manifest, spec)
                item = next(r for r in committed["items"] if r["item_id"] == item_id)
                p = _position(spec, item, plans[spec.env])
                alone = ShardSpec(spec.source, spec.env, p, p, p + 1).sweep_shard(
                    settings["model"], settings["backend"], settings["quant"])
                log.info("re-scoring %s (%s, position %d) from scratch", item_id, spec.key, p)
                runner.run(alone)
                folder = shard_dir(Path(tmp), alone)
                redone = {f.stem: read_jsonl(f) for f in folder.glob("*.jsonl")}
                for kind in sorted(set(committed) | set(redone)):
                    if kind in NO_ITEM_KINDS:
                        continue
                    got = [r for r in redone.get(kind, []) if r.get("item_id") == item_id]
                    want = [r for r in committed.get(kind, []) if r.get("item_id") == item_id]
                    compare(kind, kind, got, want, f"{item_id} {kind}", out)
        finally:
            runner.close()
    return out
