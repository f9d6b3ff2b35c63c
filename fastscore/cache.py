"""The artefact cache: one folder per model and variant under FASTSCORE_HOME, written atomically."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"


def home() -> Path:
    return Path(os.environ.get("FASTSCORE_HOME", Path.home() / ".cache" / "fastscore")).expanduser()


def variant_dir(model: str, variant: str) -> Path:
    """Where the artefact `variant` (e.g. 'gguf-q8_0', 'onnx-fp32', 'hf-fp32') of `model` lives."""
    return home() / model / variant


def is_complete(path: Path) -> bool:
    """A variant counts as present only once its folder was renamed into place with its marker."""
    return (path / COMPLETE_MARKER).is_file()


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a scratch folder; on success rename it to `final` with a completion marker.

    A killed conversion leaves only a `.tmp-*` sibling, which never counts as present and is swept next time.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        yield scratch
        (scratch / COMPLETE_MARKER).write_text("ok\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(scratch, final)
        log.debug("wrote %s", final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
