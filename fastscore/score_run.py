"""`fastscore score` as one library call: refuse what can be refused before the model loads (a file of the run that
is an input or another of its files, a held OUT, an interrupted run's partial file without --resume or --restart,
conflicting settings), score the file, write the table format and the OUT.meta.json provenance sidecar."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fastscore import outputs, provenance, tables
from fastscore.errors import OutputError
from fastscore.requests_io import FileSummary
from fastscore.score_outputs import ScoreOutputs


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
              chunk_size: int = 64, resume: bool = False, restart: bool = False, on_error: str = "stop",
              max_line_bytes: int | None = None, command: str = "") -> ScoreRun:
    """Every file the run writes is named and checked against the input and each other, and OUT is locked, before
    anything is written or the model loads; the lock is held until the metadata sidecar is written."""
    from fastscore.requests_io import score_file
    from fastscore.selection import ModelSelection

    tables.check_format(out_format)
    if resume and restart:
        raise OutputError("--resume continues an interrupted run and --restart discards it: give one of them")
    names = ScoreOutputs.of(out, out_format)
    names.check([requests])
    selection = ModelSelection.resolve(model, backend, quant, hf_path=hf_path, threads=threads,
                                       backend_options=backend_options, n_ctx=n_ctx)
    # The JSONL record beside a table output has its own lock (score_file takes it): hold it too before the partial
    # file is looked at, or a refused run could delete the partial of the run that holds the record.
    with names.lock(), ScoreOutputs.of(names.record).lock():
        if not outputs.is_stdio(out):
            outputs.refuse_unresumed_partial(names.record, resume, restart)
        with selection.open(progress=True, include_end_of_turn=include_end_of_turn, top_k=top_k) as scorer:
            summary = score_file(scorer, requests, names.record, generate=generate, max_new_tokens=max_new_tokens,
                                 chunk_size=chunk_size, resume=resume, restart=restart, on_error=on_error,
                                 ban_prefix=ban_prefix, max_line_bytes=max_line_bytes)
            meta = provenance.run_metadata(scorer, model=selection.model, backend=backend, quant=selection.quant,
                                           backend_options=selection.options, command=command,
                                           extra={"requests": str(requests), "format": out_format})
            weights_note = scorer.weights_note
        if names.table is not None:
            tables.write_table(tables.read_rows(names.record), names.table, out_format)
            summary = dataclasses.replace(summary, out=names.table)
        if not outputs.is_stdio(summary.out):
            outputs.write_text_atomic(provenance.meta_path(Path(summary.out)), json.dumps(meta, indent=1) + "\n")
    return ScoreRun(summary, selection.model, selection.quant, weights_note)
