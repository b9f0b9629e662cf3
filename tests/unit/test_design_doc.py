"""docs/design.md held to the code, so it cannot drift (issue 35: seven of ten claims checked
there had gone false).

- The module map lists every module of the shipped packages and of bench/, and every module it
  names exists. The map is written by hand, a block per package (a line that opens with the
  package's path in backticks); a module counts as listed when its block names it (`name.py`,
  or a subpackage `sub/` with the module's name).
- The error table has a row for every error class with a Kafka code (`RaftbrokerError` and its
  subclasses), each in the module it names, and names no class that does not exist.
- The ports table lists exactly the ports a node's configuration has; the Raft layer's modules
  import only those before them in the order it gives; the chaos runs last as long as it says.
- Every number the docs give a setting or a constant, as "`name` (N unit)", is its default in
  the code, in the setting's own unit.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

from cluster.config import NodeConfig
from cluster.errors import RaftbrokerError
from tests.chaos import test_chaos

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text()
DOCS = {
    name: (ROOT / name).read_text() for name in ("docs/design.md", "docs/semantics.md", "README.md")
}
PACKAGES = ("statemachine", "cluster", "cli", "pipeline", "bench")


def section(text: str, title: str) -> str:
    """The body of the `## title` section of a markdown text."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def modules() -> list[str]:
    """Every module file of the shipped packages and bench/, repository-relative."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py":
                found.append(path.relative_to(ROOT).as_posix())
    return found


BLOCK_OPENING = re.compile(r"^(?:Top level of )?`([a-z_]+/(?:[a-z_]+/)*)(?:[a-z_]+\.py)?`", re.M)


def map_blocks() -> dict[str, str]:
    """The module map's blocks, by the package directory each opens with."""
    text = section(DESIGN, "Module map")
    starts = [(m.start(), m.group(1)) for m in BLOCK_OPENING.finditer(text)]
    blocks: dict[str, str] = {}
    for (start, directory), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        blocks[directory] = blocks.get(directory, "") + text[start:end]
    return blocks


def block_of(path: str, blocks: dict[str, str]) -> tuple[str, str]:
    """The deepest block whose package holds `path`, and the block's text."""
    owners = [d for d in blocks if path.startswith(d)]
    assert owners, f"no block of the module map covers {path}"
    directory = max(owners, key=len)
    return directory, blocks[directory]


def listed(path: str, blocks: dict[str, str]) -> bool:
    directory, text = block_of(path, blocks)
    if f"`{path}`" in text:
        return True
    relative = path.removeprefix(directory)
    sub, _, name = relative.rpartition("/")
    if not sub:
        return f"`{name}`" in text
    stem = name.removesuffix(".py")
    return f"`{sub}/`" in text and (f"`{name}`" in text or f"`{stem}`" in text)


@pytest.mark.parametrize("path", modules())
def test_the_module_map_lists_every_module(path: str) -> None:
    assert listed(path, map_blocks()), f"docs/design.md's module map does not list {path}"


def test_every_module_the_map_names_exists() -> None:
    missing = []
    for directory, text in map_blocks().items():
        for name in re.findall(r"`([a-z_/]+\.py)`", text):
            if (ROOT / name).exists() or (ROOT / directory / name).exists():
                continue
            if not any((ROOT / directory).rglob(name)):
                missing.append(f"{directory}{name}")
    assert missing == []


def test_the_map_checker_notices_a_module_left_out() -> None:
    blocks = map_blocks()
    assert listed("cluster/raft/group.py", blocks)
    blocks["cluster/raft/"] = blocks["cluster/raft/"].replace("`group.py`", "`grup.py`")
    assert not listed("cluster/raft/group.py", blocks)
    assert listed("cluster/raft/adapter/replica.py", blocks)  # `adapter/` and `replica.py`


# -- the error table ---------------------------------------------------------------------------


def our_modules() -> list[ModuleType]:
    found = []
    for package in ("statemachine", "cluster", "cli", "pipeline"):
        root = importlib.import_module(package)
        found.append(root)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            # Not imported: __main__ runs its command; kafka_clients needs a dev-only library.
            if not info.name.endswith(("__main__", "cluster.chaos.kafka_clients")):
                found.append(importlib.import_module(info.name))
    return found


def error_classes() -> dict[str, type]:
    return {
        cls.__name__: cls
        for module in our_modules()
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, RaftbrokerError)
        and cls.__module__ == module.__name__
        and not cls.__name__.startswith("_")
    }


def error_rows() -> dict[str, str]:
    """The error table's rows: the class each names, and the row."""
    text = section(DESIGN, "Errors")
    return {m.group(1): m.group(0) for m in re.finditer(r"^  \| `(\w+)` \|.*$", text, re.M)}


def test_the_error_table_has_every_error_class_with_a_code() -> None:
    classes = error_classes()
    assert "ProposalError" in classes and "ClientError" in classes
    rows = error_rows()
    assert sorted(set(classes) - {"RaftbrokerError"} - set(rows)) == []
    assert sorted(set(rows) - set(classes)) == []


