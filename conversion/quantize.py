"""GGUF -> GGUF of another type with llama.cpp's own quantizer (llama_model_quantize), written atomically."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from fastscore import variants
from fastscore.errors import ArtefactUnavailableError, ConversionError, UnknownQuantError
from fastscore.variants import gguf_types

log = logging.getLogger(__name__)

def quantize_gguf(src: Path, dst: Path, qtype: str, allow_requantize: bool = True,
                  n_threads: int | None = None) -> Path:
    """Write `src` re-encoded as `qtype` to `dst` and return dst.

    allow_requantize lets an already-quantized source be requantized (its weights are dequantized first, so the
    result carries both roundings). The output goes to a temporary file next to dst, moved into place only on
    success: an interrupted run never leaves a truncated GGUF behind.
    """
    if qtype not in gguf_types():
        raise UnknownQuantError(f"unknown GGUF type {qtype!r}; valid: {', '.join(gguf_types())}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise ArtefactUnavailableError(f"GGUF file not found: {src}")
    from fastscore.backends.llamacpp import llama_module

    L = llama_module()
    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, variants.get("llamacpp", qtype).llama_ftype)
    params.allow_requantize = allow_requantize
    params.nthread = n_threads or os.cpu_count() or 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".part", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        log.info("quantizing %s -> %s (%s)", src, dst, qtype)
        rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), L.byref(params))
        if rc != 0:
            hint = "" if allow_requantize else " (the source is quantized; pass allow_requantize=True)"
            raise ConversionError(f"llama.cpp could not quantize {src} to {qtype} (code {rc}){hint}")
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst
