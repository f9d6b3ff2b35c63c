"""`fastscore bench quant --run RUN_DIR`: quantisation checked on a sharded run's committed items.

The items are the run's own (every committed one, or a seeded random sample), rendered exactly as the study
rendered them (render_conditions; an on-policy failed action as the token ids the model emitted). The reference is
the committed rows themselves: the failed action's lp under `before` and `after` and the candidate set under
`after`, as the run's exact backend (llama.cpp f32 for the embedded model) scored them, so nothing is re-scored for
the reference. Each variant scores the same requests, after a check that it tokenizes every request as the run's
model does and that the rendered action tokens are the committed ones (else its scores are of other requests).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from fastscore.errors import DataError
from fastscore.records import CandidateSet, ScoreRequest
from fastscore.variants import Variant, get

log = logging.getLogger(__name__)

# The variants `--run` compares by default: the question of issue 32 is q8_0 and q4_0 on every item.
RUN_DEFAULT_VARIANTS = (get("llamacpp", "q8_0"), get("llamacpp", "q4_0"))
ITEMS_PER_CALL = 16  # items per scorer call: 1 + 4 requests each, sharing their context's prefix


@dataclass(frozen=True)
class CommittedItem:
    """One committed item: its requests as the study rendered them and the committed scores of its failed action."""

    source: str  # "seeded" or "model"
    env: str
    shard: str  # the committed shard that holds it
    item_id: str
    before: ScoreRequest  # the failed action under `before`
    after: CandidateSet  # the candidate set (failed action first) under `after`
    lp_before: float  # committed
    lp_after: float
    n_tokens: int  # the failed action's scored tokens under `after` (the study's per-token divisor)
    argmax_after: int  # the committed most probable candidate under `after`
    action_tokens: tuple[tuple[int, ...], ...]  # committed token ids: the failed action under before, then after's

    @property
    def group(self) -> str:
        return f"{self.source}/{self.env}"

    @property
    def gain(self) -> float:
        return self.lp_before - self.lp_after

    def requests(self) -> list[ScoreRequest]:
        return [self.before, *self.after.score_requests()]


def load_committed_items(run_dir: Path, data_dir: Path, sample: int | None = None, seed: int = 0
                         ) -> tuple[list[CommittedItem], dict[str, Any], list[str]]:
    """The run's committed items that it scored (a seeded sample of `sample` of them, or all), the run's settings,
    and the items left out because the run recorded an item error for them ("shard:item")."""
    from fastscore.study.data.conditions import render_conditions
    from fastscore.study.data.envs import open_envs
    from fastscore.study.data.items import Item
    from fastscore.study.stages.onpolicy import scored_candidates
    from fastscore.study.shards.manifest import Manifest
    from fastscore.study.shards.rescore import committed_rows, errored_items
    from fastscore.study.shards.rescore import sample as sample_items

    run_dir = Path(run_dir)
    manifest = Manifest.open(run_dir, None)
    errored = list(errored_items(run_dir, manifest))
    picks = (sample_items(run_dir, manifest, math.inf if sample is None else sample, seed, excluding=errored)
             if manifest.shards else [])
    left_out = [f"{key}:{item_id}" for key, item_id in errored]
    if not picks:
        raise DataError(f"{run_dir} has no committed rows: no item to check quantisation on "
                        "(run `fastscore study-shards run` first)")
    envs = open_envs(sorted({spec.env for spec, _ in picks}), Path(data_dir))
    rows_of: dict[str, dict[str, list[dict]]] = {}
    items = []
    for spec, item_id in picks:
        if spec.key not in rows_of:
            rows_of[spec.key] = committed_rows(run_dir, manifest, spec)  # checked against the manifest's hashes
        rows = rows_of[spec.key]
        record = _one(rows, "items", item_id, spec.key)
        item = Item.from_json(json.dumps(record, ensure_ascii=False))
        scores = {r["condition"]: r for r in rows["scores"] if r["item_id"] == item_id}
        conditions = _one(rows, "logprobs", item_id, spec.key)["conditions"]
        if "before" not in scores or "after" not in scores:
            raise DataError(f"{spec.key}: item {item_id} has no committed scores under before and after")
        before, after = render_conditions(item, envs[item.env], ("before", "after"))
        before_set = before.candidate_set(scored_candidates(item))
        after_lp = [-math.inf if x is None else x for x in conditions["after"]["cand_lp"]]
        items.append(CommittedItem(
            source=spec.source, env=spec.env, shard=spec.key, item_id=item_id, before=before_set.score_requests()[0],
            after=after.candidate_set(scored_candidates(item)),
            lp_before=float(scores["before"]["lp"]), lp_after=float(scores["after"]["lp"]),
            n_tokens=int(scores["after"]["n_tokens"]), argmax_after=int(np.argmax(after_lp)),
            action_tokens=(tuple(conditions["before"]["cand_token_ids"][0]),
                           *(tuple(t) for t in conditions["after"]["cand_token_ids"])),
        ))  # fmt: skip
    return items, manifest.settings, left_out


def _one(rows: dict[str, list[dict]], kind: str, item_id: str, where: str) -> dict:
    found = [r for r in rows.get(kind, []) if r.get("item_id") == item_id]
    if len(found) != 1:
        raise DataError(f"{where}: {len(found)} committed {kind} rows for item {item_id} (expected 1)")
    return found[0]


def _token_requests(scorer, items: Sequence[CommittedItem]) -> list[list[tuple[int, ...]]]:
    """Each item's requests as token ids (no model call)."""
    return [[scorer.prepare(r).token_request.tokens for r in item.requests()] for item in items]


