"""The bench names the llama.cpp build it measured: ggml's backend registry read through the loaded library."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llama_cpp")
from fastscore.bench.llamacpp_build import llamacpp_build  # noqa: E402
from fastscore.bench.table import build_line  # noqa: E402


def test_the_registry_agrees_with_llama_cpps_system_info():
    build = llamacpp_build()
    print(build)
    assert "CPU" in build["ggml_backends"]
    assert len(set(build["ggml_backends"])) == len(build["ggml_backends"])
    # llama_print_system_info prints "NAME : features" for each registered backend that reports features (CPU
    # always does); the registry read by ctypes must hold every one of them.
    named = set(re.findall(r"(?:^|\| )([A-Za-z0-9_]+) : ", build["system_info"]))
    assert "CPU" in named and named <= set(build["ggml_backends"])
    # OpenBLAS is reported exactly when the build has ggml's BLAS backend (built against OpenBLAS).
    if build["openblas"] is not None:
        assert "BLAS" in build["ggml_backends"] and "OpenBLAS" in build["openblas"]


def test_build_line():
    build = {"llama_cpp_python": "0.3.36", "ggml_backends": ["BLAS", "CPU"], "openblas": "OpenBLAS 0.3.21; core Zen"}
    assert build_line(build) == "llama-cpp-python 0.3.36, ggml backends BLAS, CPU; OpenBLAS 0.3.21; core Zen"
    assert build_line({**build, "ggml_backends": ["CPU"], "openblas": None}) == "llama-cpp-python 0.3.36, ggml backends CPU"
