"""Deprecated: models are opened through one selection, `fastscore.selection.ModelSelection`.

`open_scorer(model, backend, quant, ...)` is kept as an alias of `ModelSelection.resolve(...).open(...)` for code
written against it; it warns (DeprecationWarning). Nothing in fastscore imports this module.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from fastscore.selection import ModelSelection


def open_scorer(model: str, backend: str, quant: str, *, hf_path: Path | None = None, n_threads: int | None = None,
                backend_options=None, progress: bool = False, **scorer_options):
    warnings.warn("fastscore.session.open_scorer is deprecated: use "
                  "fastscore.selection.ModelSelection.resolve(model, backend, quant, ...).open()",
                  DeprecationWarning, stacklevel=2)
    selection = ModelSelection.resolve(model, backend, quant, hf_path=hf_path, threads=n_threads,
                                       backend_options=backend_options)
    return selection.open(progress=progress, **scorer_options)
