"""The embedded model's f32 GGUF: its shipped file dequantized by gguf-py (fastscore.conversion.gguf_dequantize),
built and checked as a cache variant of the pipeline, with no torch and no HF reference."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from fastscore import cache as artefact_cache
from fastscore.conversion import checks
from fastscore.conversion.pipeline import (DEQUANTIZED_MEAN_TOL, SHIPPED_VERIFIED, Stages, _tensor_count, _variant,
                                           tokenizer_dir)
from fastscore.resolve import GGUF_FILE, ModelSource


def dequantized_f32_file(source: ModelSource, stages: Stages) -> Path:
    """The shipped GGUF with every tensor dequantized to F32 by gguf-py (the same weights as the HF reference,
    which transformers dequantizes from the same file), checked tensor by tensor and on llama.cpp."""
    from fastscore.conversion.gguf_dequantize import check_dequantized, dequantize_gguf
    from fastscore.embedded import check_shipped

    shipped, quant = source.embedded_gguf, source.entry.embedded.quant
    tok = tokenizer_dir(source, stages)
    final = artefact_cache.variant_dir(source.key, "gguf-f32")

    def build(scratch: Path) -> checks.CheckReport:
        check_shipped(source.entry, shipped, artefact_cache.home() / source.key / SHIPPED_VERIFIED)
        started = time.perf_counter()
        stages.note(f"first use of the f32 default: dequantizing the shipped {quant.upper()} GGUF {shipped.name} to "
                    f"f32 with gguf-py, then checking it (once; cached in {final})")
        out = scratch / GGUF_FILE
        dequantize_gguf(shipped, out, progress=stages.enabled)
        structure = checks.gguf_structure(out, "f32", _tensor_count(shipped))
        structure = f"{structure}; {check_dequantized(shipped, out)}"
        # Scores against the shipped file on llama.cpp (no torch): they differ by the Q4_1 kernels' 8-bit
        # activations only, so the mean bound of the HF reference's own check applies.
        report = checks.compare("gguf-f32", "llamacpp", out, "f32", structure, tok, started=started,
                                reference=("llamacpp", shipped), reference_label=f"llamacpp on the shipped {quant} GGUF")
        return replace(report, statistic="mean", tolerance=DEQUANTIZED_MEAN_TOL,
                       passed=report.mean_abs_diff <= DEQUANTIZED_MEAN_TOL)

    return _variant(source, "gguf-f32", build, stages) / GGUF_FILE
