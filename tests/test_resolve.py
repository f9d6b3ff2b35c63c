"""The resolver: typed errors for bad names, the shipped file as is, atomic and instant-on-rerun conversions."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from fastscore import cache
from fastscore.cli import main
from fastscore.conversion import pipeline
from fastscore.embedded import embedded_gguf
from fastscore.errors import ArtefactUnavailableError, UnknownBackendError, UnknownModelError, UnknownQuantError
from fastscore.registry import all_models, default_model, get
from fastscore.resolve import local_key, local_variants, resolve


def test_unknown_model_suggests_the_closest_and_lists_all():
    with pytest.raises(UnknownModelError) as err:
        resolve("smollm2-135m-instrct", "llamacpp", "q4_1")
    message = str(err.value)
    print(message)
    assert "Did you mean 'smollm2-135m-instruct'?" in message
    assert all(entry.name in message for entry in all_models())


def test_unknown_quant_lists_the_valid_ones():
    with pytest.raises(UnknownQuantError) as err:
        resolve(default_model(), "llamacpp", "q3_k")
    print(err.value)
    for quant in ("f32", "f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q4_1"):
        assert quant in str(err.value)
    with pytest.raises(UnknownQuantError, match="Valid: fp32, int8"):
        resolve(default_model(), "onnx", "q8_0")
    with pytest.raises(UnknownQuantError, match="Valid: fp32"):
        resolve(default_model(), "reference", "int8")


def test_unknown_backend():
    with pytest.raises(UnknownBackendError, match="Did you mean 'onnx'"):
        resolve(default_model(), "onnxx", "fp32")


def test_hub_only_model_that_is_not_local_says_how_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTSCORE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the test must not depend on the hub, reachable or not
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ArtefactUnavailableError) as err:
        resolve("qwen2.5-0.5b-instruct", "llamacpp", "q8_0", progress=False)
    message = str(err.value)
    print(message)
    assert "Qwen/Qwen2.5-0.5B-Instruct" in message and "--hf-path DIR" in message
    assert "'tokenizer' variant" in message
    assert local_variants("qwen2.5-0.5b-instruct") == []


def test_a_folder_without_config_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ArtefactUnavailableError, match="no config.json"):
        resolve(default_model(), "reference", "fp32", hf_path=tmp_path)


def test_embedded_q4_1_is_the_shipped_file(smollm_artefact):
    artefact = smollm_artefact("llamacpp", "q4_1")
    assert artefact.path == embedded_gguf(get(default_model()))
    assert "shipped" in artefact.weights_note
    assert (artefact.tokenizer_dir / "tokenizer.json").is_file()


def test_local_key_depends_on_path_and_config(tmp_path):
    a, b = tmp_path / "a" / "model", tmp_path / "b" / "model"
    for folder in (a, b):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "llama"}')
    assert local_key(a) == local_key(a) != local_key(b)
    assert local_key(a).startswith("model-")
    before = local_key(a)
    (a / "config.json").write_text('{"model_type": "qwen2"}')
    assert local_key(a) != before


def test_a_failed_conversion_leaves_nothing_and_a_finished_one_is_reused(tiny_model, tmp_path, monkeypatch):
    source = shutil.copytree(tiny_model("llama"), tmp_path / "tiny-llama")
    monkeypatch.setenv("FASTSCORE_HOME", str(tmp_path / "home"))
    real = pipeline.save_fp32_copy
    calls = []

    def fails_once_after_writing(origin, out_dir, tokenizer):
        calls.append(out_dir)
        real(origin, out_dir, tokenizer)  # the weights are written...
        if len(calls) == 1:
            raise RuntimeError("killed midway")  # ...then the conversion dies before completing

    monkeypatch.setattr(pipeline, "save_fp32_copy", fails_once_after_writing)
    with pytest.raises(RuntimeError, match="killed midway"):
        resolve(str(source), "reference", "fp32", progress=False)
    model_home = cache.home() / local_key(source)
    assert not cache.is_complete(model_home / "hf-fp32")
    assert not (model_home / "hf-fp32").exists() and not list(model_home.glob(".tmp-*"))
    assert local_variants(str(source)) == ["tokenizer"]

    artefact = resolve(str(source), "reference", "fp32", progress=False)
    assert len(calls) == 2 and cache.is_complete(artefact.path)
    assert (artefact.path / "check.json").is_file()
    again = resolve(str(source), "reference", "fp32", progress=False)
    assert len(calls) == 2 and again == artefact
    assert local_variants(str(source)) == ["hf-fp32", "tokenizer"]


def test_models_list_shows_the_registry_and_the_embedded_model():
    result = CliRunner().invoke(main, ["models", "list"])
    print(result.output)
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 + len(all_models())
    embedded = next(line for line in lines if line.startswith(default_model()))
    assert "yes (q4_1)" in embedded and "gguf-q4_1 (shipped)" in embedded
    assert sum("yes (q4_1)" in line for line in lines) == 1


def test_convert_rejects_an_unknown_type_with_its_exit_code():
    result = CliRunner().invoke(main, ["convert", default_model(), "--gguf", "q9_9"])
    assert result.exit_code == UnknownQuantError.exit_code
    assert "Valid: f32, f16, q8_0" in result.output
