"""passes/, targets/, ir_schema/ install as mcp_compiler subpackages, and nothing else leaks."""

from __future__ import annotations

import importlib
import sysconfig
from pathlib import Path

import tomllib
from _helpers import REPO


def _declared() -> tuple[list[str], dict[str, str]]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return cfg["packages"], cfg["package-dir"]


def test_every_package_folder_is_declared():
    # A subpackage missing from `packages` is dropped from the wheel yet imports in editable mode.
    packages, package_dir = _declared()
    found = set()
    for pkg, folder in package_dir.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            if "runtime" in rel.parts and "triton" in rel.parts:
                continue  # copied into model repositories, not imported as a package
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert found == set(packages)


def test_subpackages_import_under_mcp_compiler():
    for name in ("mcp_compiler.passes", "mcp_compiler.targets", "mcp_compiler.ir_schema"):
        mod = importlib.import_module(name)
        assert Path(mod.__file__).parent.name in ("passes", "targets", "ir_schema")


def test_no_top_level_passes_or_targets_installed():
    site = Path(sysconfig.get_paths()["purelib"])
    for name in ("passes", "targets", "ir_schema"):
        assert not (site / name).exists(), f"{name} leaked into site-packages"
