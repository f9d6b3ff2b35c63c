"""Open a ready Scorer by model name: resolve the artefact, load the backend, load the shared tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path

from fastscore import backends
from fastscore.errors import DamagedArtefactError
from fastscore.scorer import Scorer
from fastscore.tokenizer import Tokenizer
# The default type is a fact about the variants (it is read from their table), not about an open session; kept
# importable from here for the session's callers.
from fastscore.variants import DEFAULT_BACKEND, default_quant  # noqa: F401

log = logging.getLogger(__name__)


def scoring_settings(model: str | None, backend: str, quant: str | None, *, hf_path: Path | None = None,
                     backend_options=(), n_ctx: int | None = None):
    """(model, quant, typed backend options) of a scoring command, every name checked before any model loads."""
    from fastscore.backends.options import parse_options
    from fastscore.registry import default_model
    from fastscore.resolve import default_quant_of, model_source, validate

    model = model or default_model()
    quant = quant or default_quant_of(model, backend)
    validate(backend, quant)
    model_source(model, hf_path)
    return model, quant, parse_options(backend, [*backend_options, *([f"n_ctx={n_ctx}"] if n_ctx else [])])


def open_scorer(
    model: str,
    backend: str,
    quant: str,
    *,
    hf_path: Path | None = None,
    n_threads: int | None = None,
    backend_options=None,
    progress: bool = False,
    **opts,
) -> Scorer:
    """A Scorer for `model` on `backend` at `quant`; `backend_options` is the backend's typed options record
    (fastscore.backends.options); `opts` go to Scorer (include_end_of_turn, max_batch_tokens...). `progress` shows
    conversion and scoring progress bars (the CLI turns it on)."""
    from fastscore.resolve import resolve

    artefact = resolve(model, backend, quant, hf_path=hf_path, progress=progress)
    try:
        tokenizer = Tokenizer.from_folder(artefact.tokenizer_dir)
    except DamagedArtefactError as exc:
        raise DamagedArtefactError(f"{exc}; rebuild it with: {artefact.tokenizer_repair}") from exc
    engine = backends.load(backend, artefact.path, n_threads=n_threads, options=backend_options, progress=progress)
    log.info("opened %s on %s (%s): %s", model, backend, quant, artefact.weights_note)
    try:
        return Scorer(
            engine,
            tokenizer,
            chat_template_kwargs=artefact.chat_template_kwargs,
            weights_note=artefact.weights_note,
            weights_repair=artefact.weights_repair,
            **opts,
        )
    except BaseException:
        engine.close()
        raise
