"""pysyncobj, contained: the adapter's table of overrides is complete and true of the release.

cluster/raft/adapter/ replaces and reaches into pysyncobj's private names; `OVERRIDES` lists
each. These checks read that table against the installed pysyncobj (every name it lists still
exists where it says) and against the source of every module of the adapter (every
class-private name it uses, every pysyncobj name it touches, every method of pysyncobj's its
classes override, has a row),
so an upgrade that renames one, or an edit that uses one more, fails here, not in production.
pysyncobj is loaded by name from the table's owners: only the adapter imports it.
"""

from __future__ import annotations

import ast
import concurrent.futures
import functools
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from cluster.raft import adapter
from cluster.raft.adapter import OVERRIDES, Override

# Every module of the adapter package: a name used in any of them counts.
ADAPTER_MODULES = tuple(
    importlib.import_module(f"{adapter.__name__}.{info.name}")
    for info in pkgutil.iter_modules(adapter.__path__)
)
ADAPTER_SOURCES = {
    Path(module.__file__ or "").name: Path(module.__file__ or "").read_text()
    for module in (adapter, *ADAPTER_MODULES)
}
# A class-private name as Python mangles it: `__raftLog` in class SyncObj is `_SyncObj__raftLog`.
MANGLED = re.compile(r"_[A-Z][A-Za-z0-9]*__[A-Za-z0-9_]*[A-Za-z0-9]")
# Names every class has or that say nothing about pysyncobj's behaviour.
CLASS_BOILERPLATE = frozenset(
    {
        "__init__",
        "__module__",
        "__qualname__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__annotations__",
        "__firstlineno__",
        "__static_attributes__",
        "__slots__",
    }
)


def owner_of(row: Override) -> ModuleType | type:
    """The module or class a row names, loaded by its dotted name."""
    try:
        return importlib.import_module(row.owner)
    except ModuleNotFoundError:
        module, _, name = row.owner.rpartition(".")
        owner: type = getattr(importlib.import_module(module), name)
        return owner


def _mangled(name: str, class_name: str) -> str:
    if name.startswith("__") and not name.endswith("__"):
        return f"_{class_name.lstrip('_')}{name}"
    return name


def _parsed_in_a_fresh_thread(klass: type) -> ast.Module:
    """`klass`'s source, parsed on a thread of its own: CPython 3.11.7's AST constructor can
    fail with "recursion depth mismatch" (a SystemError, gh-106905) when it starts deep in a
    stack whose recursion count another test's code has left off; a new thread counts from 0."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: ast.parse(textwrap.dedent(inspect.getsource(klass)))).result()


@functools.cache
def defined_names(cls: type) -> frozenset[str]:
    """What pysyncobj's `cls` (with its pysyncobj bases) defines: its class attributes, and the
    attributes its methods assign on `self` (set in `__init__`, so absent from the class)."""
    names: set[str] = set()
    for klass in inspect.getmro(cls):
        if not klass.__module__.startswith("pysyncobj"):
            continue
        names.update(vars(klass))
        tree = _parsed_in_a_fresh_thread(klass)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(_mangled(node.attr, klass.__name__))
    return frozenset(names)


def pysyncobj_names() -> set[str]:
    """Every name defined by the classes and modules the table names."""
    names: set[str] = set()
    for row in OVERRIDES:
        owner = owner_of(row)
        if isinstance(owner, type):
            names |= defined_names(owner)
        else:
            names |= {n for n in vars(owner) if not n.startswith("__")}
    return names


def names_used_by_adapter() -> dict[str, str]:
    """Attribute, method and imported names of the adapter's modules, by first file:line."""
    used: dict[str, str] = {}
    for file, source in ADAPTER_SOURCES.items():
        for node in ast.walk(ast.parse(source)):
            for name in _names_of(node):
                used.setdefault(name, f"{file}:{getattr(node, 'lineno', 0)}")
    return used


def _names_of(node: ast.AST) -> list[str]:
    """The names one node of the adapter's syntax tree uses, as the checks below see them."""
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.FunctionDef | ast.Name):
        return [node.name if isinstance(node, ast.FunctionDef) else node.id]
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pysyncobj"):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if MANGLED.fullmatch(node.value) else []  # vars(x)["_A__b"]
    return []


def test_every_row_names_something_the_installed_pysyncobj_has() -> None:
    missing = []
    for row in OVERRIDES:
        owner = owner_of(row)
        present = (
            row.name in defined_names(owner)
            if isinstance(owner, type)
            else hasattr(owner, row.name)
        )
        if not present:
            missing.append(f"{row.owner}.{row.name}")
    assert missing == [], f"gone from the installed pysyncobj: {missing}"


def test_rows_are_unique_and_say_why_and_what_stock_does() -> None:
    keys = [(row.owner, row.name) for row in OVERRIDES]
    assert len(keys) == len(set(keys))
    assert all(row.why.strip() and row.stock.strip() for row in OVERRIDES)


def test_every_class_private_name_the_adapter_uses_has_a_row() -> None:
    listed = {row.name for row in OVERRIDES}
    unlisted = {
        name: line
        for name, line in names_used_by_adapter().items()
        if MANGLED.fullmatch(name) and name not in listed
    }
    assert unlisted == {}, f"add a row to OVERRIDES for each (name: line): {unlisted}"


def test_every_private_pysyncobj_name_the_adapter_touches_has_a_row() -> None:
    """A single-underscore name the adapter uses that pysyncobj defines too is pysyncobj's,
    or ours shadowing it: either way it needs a row."""
    listed = {row.name for row in OVERRIDES}
    theirs = pysyncobj_names()
    unlisted = {
        name: line
        for name, line in names_used_by_adapter().items()
        if name.startswith("_") and not name.startswith("__") and name in theirs
        if name not in listed
    }
    assert unlisted == {}, f"add a row to OVERRIDES for each (name: line): {unlisted}"


@pytest.mark.parametrize(
    "cls",
    [
        value
        for module in ADAPTER_MODULES
        for value in vars(module).values()
        if isinstance(value, type)
        and value.__module__ == module.__name__
        and any(base.__module__.startswith("pysyncobj") for base in value.__mro__[1:])
    ],
    ids=lambda cls: cls.__name__,
)
def test_every_method_of_pysyncobjs_a_subclass_overrides_has_a_row(cls: type) -> None:
    listed = {row.name for row in OVERRIDES}
    stock = set().union(
        *(
            defined_names(base)
            for base in cls.__mro__[1:]
            if base.__module__.startswith("pysyncobj")
        )
    )
    overridden = set(vars(cls)) - CLASS_BOILERPLATE
    assert sorted((overridden & stock) - listed) == []
