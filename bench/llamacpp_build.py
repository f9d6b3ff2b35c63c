"""Which llama.cpp build a benchmark worker loaded: its ggml backends (e.g. BLAS next to CPU) and system info.

A llama.cpp built against a BLAS library takes the large matmuls off its own kernels, so a bench figure means
nothing without knowing which build produced it (docs/performance.md). llama-cpp-python does not bind ggml's
backend registry; libggml exports it and libllama links libggml, so the symbols resolve through the library that
llama_cpp already opened.
"""

from __future__ import annotations

import ctypes
from typing import Any


def ggml_backends(lib: ctypes.CDLL) -> list[str]:
    """Names of the ggml backends registered in `lib` (a handle on libllama or libggml), in registry order."""
    count, get, name = lib.ggml_backend_reg_count, lib.ggml_backend_reg_get, lib.ggml_backend_reg_name
    count.argtypes, count.restype = [], ctypes.c_size_t
    get.argtypes, get.restype = [ctypes.c_size_t], ctypes.c_void_p
    name.argtypes, name.restype = [ctypes.c_void_p], ctypes.c_char_p
    return [name(get(i)).decode("utf-8", "replace") for i in range(count())]


def openblas_config(lib: ctypes.CDLL) -> str | None:
    """OpenBLAS's build line and the kernel set it picked for this CPU, when `lib` links OpenBLAS; else None."""
    try:
        config, core = lib.openblas_get_config, lib.openblas_get_corename
    except AttributeError:
        return None
    config.restype = core.restype = ctypes.c_char_p
    return f"{config().decode('utf-8', 'replace')}; core {core().decode('utf-8', 'replace')}"


def llamacpp_build() -> dict[str, Any]:
    """The loaded llama.cpp: llama-cpp-python's version, library path, ggml backends, OpenBLAS (if any), system info."""
    import llama_cpp
    from llama_cpp import llama_cpp as bindings

    # A handle of our own (dlopen of the same path returns the same library), so the prototypes set here do not
    # touch the function objects llama_cpp caches on its handle.
    lib = ctypes.CDLL(bindings._lib._name)
    return {"llama_cpp_python": llama_cpp.__version__, "library": bindings._lib._name,
            "ggml_backends": ggml_backends(lib), "openblas": openblas_config(lib),
            "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(" |")}
