"""The one variant table and the typed backend options: what every reader of them relies on (no model needed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fastscore import variants
from fastscore.backends import BACKENDS
from fastscore.backends.options import LlamaCppOptions, OnnxOptions, options_for, parse_options
from fastscore.cli import main
from fastscore.errors import RequestError, UnknownBackendError, UnknownQuantError
from fastscore.variants import default_quant


def test_every_backend_has_variants_and_a_full_precision_default():
    assert set(variants.backends()) == set(BACKENDS)
    for backend in variants.backends():
        assert variants.FULL_PRECISION[backend] in variants.quants(backend)
    assert variants.get("llamacpp", "q4_1").folder == "gguf-q4_1"
    assert variants.variant_name("onnx", "int8") == "onnx-int8" and variants.REFERENCE.folder == "hf-fp32"
    with pytest.raises(UnknownQuantError, match="Valid: fp32, int8"):
        variants.get("onnx", "q4_1")
    with pytest.raises(UnknownBackendError, match="Did you mean"):
        variants.get("llamacp", "f32")


def test_gguf_rows_carry_what_conversion_and_checks_read():
    gguf = [v for v in variants.VARIANTS if v.backend == "llamacpp"]
    assert all(v.llama_ftype == f"LLAMA_FTYPE_{v.file_type}" and v.main_ggml_type for v in gguf)
    assert [v.quant for v in gguf if v.from_converter] == ["f32", "f16"]
    assert variants.check_of("fp32") == variants.get("onnx", "fp32").check == variants.REFERENCE.check


def test_default_quant_follows_the_backend():
    # Full precision (batch-invariant) even for the embedded model, whose shipped file is q4_1.
    assert default_quant("smollm2-135m-instruct", "llamacpp") == "f32"
    assert default_quant("smollm2-135m-instruct", "onnx") == "fp32"
    assert default_quant("smollm2-135m-instruct", "reference") == "fp32"


def test_cli_help_lists_exactly_the_table():
    out = CliRunner().invoke(main, ["convert", "--help"]).output
    assert variants.help_list("llamacpp") in out.replace("\n", "").replace(" ", "")


def test_backend_options_are_typed_and_checked():
    assert options_for("llamacpp", {"n_ctx": 512}) == LlamaCppOptions(n_ctx=512)
    assert parse_options("onnx", ["share_prefixes=false", "prefix-chunk=64"]) == OnnxOptions(
        prefix_chunk=64, share_prefixes=False)
    assert parse_options("llamacpp", ["kv_type=f16", "max_group_tokens=2048"]) == LlamaCppOptions(
        kv_type="f16", max_group_tokens=2048)
    with pytest.raises(RequestError, match="has no option nctx"):
        parse_options("llamacpp", ["nctx=512"])
    with pytest.raises(RequestError, match="of type int"):
        parse_options("llamacpp", ["n_ctx=big"])
    with pytest.raises(RequestError, match="kv_type"):
        LlamaCppOptions(kv_type="f8")
    with pytest.raises(RequestError):
        parse_options("reference", ["threads=2"])


def test_meta_json_claims_batch_invariance_only_where_it_was_measured_within_the_tolerance():
    from fastscore.provenance import batch_invariance

    def dependent(backend, quant, options=None):
        return batch_invariance(backend, quant, options)["batch_dependent"]

    f32 = variants.get("llamacpp", "f32")
    assert f32.batch_max_diff is not None and f32.batch_max_diff <= variants.BATCH_INVARIANCE_TOL
    assert dependent("llamacpp", "f32") is False
    assert dependent("llamacpp", "f32", LlamaCppOptions(n_ctx=8192, max_group_tokens=64)) is False  # layout only
    assert dependent("llamacpp", "f32", LlamaCppOptions(kv_type="f16")) is None  # other arithmetic: not measured
    assert dependent("llamacpp", "q4_1") is True
    assert dependent("llamacpp", "q8_0") is None and dependent("onnx", "fp32") is None
    assert dependent("reference", "fp32") is False  # every request alone
    record = batch_invariance("llamacpp", "f32")
    assert record["batch_tolerance"] == variants.BATCH_INVARIANCE_TOL
    assert record["batch_max_abs_diff_measured"] == f32.batch_max_diff
