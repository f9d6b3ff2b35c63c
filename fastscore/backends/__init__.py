"""A lazy registry of backends: choosing one imports its module (and its heavy dependencies), nothing earlier."""

from __future__ import annotations

import importlib
from pathlib import Path

from fastscore.backends.options import BACKENDS
from fastscore.errors import SettingsError
from fastscore.variants import check_backend


def backend_class(name: str):
    check_backend(name)
    kind = BACKENDS[name]
    return getattr(importlib.import_module(kind.module), kind.cls)


def load(name: str, path: Path, *, n_threads: int | None = None, options=None, progress: bool = False,
         compact: Path | None = None, **fields):
    """Open backend `name` on the artefact at `path` (a GGUF file, an ONNX folder or an HF folder).

    `options` is the backend's typed options record (fastscore.backends.options); `fields` build one instead,
    checked against its fields (e.g. load("onnx", path, share_prefixes=False)). `compact`: the artefact's
    compact_path (llama.cpp only: the same f32 weights in Q4_1 / Q8_0 blocks).
    """
    from fastscore.backends.options import options_for

    cls = backend_class(name)
    if options is None:
        options = options_for(name, fields)
    elif fields:
        raise TypeError("pass either options or option fields, not both")
    if compact is not None and name != "llamacpp":
        raise SettingsError(f"a compact weights file is a llama.cpp GGUF: backend {name!r} takes none")
    extra = {} if compact is None else {"compact": Path(compact)}
    return cls(Path(path), n_threads=n_threads, options=options, progress=progress, **extra)
