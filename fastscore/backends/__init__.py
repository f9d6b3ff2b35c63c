"""A lazy registry of backends: choosing one imports its module (and its heavy dependencies), nothing earlier."""

from __future__ import annotations

import importlib
from pathlib import Path

from fastscore.errors import UnknownBackendError
from fastscore.registry import suggest

# name -> (module, class). Modules are imported only when the backend is chosen.
BACKENDS: dict[str, tuple[str, str]] = {
    "llamacpp": ("fastscore.backends.llamacpp", "LlamaCppBackend"),
    "onnx": ("fastscore.backends.onnx", "OnnxBackend"),
    "reference": ("fastscore.backends.reference", "ReferenceBackend"),
}


def backend_class(name: str):
    if name not in BACKENDS:
        known = sorted(BACKENDS)
        raise UnknownBackendError(f"unknown backend {name!r}.{suggest(name, known)} Known backends: {', '.join(known)}")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)


def load(name: str, path: Path, *, n_threads: int | None = None, options=None, progress: bool = False,
         **fields):
    """Open backend `name` on the artefact at `path` (a GGUF file, an ONNX folder or an HF folder).

    `options` is the backend's typed options record (fastscore.backends.options); `fields` build one instead,
    checked against its fields (e.g. load("onnx", path, share_prefixes=False)).
    """
    from fastscore.backends.options import options_for

    cls = backend_class(name)
    if options is None:
        options = options_for(name, fields)
    elif fields:
        raise TypeError("pass either options or option fields, not both")
    return cls(Path(path), n_threads=n_threads, options=options, progress=progress)
