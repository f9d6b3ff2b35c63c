"""`fastscore bench quant`: does quantisation change the study's result? Every variant against the fp32 reference.

The same study items are scored under every variant: the failed action under `before`, the candidate set (failed
action first) under `after`. Against the reference (fp32 HF weights through the transformers backend) each variant
is compared on the per-item corrective gain G = lp(before) - lp(after) (sign, rank, mean shift), on P(repeat) and
the candidate argmax under `after`, and on the mean KL(ref || variant) of the next-token distributions at the
failed action's tokens (both conditions), from each backend's `logprob_rows`.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fastscore.errors import DataError, UnknownQuantError, UnsupportedError
from fastscore.study.quantcheck.stats import kl_rows
from fastscore.records import CandidateSet, ScoreRequest, TokenRequest
from fastscore.study.data.envs import ENVS
from fastscore.variants import REFERENCE, VARIANTS, Variant, get

log = logging.getLogger(__name__)

KL_CHUNK = 4  # requests per logprob_rows call: each holds [n_scored, n_vocab] float64 rows


DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v.in_quant_check)


def parse_variants(text: str) -> tuple[Variant, ...]:
    """'llamacpp:q8_0,onnx:int8,q4_0' -> variants; a bare type names its only backend; the reference is implied."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if ":" in part:
            backend, quant = part.split(":", 1)
        elif part == "reference":
            backend, quant = REFERENCE.backend, REFERENCE.quant
        else:
            owners = [v.backend for v in VARIANTS if v.quant == part and v != REFERENCE]
            if len(owners) != 1:
                raise UnknownQuantError(f"variant {part!r} is ambiguous or unknown; write backend:quant "
                                        f"(e.g. llamacpp:q8_0, onnx:fp32)")
            backend, quant = owners[0], part
        variant = get(backend, quant)
        if variant != REFERENCE and variant not in out:
            out.append(variant)
    if not out:
        raise UnknownQuantError("no variant to compare with the reference")
    return tuple(out)


@dataclass(frozen=True)
class QuantItem:
    env: str
    item_id: str
    before: ScoreRequest  # the failed action under `before`
    after: CandidateSet  # the candidate set (failed action first) under `after`


def build_quant_items(data_dir: Path, envs: Sequence[str], limit: int, seed: int) -> list[QuantItem]:
    from fastscore.study.data.conditions import render_conditions
    from fastscore.study.data.envs import items_for_envs, open_envs

    opened = open_envs(envs, Path(data_dir))
    items = []
    for item in items_for_envs(opened, limit, seed)[0]:
        before, after = render_conditions(item, opened[item.env], ("before", "after"))
        items.append(QuantItem(item.env, item.item_id, ScoreRequest(before.request_id, before.messages,
                                                                    item.failed_action),
                               after.candidate_set(item.candidates)))
    if not items:
        raise DataError(f"no study items built from {data_dir} for {', '.join(envs)}")
    return items


@dataclass(frozen=True)
class VariantScores:
    """Per-item scores of one variant, aligned with the item list."""

    variant: str
    weights: str
    lp_before: np.ndarray
    lp_after: np.ndarray
    n_tokens: np.ndarray  # scored tokens of the failed action (under `after`)
    p_repeat: np.ndarray  # P(candidate 0) over the set under `after`
    argmax: np.ndarray  # index of the most probable candidate under `after`
    kl_sum: np.ndarray | None  # per item: KL(ref || variant) summed over its action tokens (both conditions)
    kl_tokens: np.ndarray | None
    kl_note: str = ""

    @property
    def gain(self) -> np.ndarray:
        return self.lp_before - self.lp_after

    def item_rows(self, items: Sequence[QuantItem]) -> list[dict]:
        rows = []
        for i, item in enumerate(items):
            row = {"variant": self.variant, "env": item.env, "item_id": item.item_id,
                   "lp_before": float(self.lp_before[i]), "lp_after": float(self.lp_after[i]),
                   "gain": float(self.gain[i]), "n_tokens": int(self.n_tokens[i]),
                   "p_repeat": float(self.p_repeat[i]), "argmax": int(self.argmax[i])}
            if self.kl_sum is not None:
                row["kl_mean"] = float(self.kl_sum[i] / self.kl_tokens[i])
            rows.append(row)
        return rows


class ReferenceRows:
    """The reference's log-prob rows of every action request, kept in a float32 file (too large for memory)."""

    def __init__(self, folder: Path) -> None:
        self._file = tempfile.NamedTemporaryFile(prefix=".kl-reference-", suffix=".f32", dir=folder, delete=True)
        self.offsets: list[tuple[int, int, int]] = []  # (row offset, n rows, n vocab)
        self._rows = 0

    def append(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.float32)
        self._file.write(rows.tobytes())
        self.offsets.append((self._rows, rows.shape[0], rows.shape[1]))
        self._rows += rows.shape[0]

    def get(self, index: int) -> np.ndarray:
        start, n, vocab = self.offsets[index]
        self._file.flush()
        return np.fromfile(self._file.name, dtype=np.float32, count=n * vocab, offset=start * vocab * 4).reshape(n, vocab)

    def close(self) -> None:
        self._file.close()


