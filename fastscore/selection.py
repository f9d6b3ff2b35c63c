"""One model selection: what `--model/--backend/--quant/--backend-option/--n-ctx/--threads` (or the API's arguments)
mean, checked once, before any weights are touched.

`ModelSelection.resolve(...)` turns a model reference (a registry name or its hub id, a local GGUF file, a local HF
checkpoint folder, any hub id "org/name") and its backend settings into one frozen record; `artefact()` gives the
local files (converted on first use), `open()` a ready Scorer on the opened backend. Every command, the study, the
sweep, the bench and the Python API open models through it, so a reference means the same everywhere.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastscore.errors import DamagedArtefactError
from fastscore.resolve import Artefact, ModelSource, check_local_gguf, gguf_quant, model_source
from fastscore.variants import DEFAULT_BACKEND, default_quant, validate

log = logging.getLogger(__name__)


def default_quant_of(model: str, backend: str) -> str:
    """The quant a selection takes when none is given: a local GGUF file's own type on llama.cpp (it is scored as
    it is); else the backend's full-precision type (fastscore.variants.default_quant). Reads at most a GGUF's
    header; an unknown name is not an error here (ModelSelection.resolve reports it)."""
    if backend == "llamacpp" and model.endswith(".gguf") and Path(model).expanduser().is_file():
        return gguf_quant(Path(model).expanduser())
    return default_quant(model, backend)


def _options_record(backend: str, given, n_ctx: int | None):
    """The backend's typed options record from what callers pass: None (the defaults), a record (kept), a mapping
    of fields (the API's `backend_options`, values typed or as text) or `key=value` strings (the CLI's)."""
    from fastscore.backends.options import BACKENDS, options_for, parse_options

    if dataclasses.is_dataclass(given) and not isinstance(given, type):
        record = given
        if not isinstance(record, BACKENDS[backend].options):
            raise TypeError(f"{type(record).__name__} are not the options of backend {backend!r}")
        if not n_ctx:
            return record
        return options_for(backend, {**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)},
                                     "n_ctx": n_ctx})
    if isinstance(given, str):  # one key=value, not its characters
        given = (given,)
    pairs = [f"{k}={v}" for k, v in given.items()] if isinstance(given, Mapping) else list(given or ())
    if n_ctx:
        pairs.append(f"n_ctx={n_ctx}")
    return parse_options(backend, pairs) if pairs else options_for(backend)


@dataclass(frozen=True)
class ModelSelection:
    model: str  # as the caller named it: a registry name or hub id, a local path
    backend: str
    quant: str
    source: ModelSource = field(repr=False, compare=False)  # where the weights come from (nothing loaded yet)
    hf_path: Path | None = None  # the HF folder that holds a registry model's weights (--hf-path)
    threads: int | None = None  # the backend's CPU threads; None: its default
    options: Any = None  # the backend's typed options record (fastscore.backends.options)

    @classmethod
    def resolve(cls, model: str | None = None, backend: str = DEFAULT_BACKEND, quant: str | None = None, *,
                hf_path: Path | str | None = None, threads: int | None = None,
                backend_options: Mapping[str, Any] | Sequence[str] | Any = None,
                n_ctx: int | None = None) -> "ModelSelection":
        """Every name checked (model, backend, quant, options) without loading, converting or downloading weights:
        an unknown name is a typed error here, before a command touches its outputs. `model` None: the registry's
        default; `quant` None: default_quant_of."""
        from fastscore.registry import default_model

        model = model or default_model()
        hf_path = Path(hf_path) if hf_path is not None else None
        if quant:
            validate(backend, quant)
        source = model_source(model, hf_path)
        # A local GGUF's own type is its default (its header is read once here).
        quant = quant or check_local_gguf(source, backend, None) or default_quant(model, backend)
        validate(backend, quant)
        check_local_gguf(source, backend, quant)
        options = _options_record(backend, backend_options, n_ctx)
        return cls(model=model, backend=backend, quant=quant, source=source, hf_path=hf_path, threads=threads,
                   options=options)

    def artefact(self, progress: bool = False) -> Artefact:
        """The local artefact, converted (and checked) on first use, instant afterwards."""
        from fastscore.resolve import resolve

        return resolve(self.model, self.backend, self.quant, hf_path=self.hf_path, progress=progress)

    def open(self, *, progress: bool = False, **scorer_options):
        """A Scorer on the opened backend; `scorer_options` go to Scorer (include_end_of_turn, top_k,
        max_batch_tokens...). `progress` shows conversion and scoring progress bars (the CLI turns it on)."""
        from fastscore import backends
        from fastscore.scorer import Scorer
        from fastscore.tokenizer import Tokenizer

        artefact = self.artefact(progress=progress)
        try:
            tokenizer = Tokenizer.from_folder(artefact.tokenizer_dir)
        except DamagedArtefactError as exc:
            raise DamagedArtefactError(f"{exc}; rebuild it with: {artefact.tokenizer_repair}") from exc
        engine = backends.load(self.backend, artefact.path, n_threads=self.threads, options=self.options,
                               progress=progress, compact=artefact.compact_path)
        log.info("opened %s on %s (%s): %s", self.model, self.backend, self.quant, artefact.weights_note)
        try:
            return Scorer(engine, tokenizer, chat_template_kwargs=artefact.chat_template_kwargs,
                          weights_note=artefact.weights_note, weights_repair=artefact.weights_repair,
                          **scorer_options)
        except BaseException:
            engine.close()
            raise