def test_each_row_names_the_module_its_class_is_in() -> None:
    """The "where" cell names the class's module, or its base ("a `StorageError`"), or both."""
    wrong = []
    classes = error_classes()
    for name, row in error_rows().items():
        where = row.split("|")[2]
        base = re.match(r" an? `(\w+)`", where)
        if base is not None and not issubclass(classes[name], classes[base.group(1)]):
            wrong.append(f"{name} is no {base.group(1)}")
        module = re.search(r"`([a-z_/]+)\.py`", where)
        if module is None:
            assert base is not None, f"the row of {name} names neither a module nor a base"
        elif classes[name].__module__ != module.group(1).replace("/", "."):
            wrong.append(f"{name} is in {classes[name].__module__}, not {module.group(1)}")
    assert wrong == []


# -- ports -------------------------------------------------------------------------------------


def test_the_ports_table_lists_each_port_a_node_has() -> None:
    text = section(DESIGN, "Architecture")
    documented = re.findall(r"^\| `(\w+_port)` \|", text, re.M)
    configured = [f.name for f in dataclasses.fields(NodeConfig) if f.name.endswith("_port")]
    assert sorted(documented) == sorted(configured)
    assert "listens on these ports" in text  # no count to go stale


# -- claims about the code -------------------------------------------------------------------


def test_the_raft_layer_imports_in_the_order_the_doc_gives() -> None:
    claim = re.search(r"in this order: ((?:`[a-z_/.]+`,?\s*)+)", section(DESIGN, "The Raft layer"))
    assert claim is not None
    order = [
        name.removesuffix(".py").removesuffix("/")
        for name in re.findall(r"`([^`]+)`", claim.group(1))
    ]
    package = ROOT / "cluster" / "raft"
    present = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    present |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    assert sorted(order) == sorted(present)
    for position, name in enumerate(order):
        path = (
            package / name / "__init__.py" if (package / name).is_dir() else package / f"{name}.py"
        )
        sources = [path] if path.name != "__init__.py" else sorted(path.parent.glob("*.py"))
        imported = {
            m
            for source in sources
            for m in re.findall(r"^\s*from cluster\.raft\.(\w+)", source.read_text(), re.M)
        }
        later = imported - set(order[:position]) - {name}
        assert later == set(), f"{name} imports {later}, not before it in the doc's order"


def test_the_chaos_runs_last_as_long_as_the_doc_says() -> None:
    row = section(DESIGN, "Module map")
    assert f"a seeded {test_chaos.CI_DURATION_S} s chaos run" in row
    assert f"a {test_chaos.KAFKA_DURATION_S} s seeded run through the Kafka listener" in row
    assert f"{test_chaos.POWER_DURATION_S} s of power cuts" in row


# -- numbers -----------------------------------------------------------------------------------

SETTINGS_MODULES = (
    "cluster.config",
    "statemachine.limits",
    "cluster.client.producer",
    "cluster.client.consumer",
    "cluster.client.group_consumer",
    "cluster.client.retry",
    "cluster.native",
    "cluster.raft.mesh",
)
STATED = re.compile(r"`(\w+)` \((\d[\d,]*(?:\.\d+)?)(?:\s*(ms|s|min|h|days?|KiB|MiB|GiB|bytes)\b)?")
MS_PER = {"ms": 1, "s": 1_000, "min": 60_000, "h": 3_600_000, "day": 86_400_000}
BYTES_PER = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "bytes": 1}


def code_values() -> dict[str, set[float]]:
    """Every default of a settings dataclass and every numeric module constant, by name."""
    values: dict[str, set[float]] = {}
    for name in SETTINGS_MODULES:
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not (dataclasses.is_dataclass(cls) and inspect.isclass(cls)):
                continue
            for field in dataclasses.fields(cls):
                if type(field.default) in (int, float):
                    values.setdefault(field.name, set()).add(field.default)  # type: ignore[arg-type]
    for module in our_modules():
        for name, value in vars(module).items():
            if name.isupper() and type(value) in (int, float):
                values.setdefault(name, set()).add(value)
    return values


def in_units_of(name: str, number: float, unit: str | None) -> float:
    """`number unit` in the unit `name` carries (its suffix: _ms, _s, bytes, or a count)."""
    unit = (unit or "").removesuffix("s") if unit in ("days", "day") else unit
    lowered = name.lower()
    if lowered.endswith("_ms"):
        return number * MS_PER[unit or "ms"]
    if lowered.endswith("_s"):
        return number * MS_PER[unit or "s"] / 1000
    return number * BYTES_PER.get(unit or "", 1)


def stated_numbers() -> list[tuple[str, str, float, str | None]]:
    found = []
    for doc, text in DOCS.items():
        for match in STATED.finditer(text):
            name, number, unit = match.groups()
            if name.startswith("_") or not (name.isupper() or "_" in name):
                continue
            found.append((doc, name, float(number.replace(",", "")), unit))
    return found


def test_the_docs_state_numbers_of_the_code() -> None:
    assert len(stated_numbers()) >= 30  # the pattern still finds what it checks


@pytest.mark.parametrize(("doc", "name", "number", "unit"), stated_numbers(), ids=str)
def test_a_number_the_docs_give_a_setting_is_its_default(
    doc: str, name: str, number: float, unit: str | None
) -> None:
    values = code_values()
    assert name in values, f"{doc} gives `{name}` a number, but no setting or constant has it"
    assert in_units_of(name, number, unit) in values[name], (
        f"{doc}: `{name}` ({number:g} {unit or ''}) but the code has {sorted(values[name])}"
    )
