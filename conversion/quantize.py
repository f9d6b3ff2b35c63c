"""GGUF -> GGUF of another type with llama.cpp's own quantizer (llama_model_quantize), written atomically."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from fastscore.errors import ArtefactUnavailableError, ConversionError, UnknownQuantError

log = logging.getLogger(__name__)

# qtype -> name of the llama_ftype constant in llama_cpp
QTYPES: dict[str, str] = {
    "f32": "LLAMA_FTYPE_ALL_F32",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
}


def quantize_gguf(src: Path, dst: Path, qtype: str, allow_requantize: bool = True,
                  n_threads: int | None = None) -> Path:
    """Write `src` re-encoded as `qtype` to `dst` and return dst.

    allow_requantize lets an already-quantized source be requantized (its weights are dequantized first, so the
    result carries both roundings). The output goes to a temporary file next to dst, moved into place only on
    success: an interrupted run never leaves a truncated GGUF behind.
    """
    if qtype not in QTYPES:
        raise UnknownQuantError(f"unknown GGUF type {qtype!r}; valid: {', '.join(QTYPES)}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise ArtefactUnavailableError(f"GGUF file not found: {src}")
    from fastscore.backends.llamacpp import llama_module

    L = llama_module()
    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, QTYPES[qtype])
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
