"""Turn `--model NAME --backend B --quant Q` into a local artefact, converting on first use.

`model` is a registry name (or its hub id) or the path of a local HF checkpoint folder. Artefacts live in the cache
(fastscore.cache) as one folder per variant: "tokenizer", "hf-fp32", "gguf-<quant>" (model.gguf inside),
"onnx-fp32", "onnx-int8". The embedded model's q4_1 GGUF is the shipped file itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from fastscore import cache, registry
from fastscore.errors import ArtefactUnavailableError
from fastscore.variants import validate, variant_name  # noqa: F401  (the conversion pipeline imports them here)


GGUF_FILE = "model.gguf"


@dataclass(frozen=True)
class Artefact:
    model: str
    backend: str
    quant: str
    path: Path  # a GGUF file (llamacpp), an ONNX folder (onnx) or an HF folder (reference)
    tokenizer_dir: Path
    chat_template_kwargs: Mapping = field(default_factory=lambda: MappingProxyType({}))
    weights_note: str = ""
    # The commands that rebuild the weights and the tokenizer when they turn out damaged at run time.
    weights_repair: str = ""
    tokenizer_repair: str = ""


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from: the registry entry (if any), a local HF folder, a shipped GGUF."""

    name: str  # as the user named it
    key: str  # its folder in the cache
    entry: registry.ModelEntry | None = None
    local_dir: Path | None = None  # a local HF checkpoint folder given by the user
    embedded_gguf: Path | None = None

    @property
    def chat_template_kwargs(self) -> Mapping:
        return self.entry.chat_template_kwargs if self.entry else MappingProxyType({})

    @property
    def hub_id(self) -> str | None:
        return self.entry.hub_id if self.entry else None


def local_key(folder: Path) -> str:
    """Cache key of a local HF folder: its name plus a short hash of its absolute path and config."""
    folder = Path(folder).expanduser().resolve()
    config = folder / "config.json"
    digest = hashlib.sha256(str(folder).encode())
    digest.update(config.read_bytes() if config.is_file() else b"")
    return f"{folder.name}-{digest.hexdigest()[:10]}"


def _checked_hf_folder(folder: Path) -> Path:
    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise ArtefactUnavailableError(f"{folder} is not an HF checkpoint folder (no config.json)")
    return folder.resolve()


def _registry_entry(model: str) -> registry.ModelEntry:
    by_hub_id = {entry.hub_id: entry for entry in registry.all_models()}
    return by_hub_id[model] if model in by_hub_id else registry.get(model)


def model_source(model: str, hf_path: Path | None = None) -> ModelSource:
    """Identify the model without touching any weights (nothing is converted or downloaded here)."""
    names = {entry.name for entry in registry.all_models()} | {entry.hub_id for entry in registry.all_models()}
    if model not in names and Path(model).expanduser().is_dir():
        folder = _checked_hf_folder(Path(model))
        return ModelSource(name=model, key=local_key(folder), local_dir=folder)
    entry = _registry_entry(model)  # raises UnknownModelError with a suggestion
    if hf_path is not None:
        folder = _checked_hf_folder(hf_path)
        # The embedded model's cache holds GGUF-derived variants; weights from a folder must not mix with them.
        key = f"{entry.name}-{local_key(folder)}" if entry.embedded else entry.name
        return ModelSource(name=entry.name, key=key, entry=entry, local_dir=folder)
    if entry.embedded is not None:
        from fastscore.embedded import embedded_gguf

        return ModelSource(name=entry.name, key=entry.name, entry=entry, embedded_gguf=embedded_gguf(entry))
    return ModelSource(name=entry.name, key=entry.name, entry=entry)


def resolve(model: str, backend: str, quant: str, *, hf_path: Path | None = None, progress: bool = True) -> Artefact:
    """The local artefact for (model, backend, quant), converted (and checked) on first use, instant afterwards."""
    source = model_source(model, hf_path)
    validate(backend, quant)
    from fastscore.conversion.pipeline import build_artefact

    return build_artefact(source, backend, quant, progress=progress)


def local_variants(model: str) -> list[str]:
    """The variants of `model` present locally (complete in the cache, or shipped)."""
    try:
        source = model_source(model)
    except ArtefactUnavailableError:  # the embedded model's wheel is missing: its cache may still hold variants
        source = ModelSource(name=model, key=_registry_entry(model).name)
    folder = cache.home() / source.key
    present = sorted(p.name for p in folder.iterdir() if cache.is_complete(p)) if folder.is_dir() else []
    if source.embedded_gguf is not None and source.entry is not None:
        present.append(f"gguf-{source.entry.embedded.quant} (shipped)")
    return present
