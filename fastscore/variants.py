"""The one table of weights variants: every (backend, quant) fastscore can build, check, score and benchmark.

Resolution, the model selection's defaults, conversion (llama.cpp's converter and quantizer, the ONNX export), the
read-back checks, the quant check, the bench and the CLI help all read this table; adding a type is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastscore.errors import UnknownBackendError, UnknownQuantError
from fastscore.registry import suggest

# The batch-invariance tolerance (nats per scored token): how far a token's log-prob may move when the same requests
# are scored in another batching (chunk size, trie groups, micro-batches, order, sharing). The one value every test,
# check and meta.json use. Why not 0: llama.cpp sums a token's attention over the KV cells in SIMD lanes, and which
# lane a cell falls into depends on where the batching put it, so float32 rounding differs (docs/exactness.md).
BATCH_INVARIANCE_TOL = 1e-4


@dataclass(frozen=True)
class Variant:
    backend: str
    quant: str
    cache_prefix: str  # the variant's cache folder is f"{cache_prefix}-{quant}"
    # Read-back check against the fp32 reference: (statistic over per-token |diff|, limit in nats).
    check: tuple[str, float]
    llama_ftype: str | None = None  # llama_cpp's LLAMA_FTYPE_* constant (GGUF only)
    file_type: str | None = None  # the GGUF's general.file_type name
    main_ggml_type: str | None = None  # the tensor type the GGUF quant is named after (k-quant mixes hold others)
    from_converter: bool = False  # written by llama.cpp's converter itself; other GGUF types are quantized from f32
    in_bench: bool = False  # measured by `fastscore bench throughput` by default
    in_quant_check: bool = False  # compared with the reference by `fastscore bench quant` by default
    full_precision: bool = False  # the backend's full-precision type: what a model is scored at by default
    # The largest |log-prob change| (nats per token) measured between batchings of the same requests on the 135M
    # (docs/exactness.md says how); None where not measured. meta.json reports it.
    batch_max_diff: float | None = None

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.quant}"

    @property
    def folder(self) -> str:
        return f"{self.cache_prefix}-{self.quant}"


def _gguf(quant: str, check: tuple[str, float], ftype: str, ggml: str, *, converter: bool = False,
          bench: bool = True, **measured) -> Variant:
    return Variant("llamacpp", quant, "gguf", check, llama_ftype=f"LLAMA_FTYPE_{ftype}", file_type=ftype,
                   main_ggml_type=ggml, from_converter=converter, in_bench=bench, in_quant_check=True, **measured)


# Check limits measured on the embedded 135M model (116 probe tokens; its reference is the dequantized Q4_1 weights,
# so the requantized variants stack a second rounding on the first), llama.cpp with an f32 KV cache and no flash
# attention: f32 max 3.1e-5 | f16 max 0.035 | q8_0 max 0.56, mean 0.084 | q6_k mean 0.15 | q5_k_m mean 0.51 |
# q4_k_m mean 0.45 | q4_0 mean 0.80 | shipped q4_1 mean 0.072; ONNX fp32 max ~6e-6 (tiny models).
# q8_0 also quantises activations to 8 bits in llama.cpp, so single tokens move by ~0.5 nats: its mean is bounded.
# Batch dependence: max |log-prob change| per token between --chunk-size 1 and 2, 3, 8, 17, 64 on the 135M (18 lines
# of examples/tool_calls.jsonl; tests/test_exact_default.py, docs/exactness.md has the command and the per-size values).
F32_BATCH = 1.35e-5
Q41_BATCH = 0.63
VARIANTS: tuple[Variant, ...] = (
    _gguf("f32", ("max", 2e-3), "ALL_F32", "F32", converter=True, full_precision=True, batch_max_diff=F32_BATCH),
    _gguf("f16", ("max", 0.1), "MOSTLY_F16", "F16", converter=True),
    _gguf("q8_0", ("mean", 0.25), "MOSTLY_Q8_0", "Q8_0"),
    _gguf("q6_k", ("mean", 1.0), "MOSTLY_Q6_K", "Q6_K", bench=False),
    _gguf("q5_k_m", ("mean", 1.0), "MOSTLY_Q5_K_M", "Q5_K", bench=False),
    _gguf("q4_k_m", ("mean", 1.0), "MOSTLY_Q4_K_M", "Q4_K"),
    _gguf("q4_0", ("mean", 1.0), "MOSTLY_Q4_0", "Q4_0"),
    _gguf("q4_1", ("mean", 1.0), "MOSTLY_Q4_1", "Q4_1", batch_max_diff=Q41_BATCH),
    Variant("onnx", "fp32", "onnx", ("max", 2e-3), in_bench=True, in_quant_check=True, full_precision=True),
    Variant("onnx", "int8", "onnx", ("mean", 1.0), in_bench=True, in_quant_check=True),
    Variant("reference", "fp32", "hf", ("max", 2e-3), full_precision=True),
)
# Full precision per backend: what a model without a shipped file is scored at unless told otherwise.
FULL_PRECISION = {v.backend: v.quant for v in VARIANTS if v.full_precision}
REFERENCE = next(v for v in VARIANTS if v.backend == "reference")


def backends() -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.backend for v in VARIANTS))


def check_backend(backend: str) -> None:
    """UnknownBackendError with a suggestion unless `backend` is one the table offers."""
    known = sorted(backends())
    if backend not in known:
        raise UnknownBackendError(f"unknown backend {backend!r}.{suggest(backend, known)} "
                                  f"Known backends: {', '.join(known)}")


def quants(backend: str) -> tuple[str, ...]:
    return tuple(v.quant for v in VARIANTS if v.backend == backend)


def get(backend: str, quant: str) -> Variant:
    """The variant, or UnknownBackendError / UnknownQuantError with a suggestion."""
    check_backend(backend)
    for variant in VARIANTS:
        if variant.backend == backend and variant.quant == quant:
            return variant
    valid = quants(backend)
    raise UnknownQuantError(f"unknown quant {quant!r} for backend {backend!r}.{suggest(quant, list(valid))} "
                            f"Valid: {', '.join(valid)}")


def validate(backend: str, quant: str) -> None:
    get(backend, quant)


def variant_name(backend: str, quant: str) -> str:
    return get(backend, quant).folder


def check_of(quant: str) -> tuple[str, float]:
    """The read-back check of a quant (the same on every backend that offers it)."""
    checks = {v.check for v in VARIANTS if v.quant == quant}
    if len(checks) != 1:
        raise UnknownQuantError(f"no single read-back check for quant {quant!r}")
    return checks.pop()


def gguf_types() -> tuple[str, ...]:
    return quants("llamacpp")


def help_list(backend: str) -> str:
    """'f32,f16,...' for option help texts."""
    return ",".join(quants(backend))


DEFAULT_BACKEND = "llamacpp"


def default_quant(model: str, backend: str = DEFAULT_BACKEND) -> str:
    """The backend's full-precision type, for every model: the batch-invariant one (a token's log-prob does not
    depend on what shares its call), so a score never depends on the grouping. For the embedded model the llama.cpp
    f32 GGUF is derived from the shipped Q4_1 file (converted once, cached); the shipped file stays available as
    quant "q4_1". The type does not depend on `model`."""
    validate(backend, FULL_PRECISION.get(backend, ""))
    return FULL_PRECISION[backend]
