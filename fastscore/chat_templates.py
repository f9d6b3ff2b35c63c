"""Real chat templates of other model families, obtained at run time from llama.cpp's own collection.

The templates' texts are not ours to ship, so none is committed. llama-cpp-python's source distribution (the version
installed here, which `make install` builds from that very sdist) vendors llama.cpp with its test collection of
chat templates (vendor/llama.cpp/models/templates/*.jinja), copied from the models' own tokenizer configs. The first
use downloads that sdist with pip (`pip download ... --no-binary :all: --no-deps`), keeps only the templates named
here and caches them under $FASTSCORE_HOME/templates/, so later runs (and CI after `make test`'s fetch step) need no
network.

`python -m fastscore.chat_templates` fetches them (the Makefile's `templates` step).
"""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from fastscore import cache
from fastscore.errors import ArtefactUnavailableError, UnsupportedError

log = logging.getLogger(__name__)

DISTRIBUTION = "llama-cpp-python"
TEMPLATE_FOLDER = "vendor/llama.cpp/models/templates/"
# Family -> the file in llama.cpp's collection (the Hugging Face repository the template was taken from).
TEMPLATES = {
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "llama3.2": "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "llama3.1": "meta-llama-Llama-3.1-8B-Instruct.jinja",
}
PIP_TIMEOUT_SECONDS = 900


def installed_version() -> str:
    """The public version of the installed llama-cpp-python: a local build's label (0.3.36+fastscore3, made from
    that sdist with llamacpp/'s patches) is dropped, since the templates come from the sdist PyPI has."""
    try:
        return importlib.metadata.version(DISTRIBUTION).split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        raise ArtefactUnavailableError(
            f"{DISTRIBUTION} is not installed, so there is no version to take its chat templates from; "
            "install the extra with: pip install 'fastscore-cpu[llamacpp]'"
        ) from None


def templates_dir(version: str | None = None) -> Path:
    return cache.home() / "templates" / f"templates-{DISTRIBUTION}-{version or installed_version()}"


def _download_sdist(version: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", f"{DISTRIBUTION}=={version}", "--no-binary", ":all:",
               "--no-deps", "--quiet", "-d", str(into)]
    log.info("downloading the %s %s sdist for its chat templates", DISTRIBUTION, version)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise ArtefactUnavailableError(f"pip download of {DISTRIBUTION}=={version} timed out") from None
    archives = sorted(into.glob("*.tar.gz"))
    if done.returncode != 0 or not archives:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no sdist written"]
        raise ArtefactUnavailableError(
            f"cannot download the {DISTRIBUTION} {version} sdist for its chat templates (offline?): {tail[0]}"
        )
    return archives[0]


def _extract(archive: Path, out_dir: Path) -> None:
    wanted = set(TEMPLATES.values())
    found = set()
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/", 1)
            name = member.name.rsplit("/", 1)[-1]
            if member.isfile() and len(parts) == 2 and parts[1] == TEMPLATE_FOLDER + name and name in wanted:
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                (out_dir / name).write_bytes(source.read())
                found.add(name)
    missing = wanted - found
    if missing:
        raise ArtefactUnavailableError(f"{archive.name} lacks the chat template(s) {', '.join(sorted(missing))}")


def fetch(version: str | None = None) -> Path:
    """The folder holding TEMPLATES' files, downloaded and extracted on first use (cached)."""
    final = templates_dir(version)
    if cache.is_complete(final):
        return final
    with tempfile.TemporaryDirectory(prefix="fastscore-sdist-") as download, cache.atomic_dir(final) as scratch:
        _extract(_download_sdist(version or installed_version(), Path(download)), scratch)
    log.info("chat templates cached in %s", final)
    return final


def real_template(family: str) -> str:
    """The chat template text of `family` (one of TEMPLATES), fetched on first use."""
    if family not in TEMPLATES:
        raise UnsupportedError(f"no real chat template for {family!r}; known: {', '.join(TEMPLATES)}")
    return (fetch() / TEMPLATES[family]).read_text(encoding="utf-8")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(fetch())
