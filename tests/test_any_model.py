"""--model beyond the registry: a local GGUF file scored as it is, a hub id (a clear error offline), --n-ctx."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import fastscore
from fastscore.cli import main
from fastscore.errors import ContextTooLongError, UnknownQuantError, UnsupportedError
from fastscore.resolve import gguf_quant, resolve

pytest.importorskip("llama_cpp")
REQUEST = {"messages": [{"role": "user", "content": "Name a colour."}], "candidates": ["Blue", "Red sky"]}


@pytest.fixture(scope="module")
def tiny_gguf(tiny_artefact):
    return tiny_artefact("llama", "llamacpp", "f32").path


def test_a_local_gguf_file_scores_like_the_checkpoint_it_was_made_from(tiny_gguf, tiny_model):
    assert gguf_quant(tiny_gguf) == "f32"
    with fastscore.load(str(tiny_gguf), threads=2) as by_file:  # its quant is read from the file
        assert by_file.quant == "f32" and "local GGUF" in by_file.weights_note
        [from_file] = by_file.score_many([REQUEST])
    with fastscore.load(str(tiny_model("llama")), quant="f32", threads=2) as by_folder:
        [from_folder] = by_folder.score_many([REQUEST])
    for a, b in zip(from_file.results, from_folder.results, strict=True):
        assert a.token_ids == b.token_ids  # the tokenizer rebuilt from the GGUF's metadata gives the same ids
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-6)


def test_a_local_gguf_is_refused_at_another_quant_or_backend(tiny_gguf):
    with pytest.raises(UnknownQuantError, match="holds f32 weights"):
        resolve(str(tiny_gguf), "llamacpp", "q8_0")
    with pytest.raises(UnsupportedError, match="llamacpp backend only"):
        resolve(str(tiny_gguf), "onnx", "fp32")


def test_the_context_size_can_be_set(tiny_gguf):
    long = {"messages": [{"role": "user", "content": "colour " * 600}], "candidates": ["Blue"]}
    with fastscore.load(str(tiny_gguf), threads=2, backend_options={"n_ctx": 512}) as small:
        with pytest.raises(ContextTooLongError, match="context of 512 tokens"):
            small.score_many([long])
    with fastscore.load(str(tiny_gguf), threads=2, backend_options={"n_ctx": 1024}) as larger:
        assert larger.score_many([long])[0].results[0].n_tokens == 2


def test_a_hub_id_outside_the_registry_fails_clearly_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    requests = tmp_path / "r.jsonl"
    requests.write_text(json.dumps({"id": 1, **REQUEST}) + "\n")
    result = CliRunner().invoke(main, ["score", str(requests), "--out", str(tmp_path / "o.jsonl"), "--model",
                                       "example-org/not-cached-model", "--quant", "f32"])
    print(result.output)
    assert result.exit_code == 4
    assert "example-org/not-cached-model" in result.output and "HF_HUB_OFFLINE" in result.output
