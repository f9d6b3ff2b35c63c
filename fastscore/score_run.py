"""`fastscore score` as one library call: refuse what can be refused before the model loads, score the file, write
the table format and the OUT.meta.json provenance sidecar."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fastscore import outputs, provenance, tables
from fastscore.errors import OutputError
from fastscore.requests_io import FileSummary


@dataclass(frozen=True)
class ScoreRun:
    summary: FileSummary
    model: str
    quant: str
    weights_note: str


def run_score(requests: Path, out: Path, *, model: str | None, backend: str, quant: str | None,
              hf_path: Path | None = None, threads: int | None = None, include_end_of_turn: bool = True,
              backend_options: Sequence[str] = (), n_ctx: int | None = None, top_k: int = 0,
              out_format: str = "jsonl", ban_prefix: bool = False, generate: bool = False, max_new_tokens: int = 128,
              chunk_size: int = 64, resume: bool = False, on_error: str = "stop", command: str = "") -> ScoreRun:
    from fastscore.requests_io import score_file
    from fastscore.session import open_scorer, scoring_settings

    tables.check_format(out_format)
    table_out = None
    if out_format != "jsonl":
        if outputs.is_stdio(out):
            raise OutputError(f"--format {out_format} needs an output file, not stdout")
        table_out, out = out, out.with_name(out.name + ".jsonl")  # the resumable record the table is made from
        outputs.check_not_an_input(table_out, [requests])
    if not outputs.is_stdio(out):
        outputs.check_not_an_input(out, [requests])
        outputs.ensure_parent(out)
        outputs.refuse_unresumed_partial(out, resume)
    model, quant, options = scoring_settings(model, backend, quant, hf_path=hf_path,
                                             backend_options=backend_options, n_ctx=n_ctx)
    with open_scorer(model, backend, quant, hf_path=hf_path, n_threads=threads, backend_options=options,
                     progress=True, include_end_of_turn=include_end_of_turn, top_k=top_k) as scorer:
        summary = score_file(scorer, requests, out, generate=generate, max_new_tokens=max_new_tokens,
                             chunk_size=chunk_size, resume=resume, on_error=on_error, ban_prefix=ban_prefix)
        meta = provenance.run_metadata(scorer, model=model, backend=backend, quant=quant, backend_options=options,
                                       command=command, extra={"requests": str(requests), "format": out_format})
        weights_note = scorer.weights_note
    if table_out is not None:
        tables.write_table(tables.read_rows(out), table_out, out_format)
        summary = dataclasses.replace(summary, out=table_out)
    if not outputs.is_stdio(summary.out):
        outputs.write_text_atomic(provenance.meta_path(Path(summary.out)), json.dumps(meta, indent=1) + "\n")
    return ScoreRun(summary, model, quant, weights_note)
