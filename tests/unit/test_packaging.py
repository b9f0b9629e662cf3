"""Packaging ships every package: a wheel built from a clean clone must run every command.

pyproject.toml lists the import packages by name (so nothing else is swept in); a subpackage
added to the tree but not to that list would be missing from the wheel, and a command that
imports it would fail only for users who installed one.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("statemachine", "cluster", "cli", "pipeline")


def listed_packages(pyproject: dict[str, object]) -> set[str]:
    setuptools = pyproject["tool"]["setuptools"]  # type: ignore[index]
    return set(setuptools["packages"])


def packages_in_tree(root: Path) -> set[str]:
    return {
        ".".join(init.parent.relative_to(root).parts)
        for top in TOP_LEVEL
        for init in (root / top).rglob("__init__.py")
    }


def test_every_package_of_the_tree_is_listed_for_the_wheel() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert listed_packages(pyproject) == packages_in_tree(ROOT)


def test_the_check_sees_a_missing_subpackage(tmp_path: Path) -> None:
    for package in ("cluster", "cluster/raft", "cli", "pipeline", "statemachine"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").touch()
    listed = {"cluster", "cli", "pipeline", "statemachine"}
    assert packages_in_tree(tmp_path) - listed == {"cluster.raft"}
