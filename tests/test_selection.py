"""One model selection (fastscore.selection.ModelSelection): each kind of model reference resolves to the artefact
it means, names are checked before anything loads, and the study on a local GGUF takes the file's own type."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fastscore import registry
from fastscore.backends.options import LlamaCppOptions, options_for
from fastscore.cli import main
from fastscore.errors import (ArtefactUnavailableError, RequestError, UnknownModelError, UnknownQuantError,
                              UnsupportedError)
from fastscore.selection import ModelSelection

pytest.importorskip("gguf")
DEFAULT = registry.default_model()
HEAVY = ("llama_cpp", "torch", "transformers", "onnxruntime", "onnx", "optimum")


@pytest.fixture(scope="module")
def tiny_q8_gguf(tiny_artefact):
    """A local GGUF file whose type (q8_0) is not the llama.cpp default (f32)."""
    return tiny_artefact("llama", "llamacpp", "q8_0").path


def test_a_registry_name_and_its_hub_id_select_the_same_model():
    by_name = ModelSelection.resolve(DEFAULT)
    by_hub_id = ModelSelection.resolve(registry.get(DEFAULT).hub_id)
    assert (by_name.model, by_name.backend, by_name.quant) == (DEFAULT, "llamacpp", "f32")
    assert by_hub_id.source.entry == by_name.source.entry and by_hub_id.source.key == by_name.source.key
    assert ModelSelection.resolve() == by_name  # no model: the registry's default
    assert ModelSelection.resolve(DEFAULT, "onnx").quant == "fp32"


def test_a_local_gguf_selects_the_file_itself_at_its_own_type(tiny_q8_gguf):
    selection = ModelSelection.resolve(str(tiny_q8_gguf))
    assert selection.quant == "q8_0" and selection.source.local_gguf == tiny_q8_gguf.resolve()
    assert selection.artefact().path == tiny_q8_gguf.resolve()
    # The name check happens when selecting, before any artefact is built or any output touched.
    with pytest.raises(UnknownQuantError, match="holds q8_0 weights.*--quant q8_0"):
        ModelSelection.resolve(str(tiny_q8_gguf), quant="f32")
    with pytest.raises(UnsupportedError, match="llamacpp backend only"):
        ModelSelection.resolve(str(tiny_q8_gguf), "onnx")


def test_a_local_hf_folder_selects_its_converted_variant(tiny_model, tiny_artefact):
    folder = tiny_model("llama")
    selection = ModelSelection.resolve(str(folder))
    assert selection.quant == "f32" and selection.source.local_dir == folder.resolve()
    assert selection.artefact().path == tiny_artefact("llama", "llamacpp", "f32").path


def test_a_hub_id_outside_the_registry_is_selected_but_not_fetched_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    selection = ModelSelection.resolve("example-org/not-cached-model")  # selecting downloads nothing
    assert selection.source.hub_repo == "example-org/not-cached-model" and selection.source.entry is None
    with pytest.raises(ArtefactUnavailableError, match="HF_HUB_OFFLINE"):
        selection.artefact()


def test_unknown_names_are_refused_when_selecting():
    with pytest.raises(UnknownModelError):
        ModelSelection.resolve("smollm2-135m-instructt")
    with pytest.raises(UnknownQuantError):
        ModelSelection.resolve(DEFAULT, "onnx", "q4_1")
    with pytest.raises(RequestError, match="no option"):
        ModelSelection.resolve(DEFAULT, backend_options={"no_such_option": 1})


def test_backend_options_mean_the_same_in_every_form():
    """The CLI's key=value strings, the API's mapping and a typed record (the bench's) give one record."""
    forms = [["kv_type=f16", "n_ctx=512"], {"kv_type": "f16", "n_ctx": 512}, {"kv_type": "f16", "n_ctx": "512"},
             options_for("llamacpp", {"kv_type": "f16", "n_ctx": 512})]
    records = {ModelSelection.resolve(DEFAULT, backend_options=form).options for form in forms}
    assert records == {LlamaCppOptions(kv_type="f16", n_ctx=512)}
    via_n_ctx = [ModelSelection.resolve(DEFAULT, backend_options=form, n_ctx=512).options
                 for form in (["kv_type=f16"], {"kv_type": "f16"}, options_for("llamacpp", {"kv_type": "f16"}))]
    assert set(via_n_ctx) == records
    assert ModelSelection.resolve(DEFAULT).options == LlamaCppOptions()
    with pytest.raises(RequestError):
        ModelSelection.resolve(DEFAULT, "onnx", n_ctx=512)  # ONNX Runtime has no context size to set


def test_selecting_and_resolving_a_built_artefact_loads_no_backend_library(tiny_q8_gguf, tiny_model, tiny_artefact):
    tiny_artefact("llama", "llamacpp", "f32")  # built here, so the child only finds it
    script = f"""
import json, sys
from fastscore.selection import ModelSelection
paths = [str(ModelSelection.resolve(ref).artefact().path)
         for ref in ({DEFAULT!r}, {str(tiny_q8_gguf)!r}, {str(tiny_model("llama"))!r})]
print(json.dumps({{"paths": paths, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.splitlines()[-1])
    print(report)
    assert report["heavy"] == []
    assert report["paths"][1:] == [str(tiny_q8_gguf.resolve()), str(tiny_artefact("llama", "llamacpp", "f32").path)]


def test_the_study_on_a_local_gguf_without_quant_runs_at_the_files_type(tiny_q8_gguf, study_data, tmp_path):
    args = ["study", "--model", str(tiny_q8_gguf), "--env", "tools", "--limit", "1", "--failures", "seeded",
            "--data", str(study_data), "--threads", "2"]
    refused = CliRunner().invoke(main, [*args, "--quant", "f32", "--out", str(tmp_path / "refused")])
    print(refused.output)
    assert refused.exit_code != 0 and "holds q8_0 weights" in refused.output and "--quant q8_0" in refused.output
    assert not (tmp_path / "refused").exists()  # refused before the study touched --out
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "study")])
    print(result.output)
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "study" / "config.json").read_text())
    assert (config["model"], config["quant"]) == (str(tiny_q8_gguf), "q8_0")


def test_the_former_names_still_work_and_say_so():
    import fastscore
    from fastscore.session import open_scorer

    assert fastscore.Session is fastscore.OpenModel  # the API's open model under its former name
    with pytest.warns(DeprecationWarning, match="ModelSelection"), pytest.raises(UnknownModelError):
        open_scorer("smollm2-135m-instructt", "llamacpp", "f32")  # checked by the selection, as every opener is
