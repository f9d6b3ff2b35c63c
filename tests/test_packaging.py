"""pyproject.toml lists its packages by hand (package-dir maps conversion/, models/ and bench/ into fastscore), so a
new subpackage left off the list is silently missing from a non-editable install while every editable run works.
These tests compare the list with the folders on disk."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def packages_on_disk(package_dir: dict[str, str]) -> set[str]:
    """Every folder holding an __init__.py under each package-dir root, as the dotted name it installs under."""
    found = set()
    for name, folder in package_dir.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(base).parts]))
    return found


def test_every_package_on_disk_is_listed_in_pyproject():
    config = _setuptools()
    listed = config["packages"]
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({p for p in listed if listed.count(p) > 1})}"
    on_disk = packages_on_disk(config["package-dir"])
    assert "fastscore.sweep" in on_disk  # the walk itself finds nested packages
    assert sorted(on_disk - set(listed)) == [], "packages missing from pyproject's `packages` (absent from a wheel)"
    assert sorted(set(listed) - on_disk) == [], "pyproject lists packages that have no folder with an __init__.py"


def test_no_python_folder_lacks_an_init():
    """A folder of modules without __init__.py would escape the check above and the wheel alike."""
    missing = []
    for folder in _setuptools()["package-dir"].values():
        for py in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in py.parts and not (py.parent / "__init__.py").is_file():
                missing.append(str(py.parent.relative_to(ROOT)))
    assert sorted(set(missing)) == []


def test_console_script_points_at_the_click_group():
    import click

    target = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]["fastscore"]
    module, _, attr = target.partition(":")
    assert isinstance(getattr(importlib.import_module(module), attr), click.Group)
