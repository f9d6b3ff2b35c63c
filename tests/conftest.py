"""Session fixtures: the embedded model's variants and tiny random models, built once and kept in the cache.

FASTSCORE_HOME is left as the user has it (default ~/.cache/fastscore): a machine that ran the suite before reuses
its conversions, and a fresh machine builds them on first use (each variant is built only when a test asks for it).

The study data (mbpp.jsonl, bfcl/) is found through one variable, FASTSCORE_DATA (default: shared/data next to the
repository, as the Makefile's DATA), by the one fixture `study_data`; tests needing it skip with a message if absent.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

import pytest
from scorer_helpers import CountingFakeBackend

from fastscore import cache
from fastscore.registry import default_model
from fastscore.resolve import Artefact, resolve
from fastscore.scorer import Scorer
from fastscore.study.data.datafile import default_data_dir
from fastscore.tokenizer import Tokenizer

EMBEDDED = default_model()
TINY_ARCHS = ("llama", "qwen2", "qwen3")
STUDY_DATA = default_data_dir()


@pytest.fixture(scope="session")
def study_data() -> Path:
    """The study data folder (FASTSCORE_DATA); tests that need it skip when it is missing — except under CI, where
    a missing folder fails them: a skip there would turn a wrong default path into a green run."""
    if not ((STUDY_DATA / "mbpp.jsonl").is_file() and (STUDY_DATA / "bfcl").is_dir()):
        message = f"study data not found at {STUDY_DATA} (set FASTSCORE_DATA to the folder with mbpp.jsonl, bfcl/)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return STUDY_DATA


@pytest.fixture(scope="session")
def smollm_artefact():
    """smollm_artefact(backend, quant) -> Artefact of the embedded model, converted on first request."""
    built: dict[tuple[str, str], Artefact] = {}

    def get(backend: str = "llamacpp", quant: str = "q4_1") -> Artefact:
        if (backend, quant) not in built:
            built[backend, quant] = resolve(EMBEDDED, backend, quant, progress=False)
        return built[backend, quant]

    return get


@pytest.fixture(scope="session")
def smollm(smollm_artefact):
    """Alias of smollm_artefact: smollm(backend, quant) -> Artefact."""
    return smollm_artefact


@pytest.fixture(scope="session")
def smollm_tokenizer_dir(smollm_artefact) -> Path:
    """The embedded model's tokenizer rebuilt from its GGUF (cheap: no weights are converted)."""
    return smollm_artefact("llamacpp", "q4_1").tokenizer_dir


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_tokenizer_dir) -> Tokenizer:
    return Tokenizer.from_folder(smollm_tokenizer_dir)


@pytest.fixture
def fake_scorer(smollm_tokenizer) -> Scorer:
    """The real Scorer on the instrumented fake backend, over the embedded model's vocabulary."""
    return Scorer(CountingFakeBackend(), smollm_tokenizer)


def _tiny_source_version() -> str:
    """Tiny checkpoints are rebuilt whenever the code that makes them changes."""
    from fastscore.conversion import tiny

    return hashlib.sha256(inspect.getsource(tiny).encode()).hexdigest()[:8]


@pytest.fixture(scope="session")
def tiny_model(smollm_tokenizer_dir):
    """tiny_model(arch) -> the folder of a seeded tiny random HF checkpoint (llama, qwen2 or qwen3), cached."""
    from fastscore.conversion.tiny import build_tiny_model

    version = _tiny_source_version()

    def get(arch: str) -> Path:
        final = cache.home() / "test-models" / f"tiny-{arch}-{version}"
        if not cache.is_complete(final):
            with cache.atomic_dir(final) as scratch:
                build_tiny_model(arch, scratch, seed=0, tokenizer_dir=smollm_tokenizer_dir)
        return final

    return get


@pytest.fixture(scope="session")
def tiny_artefact(tiny_model):
    """tiny_artefact(arch, backend, quant) -> Artefact of a tiny model's variant (GGUF/ONNX built and checked)."""

    def get(arch: str, backend: str, quant: str) -> Artefact:
        return resolve(str(tiny_model(arch)), backend, quant, progress=False)

    return get


@pytest.fixture
def tiny_disk(tmp_path):
    """tiny_disk(size) -> a folder on a tmpfs of that size (e.g. "64k"), for full-disk tests; unmounted after the
    test. Needs root and mount: the test is skipped where the mount fails."""
    import subprocess

    mounted: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)
