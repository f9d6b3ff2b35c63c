"""The f32 default from the shipped Q4_1 GGUF, dequantized in numpy (gguf-py): same weights, no torch.

Synthetic GGUFs check the copy itself (every metadata byte, every tensor's values, the F32 file type, a damaged copy
refused); the embedded model checks parity with the old route (llama.cpp's own requantizer, bit for bit, and the
scores), and that the llama.cpp default route imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from fastscore.conversion.gguf_dequantize import check_dequantized, dequantize_gguf, dequantize_tensor  # noqa: E402
from fastscore.errors import ConversionCheckError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "tool_calls.jsonl"


def _quantized_gguf(path: Path) -> dict[str, np.ndarray]:
    """A small llama-like GGUF: Q4_1, Q8_0 and F32 tensors, string arrays with non-ASCII tokens, scalars."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_1))
    writer.add_uint32("llama.block_count", 1)
    writer.add_float32("llama.rope.freq_base", 100000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["<|endoftext|>", "Ġhello", "é", "Ċ"])
    writer.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1])
    writer.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")
    originals = {"token_embd.weight": rng.normal(size=(8, 64)).astype(np.float32),
                 "blk.0.ffn_up.weight": rng.normal(size=(4, 96)).astype(np.float32),
                 "output_norm.weight": rng.normal(size=(64,)).astype(np.float32)}
    types = {"token_embd.weight": gguf.GGMLQuantizationType.Q8_0,
             "blk.0.ffn_up.weight": gguf.GGMLQuantizationType.Q4_1,
             "output_norm.weight": gguf.GGMLQuantizationType.F32}
    for name, values in originals.items():
        qtype = types[name]
        data = gguf.quants.quantize(values, qtype)
        writer.add_tensor(name, data, raw_dtype=None if qtype.name == "F32" else qtype)  # bytes: shape from them
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return originals


def test_dequantized_copy_keeps_metadata_and_values(tmp_path):
    src, dst = tmp_path / "q.gguf", tmp_path / "f32.gguf"
    originals = _quantized_gguf(src)
    dequantize_gguf(src, dst, progress=False)
    source, written = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(dst))
    assert int(written.fields["general.file_type"].contents()) == int(gguf.LlamaFileType.ALL_F32)
    assert written.fields["tokenizer.ggml.tokens"].contents() == ["<|endoftext|>", "Ġhello", "é", "Ċ"]
    assert written.fields["tokenizer.chat_template"].contents() == source.fields["tokenizer.chat_template"].contents()
    assert written.fields["llama.rope.freq_base"].contents() == pytest.approx(100000.0)
    by_name = {t.name: t for t in written.tensors}
    worst = 0.0
    for tensor in source.tensors:
        out = by_name[tensor.name]
        assert out.tensor_type == gguf.GGMLQuantizationType.F32 and list(out.shape) == list(tensor.shape)
        got = np.asarray(out.data, dtype=np.float32).reshape(originals[tensor.name].shape)
        assert np.array_equal(got, dequantize_tensor(tensor, gguf))  # exactly the source's dequantized values
        worst = max(worst, float(np.abs(got - originals[tensor.name]).max()))
    print(f"max |dequantized - original| over the synthetic tensors (the quantization error): {worst:.3g}")
    assert 0 < worst < 0.5  # Q4_1 / Q8_0 rounding: close to the originals, not equal
    assert "all F32" in check_dequantized(src, dst)


def test_damaged_copy_is_refused(tmp_path):
    src, dst = tmp_path / "q.gguf", tmp_path / "f32.gguf"
    _quantized_gguf(src)
    dequantize_gguf(src, dst, progress=False)
    tensor = next(t for t in gguf.GGUFReader(str(dst)).tensors if t.name == "blk.0.ffn_up.weight")
    with open(dst, "r+b") as fh:  # one float of one tensor changed
        fh.seek(tensor.data_offset + 8)
        fh.write(np.float32(123.0).tobytes())
    with pytest.raises(ConversionCheckError, match="blk.0.ffn_up.weight differs"):
        check_dequantized(src, dst)


# ---------------------------------------------------------------- the embedded model


@pytest.fixture(scope="module")
def f32_artefact(smollm_artefact):
    return smollm_artefact("llamacpp", "f32")


