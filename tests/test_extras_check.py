"""Every command checks its pip extras before any work starts, and names the pip line (exit code 3).

A missing package is simulated the way Python sees one: sys.modules[name] = None makes its import fail. The work
each command would start is replaced by an instrumented stand-in that records whether it was reached.
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from fastscore import deps
from fastscore.cli import main
from fastscore.errors import MissingDependencyError

MISSING_EXIT = MissingDependencyError.exit_code


@pytest.fixture
def work_started(monkeypatch):
    """Records any call into the work the commands delegate to (none may happen when an extra is missing)."""
    calls = []

    def stand_in(name):
        def record(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} started although an extra is missing")
        return record

    import fastscore.bench.run as bench_run
    import fastscore.conversion.pipeline as pipeline
    import fastscore.score_run as score_run
    import fastscore.selection as selection
    import fastscore.study.quantcheck.run as quant_run
    import fastscore.study.report.html as report_html
    import fastscore.study.runner as runner
    import fastscore.sweep.run as sweep_run

    monkeypatch.setattr(selection.ModelSelection, "open", stand_in("open"))
    monkeypatch.setattr(score_run, "run_score", stand_in("run_score"))
    monkeypatch.setattr(runner, "run_study", stand_in("run_study"))
    monkeypatch.setattr(sweep_run, "run_sweep", stand_in("run_sweep"))
    monkeypatch.setattr(bench_run, "run_bench", stand_in("run_bench"))
    monkeypatch.setattr(quant_run, "run_quant_check", stand_in("run_quant_check"))
    monkeypatch.setattr(pipeline, "convert", stand_in("convert"))
    monkeypatch.setattr(report_html, "write_report_html", stand_in("write_report_html"))
    return calls


def _without(monkeypatch, *modules):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _refused(args, extra, package, work_started):
    result = CliRunner().invoke(main, args)
    print(result.output)
    assert result.exit_code == MISSING_EXIT, result.output
    assert f"pip install 'fastscore-cpu[{extra}]'" in result.output
    assert package in result.output
    assert len(result.output.strip().splitlines()) == 1  # one line, no traceback
    assert work_started == []


def _requests(tmp_path):
    requests = tmp_path / "r.jsonl"
    requests.write_text('{"id": 1, "prompt": "a", "continuations": ["b"]}\n')
    return requests


def test_missing_extra_detection(monkeypatch):
    assert deps.has_extra("tokenizer")
    _without(monkeypatch, "jinja2")
    assert deps.missing("tokenizer") == ["jinja2"] and deps.missing("llamacpp") == ["jinja2"]
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastscore-cpu\[llamacpp\]'"):
        deps.check_extras("llamacpp")


def test_score_needs_its_backend(monkeypatch, tmp_path, work_started):
    requests = _requests(tmp_path)
    _without(monkeypatch, "llama_cpp")
    _refused(["score", str(requests), "--out", str(tmp_path / "o.jsonl")], "llamacpp", "llama-cpp-python",
             work_started)
    _refused(["score", "--text", "hello"], "llamacpp", "llama-cpp-python", work_started)


def test_score_parquet_needs_pyarrow(monkeypatch, tmp_path, work_started):
    requests = _requests(tmp_path)
    _without(monkeypatch, "pyarrow")
    _refused(["score", str(requests), "--out", str(tmp_path / "o.parquet"), "--format", "parquet"], "parquet",
             "pyarrow", work_started)


def test_score_onnx_needs_the_onnx_extra(monkeypatch, tmp_path, work_started):
    requests = _requests(tmp_path)
    _without(monkeypatch, "onnxruntime")
    _refused(["score", str(requests), "--out", str(tmp_path / "o.jsonl"), "--backend", "onnx"], "onnx",
             "onnxruntime", work_started)


def test_sweep_ray_needs_ray(monkeypatch, tmp_path, work_started):
    _without(monkeypatch, "ray")
    _refused(["sweep", "--models", "smollm2-135m-instruct", "--ray", "local", "--out", str(tmp_path / "s")], "ray",
             "ray", work_started)


def test_quant_check_needs_the_reference_and_matplotlib(monkeypatch, tmp_path, work_started):
    _without(monkeypatch, "matplotlib")
    _refused(["bench", "quant", "--variants", "llamacpp:q8_0", "--out", str(tmp_path / "q")], "study", "matplotlib",
             work_started)
    _without(monkeypatch, "torch")
    _refused(["bench", "quant", "--variants", "llamacpp:q8_0", "--out", str(tmp_path / "q")], "reference,study",
             "torch", work_started)


def test_bench_needs_each_backend_measured(monkeypatch, tmp_path, work_started):
    _without(monkeypatch, "torch")
    _refused(["bench", "throughput", "--backends", "llamacpp", "--data", str(tmp_path)], "reference", "torch",
             work_started)
    _without(monkeypatch, "llama_cpp")
    _refused(["bench", "throughput", "--backends", "llamacpp", "--skip-reference", "--data", str(tmp_path)],
             "llamacpp", "llama-cpp-python", work_started)


def test_convert_needs_the_reference(monkeypatch, work_started):
    _without(monkeypatch, "transformers")
    _refused(["convert", "smollm2-135m-instruct", "--gguf", "q8_0"], "reference", "transformers", work_started)


def test_report_html_needs_the_studys_backend_only_to_score(monkeypatch, tmp_path, work_started):
    (tmp_path / "config.json").write_text(json.dumps({"model": "smollm2-135m-instruct", "backend": "onnx",
                                                      "quant": "fp32"}))
    _without(monkeypatch, "onnxruntime")
    _refused(["report-html", str(tmp_path)], "onnx", "onnxruntime", work_started)
    (tmp_path / "tokens.jsonl").write_text("")  # scored already: nothing to compute, nothing needed
    result = CliRunner().invoke(main, ["report-html", str(tmp_path)])
    assert work_started == ["write_report_html"], result.output


def test_study_without_matplotlib_runs_and_says_so_first(monkeypatch, tmp_path, work_started):
    _without(monkeypatch, "matplotlib")
    result = CliRunner().invoke(main, ["study", "--out", str(tmp_path / "s"), "--data", str(tmp_path)])
    print(result.output)
    assert "no plots will be drawn" in result.output and "pip install 'fastscore-cpu[study]'" in result.output
    assert work_started == ["run_study"]  # the note came first, then the study started
    _without(monkeypatch, "llama_cpp")
    work_started.clear()
    _refused(["study", "--out", str(tmp_path / "s"), "--data", str(tmp_path)], "llamacpp", "llama-cpp-python",
             work_started)
