"""Turn `--model NAME --backend B --quant Q` into a local artefact, converting on first use.

`model` is a registry name (or its hub id), the path of a local HF checkpoint folder, the path of a local GGUF file
(scored on llama.cpp as it is, with the tokenizer rebuilt from its own metadata), or any hub id "org/name" (fetched
from the hub, or its local cache; a clear error offline). Artefacts live in the cache
(fastscore.cache) as one folder per variant: "tokenizer", "hf-fp32", "gguf-<quant>" (model.gguf inside),
"onnx-fp32", "onnx-int8". The embedded model's q4_1 GGUF is the shipped file itself.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from fastscore import cache, registry
from fastscore.errors import ArtefactUnavailableError, UnknownQuantError, UnsupportedError
from fastscore.variants import validate, variant_name  # noqa: F401  (the pipeline imports variant_name here)


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
    # llama.cpp f32 only: a GGUF holding the same f32 weights exactly in Q4_1 / Q8_0 blocks (the shipped file the
    # f32 GGUF was dequantized from), which a build that decodes such blocks computes at the f32 file's bits.
    compact_path: Path | None = None
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
    embedded_gguf: Path | None = None  # a shipped GGUF, or a local GGUF file given by the user (entry None)
    hub_repo: str | None = None  # a hub id outside the registry
    standin: bool = False  # a random-weight stand-in with the entry's config (fastscore.conversion.standin)

    @property
    def chat_template_kwargs(self) -> Mapping:
        return self.entry.chat_template_kwargs if self.entry else MappingProxyType({})

    @property
    def hub_id(self) -> str | None:
        return self.entry.hub_id if self.entry else self.hub_repo

    @property
    def local_gguf(self) -> Path | None:
        return self.embedded_gguf if self.entry is None else None


def local_key(folder: Path) -> str:
    """Cache key of a local HF folder (a GGUF file): its name plus a short hash of its absolute path and config
    (the file's size and modification time)."""
    folder = Path(folder).expanduser().resolve()
    config = folder / "config.json"
    digest = hashlib.sha256(str(folder).encode())
    digest.update(config.read_bytes() if config.is_file() else b"")
    if folder.is_file():
        digest.update(f"{folder.stat().st_size}:{folder.stat().st_mtime_ns}".encode())
    return f"{folder.name}-{digest.hexdigest()[:10]}"


def gguf_quant(path: Path) -> str:
    """The quant name (as --quant spells it) of a GGUF file's weights, read from its general.file_type."""
    stat = Path(path).stat()
    return _gguf_quant(Path(path).resolve(), stat.st_size, stat.st_mtime_ns)


# Reading a GGUF's header parses its whole vocabulary (seconds of CPU for a 49k-token one), and selecting, checking
# and resolving a local GGUF each need its type: read once per file version.
@functools.lru_cache(maxsize=16)
def _gguf_quant(path: Path, size: int, mtime_ns: int) -> str:
    from fastscore.deps import require
    from fastscore.variants import VARIANTS

    gguf = require("gguf", "tokenizer")
    field = gguf.GGUFReader(str(path)).fields.get("general.file_type")
    if field is None:
        raise UnknownQuantError(f"{path} does not record its weights type (general.file_type)")
    name = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name
    for variant in VARIANTS:
        if variant.backend == "llamacpp" and variant.file_type == name:
            return variant.quant
    return name.removeprefix("MOSTLY_").lower()


def is_hub_id(model: str) -> bool:
    return model.count("/") == 1 and not model.startswith((".", "/", "~")) and all(model.split("/"))


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
    from fastscore.conversion import standin

    if standin.is_standin(model):
        entry = _registry_entry(standin.base_name(model))
        if not entry.config:
            raise UnsupportedError(f"{entry.name!r} has no architecture config in the registry: no stand-in exists")
        return ModelSource(name=f"{entry.name}{standin.SUFFIX}", key=f"{entry.name}{standin.KEY_SUFFIX}",
                           entry=entry, standin=True)
    names = {entry.name for entry in registry.all_models()} | {entry.hub_id for entry in registry.all_models()}
    if model not in names and Path(model).expanduser().is_dir():
        folder = _checked_hf_folder(Path(model))
        return ModelSource(name=model, key=local_key(folder), local_dir=folder)
    if model not in names and model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise ArtefactUnavailableError(f"GGUF file {model} not found")
        return ModelSource(name=model, key=local_key(path), embedded_gguf=path.resolve())
    if model not in names and is_hub_id(model) and not Path(model).exists():
        return ModelSource(name=model, key=model.replace("/", "--"), hub_repo=model)
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
    if source.local_gguf is not None:
        return _local_gguf_artefact(source, backend, quant, progress)
    from fastscore.conversion.pipeline import build_artefact

    return build_artefact(source, backend, quant, progress=progress)


def check_local_gguf(source: ModelSource, backend: str, quant: str | None) -> str | None:
    """A local GGUF file runs as it is: on llama.cpp, at the type it holds (returned; `quant` None: not compared);
    reads only its header. None for any other source."""
    path = source.local_gguf
    if path is None:
        return None
    if backend != "llamacpp":
        raise UnsupportedError(f"a local GGUF file runs on the llamacpp backend only; for {backend}, give the HF "
                               "checkpoint folder it was made from as --model")
    held = gguf_quant(path)
    if quant is not None and quant != held:
        raise UnknownQuantError(f"{path.name} holds {held} weights and is scored as it is: pass --quant {held} "
                                "(or leave --quant out)")
    return held


def _local_gguf_artefact(source: ModelSource, backend: str, quant: str, progress: bool) -> Artefact:
    """A GGUF file the user gave: scored by llama.cpp as it is; only its tokenizer folder is built (and cached)."""
    from fastscore.conversion.pipeline import Stages, tokenizer_dir

    path = source.local_gguf
    held = check_local_gguf(source, backend, quant)
    if _rebuildable_tokenizer(path):
        stages = Stages(0, f"preparing {path.name}", progress)
        try:
            tok = tokenizer_dir(source, stages)
        finally:
            stages.close()
    else:
        tok = _llamacpp_tokenizer_dir(source)
    return Artefact(model=source.name, backend=backend, quant=quant, path=path, tokenizer_dir=tok,
                    weights_note=f"the local GGUF {path} ({held}), as given",
                    tokenizer_repair=f"rm -r {cache.home() / source.key} (rebuilt on the next run)")


def _rebuildable_tokenizer(path: Path) -> bool:
    """Whether fastscore can rebuild the GGUF's tokenizer for `tokenizers` (byte-level BPE, a known pre-tokenizer)."""
    from fastscore.conversion.gguf_tokenizer import PRE_TOKENIZER_REGEXES
    from fastscore.deps import require

    reader = require("gguf", "tokenizer").GGUFReader(str(path))

    def text(key: str, default: str) -> str:
        field = reader.fields.get(key)
        return bytes(field.parts[field.data[0]]).decode() if field is not None else default

    return text("tokenizer.ggml.model", "") == "gpt2" and text("tokenizer.ggml.pre", "default") in PRE_TOKENIZER_REGEXES


def _llamacpp_tokenizer_dir(source: ModelSource) -> Path:
    """A tokenizer folder that points at the GGUF itself: llama.cpp's own tokenizer (fastscore.tokenizer_llamacpp)."""
    from fastscore.tokenizer_llamacpp import write_pointer

    final = cache.variant_dir(source.key, "tokenizer-llamacpp")
    if not cache.is_complete(final):
        with cache.atomic_dir(final) as scratch:
            write_pointer(scratch, source.local_gguf)
    return final


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