def _logprob_rows(backend, requests: Sequence[TokenRequest]):
    for lo in range(0, len(requests), KL_CHUNK):
        yield from backend.logprob_rows(requests[lo : lo + KL_CHUNK])


def _kl_per_item(backend, requests: Sequence[TokenRequest], ref_rows: ReferenceRows, is_reference: bool,
                 n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Per item: KL(ref || variant) summed over its action tokens under before and after, and their count.

    The reference run stores its rows instead (and reports KL 0 against itself)."""
    per_request = []
    for index, rows in enumerate(_logprob_rows(backend, requests)):
        if is_reference:
            ref_rows.append(rows)
            per_request.append(0.0)
        else:
            per_request.append(float(kl_rows(ref_rows.get(index), rows).sum()))
    values = np.asarray(per_request)
    counts = np.asarray([r.n_scored for r in requests], dtype=float)
    return values[:n_items] + values[n_items:], counts[:n_items] + counts[n_items:]


def score_variant(variant: Variant, items: Sequence[QuantItem], model: str, threads: int | None,
                  ref_rows: ReferenceRows, ref_tokens: list[TokenRequest] | None, progress: bool = False
                  ) -> tuple[VariantScores, list[TokenRequest]]:
    """Score every item under `variant`; fill `ref_rows` (the reference) or compare against it (a variant)."""
    from fastscore.selection import ModelSelection

    is_reference = variant == REFERENCE
    selection = ModelSelection.resolve(model, variant.backend, variant.quant, threads=threads)
    with selection.open(progress=progress) as scorer:
        before = scorer.score([item.before for item in items])
        after = scorer.score_candidates([item.after for item in items])
        action = [ScoreRequest(item.after.id, item.after.messages, item.after.candidates[0]) for item in items]
        requests = [scorer.prepare(r).token_request for r in [item.before for item in items] + action]
        if ref_tokens is not None and [r.tokens for r in requests] != [r.tokens for r in ref_tokens]:
            raise DataError(f"{variant.label} tokenizes the study items differently from the reference; "
                            "KL over action tokens needs identical tokens")
        kl_sum = kl_tokens = None
        note = ""
        if not is_reference and len(ref_rows.offsets) != len(requests):
            note = "the reference produced no logprob rows: KL not computed"
        else:
            try:
                kl_sum, kl_tokens = _kl_per_item(scorer.backend, requests, ref_rows, is_reference, len(items))
            except UnsupportedError as exc:  # a backend without full distributions: the other figures still stand
                note = f"KL not computed: {exc}"
                log.warning("%s: %s", variant.label, note)
        scores = VariantScores(
            variant=variant.label, weights=scorer.weights_note,
            lp_before=np.array([r.logprob for r in before]), lp_after=np.array([s.results[0].logprob for s in after]),
            n_tokens=np.array([s.results[0].n_tokens for s in after]), p_repeat=np.array([s.probs[0] for s in after]),
            argmax=np.array([int(np.argmax([r.logprob for r in s.results])) for s in after]),
            kl_sum=kl_sum, kl_tokens=kl_tokens, kl_note=note,
        )  # fmt: skip
    return scores, requests


@dataclass(frozen=True)
class QuantCheckConfig:
    model: str
    out_dir: Path
    data_dir: Path
    envs: tuple[str, ...] = ENVS
    limit: int = 20
    variants: tuple[Variant, ...] = DEFAULT_VARIANTS
    seed: int = 0
    threads: int | None = None
    n_boot: int = 2000
    command: str = ""
    progress: bool = False


def run_quant_check(config: QuantCheckConfig) -> dict:
    """Score, compare, and write quant.json, quant.md and the plots into config.out_dir; returns the summary."""
    from fastscore.outputs import OutDirLock
    from fastscore.resolve import model_source

    out_dir = Path(config.out_dir)
    # Model and data first: nothing is created in --out for a run that cannot start.
    model_source(config.model)
    items = build_quant_items(config.data_dir, config.envs, config.limit, config.seed)
    with OutDirLock(out_dir):
        return _run_locked(config, items, out_dir)


def _run_locked(config: QuantCheckConfig, items: Sequence[QuantItem], out_dir: Path) -> dict:
    from fastscore.study.quantcheck.report import compare_all, write_outputs

    log.info("quant-check: %d items, %d variants", len(items), len(config.variants))
    ref_rows = ReferenceRows(out_dir)
    scores: dict[str, VariantScores] = {}
    try:
        ref_tokens = None
        for variant in tqdm((REFERENCE, *config.variants), desc="quant-check variants", unit="variant",
                            disable=not config.progress):
            scores[variant.label], tokens = score_variant(variant, items, config.model, config.threads, ref_rows,
                                                          ref_tokens, config.progress)
            if variant == REFERENCE:
                ref_tokens = tokens
    finally:
        ref_rows.close()
    summary = compare_all(items, scores, REFERENCE.label, config)
    write_outputs(summary, items, scores, out_dir)
    return summary
