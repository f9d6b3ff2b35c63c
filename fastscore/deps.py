"""Optional dependencies: import one with an error that names the pip extra, or check a command's extras up front.

Each command checks the extras it will need before any work starts (`check_extras`), so a missing package stops it
at once with the pip line, not after an hour of scoring. The check only looks the modules up (importlib's
find_spec), it imports nothing: `import fastscore` and the llama.cpp route stay free of torch and transformers.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from fastscore.errors import MissingDependencyError

# Each pip extra (pyproject.toml) -> the (import name, distribution) pairs whose absence means it is not installed.
_TOKENIZER = (("tokenizers", "tokenizers"), ("jinja2", "jinja2"), ("gguf", "gguf"))
EXTRA_MODULES: dict[str, tuple[tuple[str, str], ...]] = {
    "tokenizer": _TOKENIZER,
    "llamacpp": (("llama_cpp", "llama-cpp-python"), *_TOKENIZER),
    "onnx": (("onnxruntime", "onnxruntime"), ("onnx", "onnx"), ("optimum", "optimum-onnx"), ("torch", "torch"),
             ("transformers", "transformers"), *_TOKENIZER),
    "reference": (("torch", "torch"), ("transformers", "transformers"), ("accelerate", "accelerate"),
                  ("safetensors", "safetensors"), *_TOKENIZER),
    "study": (("matplotlib", "matplotlib"),),
    "frames": (("pandas", "pandas"),),
    "parquet": (("pyarrow", "pyarrow"),),
    "ray": (("ray", "ray"),),
}


def require(module: str, extra: str, package: str | None = None) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(package or module.split(".")[0], extra) from exc


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import; a module without a spec
        return False


def missing(extra: str) -> list[str]:
    """The distributions of `extra` that are not installed (empty: the extra is usable)."""
    return list(dict.fromkeys(package for module, package in EXTRA_MODULES[extra] if not _installed(module)))


def has_extra(extra: str) -> bool:
    return not missing(extra)


def pip_line(extras: list[str]) -> str:
    return f"pip install 'fastscore-cpu[{','.join(extras)}]'"


def check_extras(*extras: str, purpose: str = "") -> None:
    """Raise MissingDependencyError naming every missing package and the one pip line that installs them all."""
    wanted = list(dict.fromkeys(extras))
    absent = {extra: missing(extra) for extra in wanted}
    lacking = [extra for extra in wanted if absent[extra]]
    if not lacking:
        return
    packages = list(dict.fromkeys(p for extra in lacking for p in absent[extra]))
    needs = f"{purpose} needs" if purpose else "needs"
    raise MissingDependencyError(
        packages[0], lacking[0],
        message=f"{needs} {', '.join(packages)}, not installed; install with: {pip_line(lacking)}")


def extras_for_backend(backend: str) -> tuple[str, ...]:
    """The extra a scoring backend runs from (an unknown name needs none here: it is refused as unknown later)."""
    return (backend,) if backend in EXTRA_MODULES else ()
