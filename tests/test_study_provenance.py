"""A study's config.json and report.md say what produced them: fastscore, Python and library versions as installed,
the weights and their note; a resume under other versions records both and is not refused for it."""

from __future__ import annotations

import importlib.metadata
import json
import platform
from dataclasses import replace

import pytest

import fastscore
from fastscore.study.runner import StudyConfig, run_study

pytest.importorskip("llama_cpp")


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_config_and_report_record_the_versions_and_weights(tiny_model, study_data, tmp_path):
    out = tmp_path / "study"
    config = StudyConfig(model=str(tiny_model("llama")), quant="f32", envs=("tools",), limit=1, failures="seeded",
                         out_dir=out, data_dir=study_data, n_boot=20, max_new_tokens=4, threads=1)
    run_study(config)
    record = json.loads((out / "config.json").read_text())
    found = record["provenance"]
    assert found["fastscore_version"] == fastscore.__version__ and found["python"] == platform.python_version()
    for name in ("llama-cpp-python", "onnxruntime", "transformers", "torch", "numpy"):
        assert found["libraries"][name] == _installed(name)
    assert found["libraries"]["llama-cpp-python"] and found["libraries"]["numpy"]
    assert found["weights"].endswith(".gguf") and "f32" in found["weights_note"].lower()
    report = (out / "report.md").read_text()
    versions = report[report.index("## Versions"):].split("\n## ")[0]
    assert f"| fastscore | {fastscore.__version__} |" in versions
    assert f"| llama-cpp-python | {found['libraries']['llama-cpp-python']} |" in versions
    assert found["weights_note"] in versions

    # A resume under other versions is not refused for it: config.json keeps the first run's and adds its own.
    record["provenance"] = {**found, "fastscore_version": "0.0.1", "libraries": {**found["libraries"], "numpy": "1.0"}}
    (out / "config.json").write_text(json.dumps(record))
    run_study(replace(config, resume=True))
    again = json.loads((out / "config.json").read_text())
    assert again["provenance"]["fastscore_version"] == "0.0.1"
    assert [p["fastscore_version"] for p in again["resumed_with"]] == [fastscore.__version__]
    versions = (out / "report.md").read_text().split("## Versions")[1].split("\n## ")[0]
    assert "| fastscore | 0.0.1 | " + fastscore.__version__ + " |" in versions and "| started | resumed (" in versions
    # Resuming again with the same versions records nothing new.
    run_study(replace(config, resume=True))
    assert len(json.loads((out / "config.json").read_text())["resumed_with"]) == 1
