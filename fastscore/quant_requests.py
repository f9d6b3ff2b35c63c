"""`fastscore bench quant --requests FILE`: the quantisation check on a user's own scoring file.

The file is scored once by the transformers fp32 reference and once per variant (each output kept in --out as
`<backend>-<quant>.jsonl` with its meta sidecar); each variant is then compared with the reference by
fastscore.compare: per-token and per-candidate differences, token- and candidate-argmax changes and sign flips of
every within-request candidate contrast, each proportion with a Wilson interval. Written: quant.json, quant.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from fastscore import outputs, provenance
from fastscore.compare import Comparison, compare_files

log = logging.getLogger(__name__)

REFERENCE = ("reference", "fp32")


def _score(requests: Path, model: str, backend: str, quant: str, out: Path, threads: int | None,
           progress: bool, command: str) -> Path:
    from fastscore.requests_io import score_file
    from fastscore.selection import ModelSelection

    with ModelSelection.resolve(model, backend, quant, threads=threads).open(progress=progress) as scorer:
        score_file(scorer, requests, out, progress=progress)
        meta = provenance.run_metadata(scorer, model=model, backend=backend, quant=quant,
                                       command=command)
    outputs.write_text_atomic(provenance.meta_path(out), json.dumps(meta, indent=1) + "\n")
    return out


def _markdown(model: str, requests: Path, results: dict[str, Comparison]) -> str:
    lines = [f"# Quantisation check on {requests.name}", "",
             f"Model {model}; every variant compared with the transformers fp32 reference on the same requests.", "",
             "| variant | tokens | max abs d per token | mean abs d per token | mean abs d per candidate | "
             "best candidate changed | contrast sign flips |", "|---|---|---|---|---|---|---|"]
    for label, c in results.items():
        lines.append(f"| {label} | {c.n_tokens} | {c.token_abs_diff['max']:.3g} | {c.token_abs_diff['mean']:.3g} | "
                     f"{c.candidate_diff['mean_abs']:.3g} | {c.candidate_argmax_changes.line()} | "
                     f"{c.contrast_sign_flips.line()} |")
    return "\n".join(lines) + "\n"


def quant_check_requests(requests: Path, model: str, variants: Sequence[tuple[str, str]], out_dir: Path, *,
                         threads: int | None = None, progress: bool = False, command: str = ""
                         ) -> dict[str, Comparison]:
    """Score `requests` with the reference and each (backend, quant); compare each with the reference."""
    from fastscore.requests_io import read_requests

    for _ in read_requests(requests):  # a malformed file fails before any model loads
        pass
    out_dir = Path(out_dir)
    with outputs.OutDirLock(out_dir):
        reference = _score(requests, model, *REFERENCE, out_dir / "reference-fp32.jsonl", threads, progress, command)
        results = {}
        for backend, quant in variants:
            scored = _score(requests, model, backend, quant, out_dir / f"{backend}-{quant}.jsonl", threads, progress,
                            command)
            results[f"{backend}:{quant}"] = compare_files(reference, scored)
            log.info("%s:%s compared with the reference", backend, quant)
        outputs.write_text_atomic(out_dir / "quant.json", json.dumps(
            {"model": model, "requests": str(requests), "reference": "reference:fp32",
             "variants": {label: c.to_dict() for label, c in results.items()}}, indent=1) + "\n")
        outputs.write_text_atomic(out_dir / "quant.md", _markdown(model, Path(requests), results))
    return results