def reference_tokens(selection, items: Sequence[CommittedItem], include_end_of_turn: bool
                     ) -> list[list[tuple[int, ...]]]:
    """The requests tokenized by the run's own model (`selection`), after checking that their scored tokens are the
    committed ones: the rendering reproduces the requests the rows were scored on."""
    with selection.open(include_end_of_turn=include_end_of_turn) as scorer:
        tokens = []
        for item in items:
            prepared = [scorer.prepare(r).token_request for r in item.requests()]
            scored = tuple(r.tokens[r.score_from:] for r in prepared)
            if scored != item.action_tokens:
                raise DataError(f"{item.group} item {item.item_id}: the requests rendered now score other tokens "
                                "than the committed rows; the rendering changed since the run")
            tokens.append([r.tokens for r in prepared])
    return tokens


@dataclass(frozen=True)
class CommittedScores:
    """One variant's scores of the items' failed action under before and after, aligned with the items."""

    variant: str
    weights: str
    lp_before: np.ndarray
    lp_after: np.ndarray
    argmax_after: np.ndarray

    @property
    def gain(self) -> np.ndarray:
        return self.lp_before - self.lp_after


def score_committed(variant: Variant, selection, items: Sequence[CommittedItem], include_end_of_turn: bool,
                    ref_tokens: list[list[tuple[int, ...]]], progress: bool = False,
                    cache_dir: Path | None = None) -> CommittedScores:
    """Score every item under `variant` (opened from `selection`); refused before any scoring if it tokenizes a
    request differently from the run's model. With `cache_dir`, each scored call is kept there and a call of the
    same items is read back instead of scored again (a stopped check resumes)."""
    with selection.open(progress=progress, include_end_of_turn=include_end_of_turn) as scorer:
        for item, want, got in zip(items, ref_tokens, _token_requests(scorer, items)):
            if got != want:
                raise DataError(f"{variant.label} tokenizes {item.group} item {item.item_id} differently from the "
                                "run's model: its scores would be of other tokens")
        weights = scorer.weights_note
        cache = ChunkCache(cache_dir, variant.label, weights) if cache_dir is not None else None
        lp_before, lp_after, argmax = np.empty(len(items)), np.empty(len(items)), np.empty(len(items), dtype=int)
        chunks = item_chunks(items)
        for chunk in tqdm(chunks, desc=f"{variant.label} items", unit="call", disable=not progress):
            # Named by the items and the very tokens scored: another run (or rendering) in the same --out misses.
            keys = [(items[i].shard, items[i].item_id, _digest(ref_tokens[i])) for i in chunk]
            scored = cache.get(keys) if cache is not None else None
            if scored is None:
                before = [r.logprob for r in scorer.score([items[i].before for i in chunk])]
                after = scorer.score_candidates([items[i].after for i in chunk])
                scored = {"lp_before": before, "lp_after": [result.results[0].logprob for result in after],
                          "argmax": [int(np.argmax([r.logprob for r in result.results])) for result in after]}
                if cache is not None:
                    cache.put(keys, scored)
            lp_before[chunk], lp_after[chunk], argmax[chunk] = scored["lp_before"], scored["lp_after"], scored["argmax"]
    return CommittedScores(variant.label, weights, lp_before, lp_after, argmax)


def _digest(tokens: list[tuple[int, ...]]) -> str:
    return hashlib.sha256(json.dumps([list(t) for t in tokens]).encode()).hexdigest()[:16]


