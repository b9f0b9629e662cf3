"""statemachine/ stays pure: it imports only an allow-list and calls no impure builtins.

No I/O, clock, randomness, threads or logging may reach the replicated core; `hash()` and
`id()` are banned too, since their values differ between processes and would let replicas
diverge. The group coordinator (cluster/broker/coordinator/) is held to the same rules: it
is not replicated, but it is sans I/O by design, its time and member ids passed in, so that
its tests drive both; it may import statemachine/ and itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "statemachine"
COORDINATOR = ROOT / "cluster" / "broker" / "coordinator"
ALLOWED_MODULES = {
    "__future__",
    "collections",
    "collections.abc",
    "dataclasses",
    "enum",
    "typing",
    "struct",
    "zlib",
    "re",
    "msgpack",
    "heapq",  # pure functions on a list: the producer table's recency heap
    "bisect",  # pure functions on a sorted list: the leader epochs' lookups
    "operator",  # attrgetter: a command's fields read in one call when it is encoded
    "crc32c",  # CRC-32C of record batch v2 (C): a pure function of bytes
    "cramjam",  # the codecs of compressed batches, for readers (Rust): pure functions of bytes
}
BANNED_CALLS = {"print", "open", "input", "eval", "exec", "compile", "__import__", "hash", "id"}
SOURCES = sorted([*PACKAGE.rglob("*.py"), *COORDINATOR.rglob("*.py")])  # subpackages too
OURS_ALLOWED = ("statemachine", "cluster.broker.coordinator")


def imported_modules(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "use absolute imports"
            names.add(node.module or "")
    return names


def test_the_package_has_sources() -> None:
    assert len(SOURCES) >= 10
    assert any(path.is_relative_to(COORDINATOR) for path in SOURCES)


def source_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def ours_allowed(module: str) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in OURS_ALLOWED)


@pytest.mark.parametrize("path", SOURCES, ids=source_id)
def test_imports_are_allowed(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    outside = {
        m for m in imported_modules(tree) if m not in ALLOWED_MODULES and not ours_allowed(m)
    }
    assert not outside, f"{path.name} imports {sorted(outside)}"


@pytest.mark.parametrize("path", SOURCES, ids=source_id)
def test_no_impure_builtins(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert not calls & BANNED_CALLS, f"{path.name} calls {sorted(calls & BANNED_CALLS)}"


def test_the_checker_catches_an_impure_module() -> None:
    tree = ast.parse("import time\nfrom os import path\nprint(hash('x'))\n")
    assert imported_modules(tree) - ALLOWED_MODULES == {"time", "os"}
    assert not ours_allowed("cluster.broker.groups") and ours_allowed("cluster.broker.coordinator")
