"""The architecture contracts of .importlinter (layers, the study's layers, no cycles, a pure core) hold, and a new
upward import fails.

import-linter (grimp) finds a package's modules by walking its folder, but bench/, conversion/ and models/ live at
the top of the repo and join `fastscore` only through pyproject's package-dir map. The linter therefore runs on a
view: a temporary `fastscore` folder of symbolic links to the real files, laid out as the installed package, in a
subprocess whose sys.path starts there (this process has already imported the real package)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".importlinter"
# Runs the linter's own command line with the view first on sys.path.
LINT = ("import sys; from importlinter.cli import lint_imports_command; sys.argv[0] = 'lint-imports'; "
        "lint_imports_command()")
COUNT = ("import grimp, json; g = grimp.build_graph('fastscore'); "
         "print(json.dumps({p: sum(m.startswith(p + '.') for m in g.modules) for p in %r}))")


def _package_dirs() -> dict[str, Path]:
    """fastscore's subpackages that live outside fastscore/ (pyproject's package-dir), by their name in fastscore."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name.split(".", 1)[1]: REPO / folder for name, folder in mapping.items() if name.startswith("fastscore.")}


def make_view(root: Path, copied: tuple[str, ...] = ()) -> Path:
    """`root`/fastscore laid out as the installed package: links to the real files, except the `copied` top-level
    entries (e.g. "engine"), which are real copies a test may change."""
    view = root / "fastscore"
    view.mkdir()
    entries = {p.name: p for p in (REPO / "fastscore").iterdir() if p.name != "__pycache__"}
    entries.update(_package_dirs())  # replaces the git-ignored links some checkouts keep for them
    for name, source in entries.items():
        if name in copied:
            shutil.copytree(source, view / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (view / name).symlink_to(source.resolve(), target_is_directory=source.is_dir())
    return root


def _run(root: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def lint(root: Path) -> subprocess.CompletedProcess:
    return _run(root, LINT, "--config", str(CONFIG), "--no-cache")


def test_the_view_holds_the_subpackages_kept_outside_the_package_folder(tmp_path):
    # Without them the layers would hold vacuously for bench and conversion: the linter does not miss a folder.
    names = sorted(_package_dirs())
    found = _run(make_view(tmp_path), COUNT % (tuple(f"fastscore.{n}" for n in names),))
    assert found.returncode == 0, found.stderr
    counts = json.loads(found.stdout)
    # Every python file but the subpackage's own __init__ is a submodule (a nested package's __init__ is that
    # package, e.g. fastscore.bench.lab).
    expected = {f"fastscore.{n}": len(list(_package_dirs()[n].rglob("*.py"))) - 1 for n in names}
    print("modules per subpackage:", counts, "python files:", expected)
    assert counts == expected


def test_the_architecture_contracts_hold(tmp_path):
    result = lint(make_view(tmp_path))
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("module", "added", "expected"), [
    # The plans are the bottom layer: importing the model selection from them is an upward import (and a cycle).
    ("engine/trie.py", "from fastscore import selection\n", "fastscore.engine.trie -> fastscore.selection"),
    # An import inside a function counts as much as one at the top: a backend may not reach up into the study.
    ("backends/base.py", "\n\ndef _upward():\n    from fastscore.study import runner\n\n    return runner\n",
     "fastscore.backends.base -> fastscore.study.runner"),
    # The investigations are scripts: the bench the CLI runs may not import one, not even lazily.
    ("bench/run.py", "\n\ndef _lab():\n    from fastscore.bench.lab import op_kinds\n\n    return op_kinds\n",
     "fastscore.bench.run -> fastscore.bench.lab.op_kinds"),
    # Inside the study the analysis sits below the report: the statistics may not render a markdown cell.
    ("study/analysis/stats.py",
     "\n\ndef _cell():\n    from fastscore.study.report import markdown\n\n    return markdown\n",
     "fastscore.study.analysis.stats -> fastscore.study.report.markdown"),
])
def test_a_new_upward_import_breaks_the_contracts(tmp_path, module, added, expected):
    root = make_view(tmp_path, copied=(module.split("/")[0],))
    with (root / "fastscore" / module).open("a") as file:
        file.write(added)
    result = lint(root)
    print(result.stdout[-2000:])
    assert result.returncode == 1 and "BROKEN" in result.stdout and expected in result.stdout