# Slow (llama.cpp's requantizer writes a second f32 copy of the 135M, both are read tensor by tensor and scored): the
# route's equality with the old one is settled; the default suite keeps the dequantizer's values and metadata on a
# crafted file (above), the route without torch (below), and the f32 file's parity with the reference
# (test_parity.py).
@pytest.mark.slow
def test_f32_default_is_the_old_routes_file_bit_for_bit(f32_artefact, smollm_artefact, tmp_path):
    """The old route requantized the shipped file to f32 with llama.cpp's own quantizer: same tensors, bit for bit,
    and the same scores on the examples."""
    from fastscore.conversion.quantize import quantize_gguf
    from fastscore.selection import ModelSelection
    from fastscore.requests_io import read_requests

    shipped = smollm_artefact("llamacpp", "q4_1").path
    old = quantize_gguf(shipped, tmp_path / "old-f32.gguf", "f32", allow_requantize=True)
    new_tensors = {t.name: t for t in gguf.GGUFReader(str(f32_artefact.path)).tensors}
    worst = 0.0
    for tensor in gguf.GGUFReader(str(old)).tensors:
        mine = new_tensors.pop(tensor.name)
        assert mine.tensor_type == tensor.tensor_type == gguf.GGMLQuantizationType.F32
        worst = max(worst, float(np.abs(np.asarray(mine.data, np.float64) - np.asarray(tensor.data, np.float64)).max()))
    assert not new_tensors
    print(f"max |tensor difference| new vs old f32 GGUF: {worst}")
    assert worst == 0.0

    from fastscore.backends import load
    from fastscore.tokenizer import Tokenizer

    sets = [r.candidate_set() for r in read_requests(EXAMPLES)]
    with ModelSelection.resolve("smollm2-135m-instruct", "llamacpp", "f32").open() as scorer:
        new = [r.logprob for s in scorer.score_candidates(sets) for r in s.results]
    from fastscore.scorer import Scorer

    with Scorer(load("llamacpp", old), Tokenizer.from_folder(f32_artefact.tokenizer_dir)) as scorer:
        before = [r.logprob for s in scorer.score_candidates(sets) for r in s.results]
    diff = float(np.max(np.abs(np.array(new) - np.array(before))))
    print(f"max |score difference| new vs old f32 GGUF over {len(new)} candidates: {diff:.3g} nats")
    assert diff <= 2e-3


@pytest.mark.slow
def test_f32_default_matches_the_reference_backend(f32_artefact, smollm_artefact):
    """The reference weights (transformers' dequantization of the same file, on torch) score alike."""
    pytest.importorskip("torch")
    from fastscore.selection import ModelSelection
    from fastscore.requests_io import read_requests

    sets = [r.candidate_set() for r in read_requests(EXAMPLES)]
    scores = {}
    for backend, quant in (("llamacpp", "f32"), ("reference", "fp32")):
        with ModelSelection.resolve("smollm2-135m-instruct", backend, quant).open() as scorer:
            scores[backend] = np.array([t for s in scorer.score_candidates(sets) for r in s.results
                                        for t in r.token_logprobs])
    diff = float(np.max(np.abs(scores["llamacpp"] - scores["reference"])))
    print(f"max |per-token difference| f32 GGUF (gguf-py) vs reference backend: {diff:.3g} nats "
          f"over {scores['llamacpp'].size} tokens")
    assert diff <= 2e-3


# The llama.cpp default route, run as the CLI runs it, with torch and transformers made unimportable.
_NO_TORCH = """
import sys
BLOCKED = ("torch", "transformers", "accelerate", "optimum", "onnxruntime")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked by the test: {name}")
        return None
sys.meta_path.insert(0, Block())
import fastscore
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED], "import fastscore imported a framework"
from fastscore.cli import main
sys.argv = ["fastscore", *sys.argv[1:]]
try:
    main()
finally:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print("FRAMEWORKS", loaded, file=sys.stderr)
"""


def test_default_route_imports_no_torch(f32_artefact, tmp_path):
    out = tmp_path / "scores.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, "score", str(EXAMPLES), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    print(proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FRAMEWORKS []" in proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and all(np.isfinite(c["logprob"]) for r in rows for c in r["candidates"])