def item_chunks(items: Sequence[CommittedItem]) -> list[list[int]]:
    """The items scored per call, as indices: runs of up to ITEMS_PER_CALL items of one shard.

    A quantised llama.cpp type's scores depend on the batch, so the calls are fixed by the shards: adding shards to
    the run, sampling or resuming leaves every other call's items, and so its scores, as they were.
    """
    chunks: list[list[int]] = []
    for index, item in enumerate(items):
        if chunks and len(chunks[-1]) < ITEMS_PER_CALL and items[chunks[-1][0]].shard == item.shard:
            chunks[-1].append(index)
        else:
            chunks.append([index])
    return chunks


def _json_lines(path: Path) -> list[dict]:
    """The lines of a JSON-lines file; a last line cut off by a stop is dropped (and removed from the file)."""
    text = path.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or text.endswith("\n"):
        return [json.loads(line) for line in lines]
    whole = [json.loads(line) for line in lines[:-1]]  # every line before the last was written whole
    try:
        return [*whole, json.loads(lines[-1])]
    except json.JSONDecodeError:
        path.write_text("".join(line + "\n" for line in lines[:-1]), encoding="utf-8")
        return whole


class ChunkCache:
    """One variant's scored calls in `cache_dir/<variant>.jsonl`: a header naming the variant and its weights, then
    one line per call (its items' keys and scores), appended as each call ends."""

    def __init__(self, cache_dir: Path, label: str, weights: str) -> None:
        self.path = Path(cache_dir) / f"{label.replace(':', '-')}.jsonl"
        header = {"variant": label, "weights": weights}
        self.done: dict[tuple, dict[str, list]] = {}
        if self.path.exists():
            lines = _json_lines(self.path)
            if not lines or lines[0] != header:
                raise DataError(f"{self.path} holds scores of other weights ({lines[0] if lines else 'no header'}, "
                                f"not {header}): use another --out")
            self.done = {tuple(map(tuple, line["items"])): line for line in lines[1:]}
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(header) + "\n", encoding="utf-8")

    def get(self, keys: list[tuple[str, str, str]]) -> dict[str, list] | None:
        return self.done.get(tuple(keys))

    def put(self, keys: list[tuple[str, str, str]], scored: dict[str, list]) -> None:
        line = {"items": [list(k) for k in keys], **{k: [float(x) if k != "argmax" else int(x) for x in v]
                                                      for k, v in scored.items()}}
        with self.path.open("a", encoding="utf-8") as f:  # one line per call: a stop loses at most the call it cut
            f.write(json.dumps(line, allow_nan=False) + "\n")
        self.done[tuple(keys)] = line


@dataclass(frozen=True)
class CommittedCheckConfig:
    run_dir: Path
    out_dir: Path
    data_dir: Path
    variants: tuple[Variant, ...] = RUN_DEFAULT_VARIANTS
    sample: int | None = None  # None: every committed item
    seed: int = 0
    threads: int | None = None
    n_boot: int = 2000
    model: str | None = None  # None: the run's
    command: str = ""
    progress: bool = False


def run_committed_check(config: CommittedCheckConfig) -> dict[str, Any]:
    """Score the run's committed items under every variant, compare with the committed rows, write quant.json and
    quant.md into config.out_dir; returns the summary."""
    from fastscore.outputs import OutDirLock
    from fastscore.selection import ModelSelection
    from fastscore.study.quantcheck.committed_report import summarize, write_outputs

    # The run, its rows, the data and every name first: nothing is created in --out for a check that cannot start.
    items, settings, left_out = load_committed_items(config.run_dir, config.data_dir, config.sample, config.seed)
    model = config.model or settings["model"]
    if model != settings["model"]:  # another model's variants against these rows would measure the model, not the type
        raise DataError(f"{config.run_dir} was run on {settings['model']!r}: its rows are no reference for {model!r}")
    own = ModelSelection.resolve(settings["model"], settings["backend"], settings["quant"],
                                 hf_path=settings.get("hf_path"), threads=config.threads)
    selections = [ModelSelection.resolve(model, v.backend, v.quant, hf_path=settings.get("hf_path"),
                                         threads=config.threads) for v in config.variants]
    eot = settings["include_end_of_turn"]
    log.info("quant check on %s: %d committed items, %d variants", config.run_dir, len(items), len(config.variants))
    with OutDirLock(Path(config.out_dir)):
        ref_tokens = reference_tokens(own, items, eot)
        scores = {v.label: score_committed(v, selection, items, eot, ref_tokens, config.progress,
                                           Path(config.out_dir) / "calls")
                  for v, selection in zip(config.variants, selections)}
        summary = summarize(items, scores, settings, config, left_out)
        write_outputs(summary, items, scores, Path(config.out_dir))
    return summary
