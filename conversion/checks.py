"""Read every converted artefact back and check it: it loads, its tensors are of the types asked for, and a few
teacher-forced log-probs agree with the fp32 HF reference (the reference backend) on the same token ids, within
the variant's limit in the variant table (fastscore.variants, where the measured limits are noted).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fastscore import variants
from fastscore.deps import require
from fastscore.errors import ConversionCheckError
from fastscore.records import TokenRequest

log = logging.getLogger(__name__)

K_QUANT_BLOCK = 256

# Two short chats in the shape the study scores: a program and a tool call as the assistant's reply.
PROBE_CHATS = (
    (
        {"role": "user", "content": "Write a Python function that returns the square of x."},
        {"role": "assistant", "content": "def square(x):\n    return x * x\n"},
    ),
    (
        {"role": "user", "content": "What's the weather in Paris today?"},
        {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'},
    ),
)


@dataclass(frozen=True)
class CheckReport:
    variant: str  # e.g. "gguf-q8_0"
    path: str
    backend: str
    structure: str  # what the read-back found, e.g. "272 tensors: 210 Q8_0, 62 F32"
    n_tokens: int  # scored tokens compared with the reference
    max_abs_diff: float  # nats
    mean_abs_diff: float
    statistic: str  # which of the two the tolerance bounds: "max" or "mean"
    tolerance: float
    passed: bool
    seconds: float
    reference: str = "reference backend on hf-fp32"

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"check {self.variant} [{self.backend}]: {self.structure}; {self.n_tokens} tokens vs {self.reference}: "
            f"max|d| {self.max_abs_diff:.2e}, mean|d| {self.mean_abs_diff:.2e} nats "
            f"({self.statistic} <= {self.tolerance:g}) {verdict} ({self.seconds:.1f} s)"
        )

    def save(self, folder: Path) -> None:
        (Path(folder) / "check.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, folder: Path) -> "CheckReport | None":
        path = Path(folder) / "check.json"
        return cls(**json.loads(path.read_text())) if path.is_file() else None


def probe_requests(tokenizer_dir: Path) -> list[TokenRequest]:
    """The probe chats rendered with the model's chat template and tokenized with its (rebuilt) tokenizer.

    Rendered by fastscore's own Jinja environment (transformers' rendering, without importing it: the f32 default
    is checked in the minimal install, which has no transformers)."""
    from fastscore.chat import render
    from fastscore.conversion.gguf_tokenizer import load_tokenizer
    from fastscore.tokenizer import Tokenizer

    facts = Tokenizer.from_folder(tokenizer_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    requests = []
    for chat in PROBE_CHATS:
        text = render(facts.require_chat_template(), list(chat), add_generation_prompt=False,
                      special_tokens=facts.special_token_variables)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        requests.append(TokenRequest(tokens=tuple(ids), score_from=1))
    return requests


# The checks measure the weights alone. llama.cpp's defaults move log-probs on the 135M model by themselves (measured
# on the f32 GGUF, max over the probe): f16 KV cache 0.013 nats, CPU flash attention 0.016 nats, both several times
# the f32 tolerance; with an f32 cache and no flash attention the f32 GGUF matches torch to 3e-5.
CHECK_BACKEND_OPTIONS: dict[str, dict] = {
    "llamacpp": {"kv_type": "f32", "flash_attn": "off", "decode_flash_attn": "off"},
}


def score(backend_name: str, path: Path, requests: list[TokenRequest]) -> np.ndarray:
    from fastscore.backends import load

    with load(backend_name, path, **CHECK_BACKEND_OPTIONS.get(backend_name, {})) as backend:
        scores = backend.score_tokens(requests)
    return np.concatenate([s.logprobs for s in scores]).astype(np.float64)


def compare(
    variant: str, backend_name: str, path: Path, quant: str, structure: str, tokenizer_dir: Path, *,
    reference: tuple[str, Path], reference_label: str = "reference backend on hf-fp32", started: float | None = None,
) -> CheckReport:
    """Score the probe with `backend_name` on `path` and with `reference` = (backend, path); same token ids."""
    started = time.perf_counter() if started is None else started
    requests = probe_requests(tokenizer_dir)
    try:
        want = score(reference[0], reference[1], requests)
        got = score(backend_name, path, requests)
    except FloatingPointError as exc:  # non-finite logits: NaN/inf weights in the variant or its reference
        raise ConversionCheckError(f"{variant} at {path} (or its reference {reference[1]}): {exc}") from exc
    if not np.isfinite(got).all():
        raise ConversionCheckError(f"{variant} at {path} produced non-finite log-probs")
    diff = np.abs(got - want)
    statistic, tolerance = variants.check_of(quant)
    measured = float(diff.max() if statistic == "max" else diff.mean())
    report = CheckReport(
        variant=variant, path=str(path), backend=backend_name, structure=structure, n_tokens=int(diff.size),
        max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()), statistic=statistic,
        tolerance=tolerance, passed=measured <= tolerance, seconds=time.perf_counter() - started,
        reference=reference_label,
    )
    log.debug("%s", report.line())
    return report


def gguf_structure(path: Path, quant: str, expected_tensors: int | None = None) -> str:
    """Read the GGUF back: its file type and tensor types must be those of `quant`."""
    gguf = require("gguf", "tokenizer")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file: GGUFReader raises ValueError/struct errors
        raise ConversionCheckError(f"{path} does not read as GGUF: {exc}") from exc
    types = Counter(t.tensor_type.name for t in reader.tensors)
    summary = f"{len(reader.tensors)} tensors: " + ", ".join(f"{n} {t}" for t, n in types.most_common())
    problems = []
    if expected_tensors is not None and len(reader.tensors) != expected_tensors:
        problems.append(f"{len(reader.tensors)} tensors, expected {expected_tensors}")
    field = reader.fields.get("general.file_type")
    file_type = gguf.LlamaFileType(int(field.contents())).name if field is not None else "missing"
    expected = variants.get("llamacpp", quant)
    if file_type != expected.file_type:
        problems.append(f"general.file_type is {file_type}, expected {expected.file_type}")
    main = expected.main_ggml_type
    if quant == "f32" and set(types) != {"F32"}:
        problems.append(f"not all tensors are F32: {dict(types)}")
    elif main not in types and not _k_quant_impossible(reader, quant):
        problems.append(f"no {main} tensor")
    if problems:
        raise ConversionCheckError(f"GGUF {path} ({summary}): " + "; ".join(problems))
    return summary


def _k_quant_impossible(reader, quant: str) -> bool:
    """k-quants need rows that are multiples of 256; llama.cpp falls back to other types for narrower models."""
    if not quant.startswith(("q6_k", "q5_k", "q4_k")):
        return False
    return not any(len(t.shape) >= 2 and int(t.shape[0]) % K_QUANT_BLOCK == 0 for t in reader.tensors)


def onnx_structure(folder: Path, quant: str) -> str:
    """Read the ONNX graph back: fp32 holds float32 weights only; int8 holds int8 weights and integer matmuls."""
    onnx = require("onnx", "onnx")
    model_file = Path(folder) / "model.onnx"
    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError / missing file
        raise ConversionCheckError(f"{model_file} does not load as ONNX: {exc}") from exc
    dtypes = Counter(onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer)
    ops = Counter(n.op_type for n in model.graph.node)
    quant_ops = {op: ops[op] for op in ("DynamicQuantizeLinear", "MatMulInteger", "QuantizeLinear", "DequantizeLinear")
                 if ops[op]}
    summary = f"{len(model.graph.node)} nodes, initializers " + ", ".join(f"{n} {t}" for t, n in dtypes.most_common())
    if quant == "fp32":
        if dtypes["FLOAT"] == 0 or any(dtypes[t] for t in ("FLOAT16", "BFLOAT16", "INT8", "UINT8")):
            raise ConversionCheckError(f"fp32 ONNX {model_file} does not hold float32 weights only: {summary}")
    else:
        if not (dtypes["INT8"] or dtypes["UINT8"]) or not quant_ops:
            raise ConversionCheckError(f"int8 ONNX {model_file} holds no int8 weights / quantised ops: {summary}")
        summary += ", " + ", ".join(f"{n} {op}" for op, n in quant_ops.items())
    return summary


def hf_structure(folder: Path) -> str:
    """Every floating tensor of the HF folder's safetensors is float32."""
    safetensors = require("safetensors", "reference")
    dtypes: Counter = Counter()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ConversionCheckError(f"no safetensors in {folder}")
    for file in files:
        with safetensors.safe_open(str(file), framework="np") as f:
            for name in f.keys():
                dtypes[str(f.get_slice(name).get_dtype())] += 1
    summary = f"{sum(dtypes.values())} tensors: " + ", ".join(f"{n} {t}" for t, n in dtypes.most_common())
    if set(dtypes) - {"F32", "I64", "I32", "BOOL"}:
        raise ConversionCheckError(f"HF folder {folder} is not fp32: {summary}")
    return summary
