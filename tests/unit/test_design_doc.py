"""docs/design.md held to the code, so it cannot drift (issue 35: seven of ten claims checked
there had gone false).

- The module map and the error table are generated from the code (docs/generate.py): design.md
  must hold what the generator writes now, the map must cover every module of the shipped
  packages and bench/, and the error table every error class with a Kafka code
  (`RaftbrokerError` and its subclasses, as imported, not as the generator reads them).
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
from docs import generate
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
    return [
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


# -- the generated parts -----------------------------------------------------------------------


def test_design_md_holds_what_the_generator_writes_now() -> None:
    assert generate.generated(DESIGN) == DESIGN, "run `python docs/generate.py` (`make docs`)"


def test_a_docstring_changed_in_the_code_makes_the_check_fail() -> None:
    """The check's negative case: the map as generated from a module whose role changed is
    not the map design.md holds."""
    text = generate.generated(DESIGN)
    row = "| `spec.py` | "
    assert row in text
    assert text.replace(row, "| `spec.py` | Something else. ", 1) != text
    assert generate.generated(text.replace(row, "| `spec.py` | Something else. ", 1)) == text


def map_rows() -> set[str]:
    """Every module the generated map lists, repository-relative."""
    listed = set()
    for match in generate.PART.finditer(DESIGN):
        name = match.group(2)
        if name.startswith("modules "):
            directory = name.removeprefix("modules ")
            listed |= {
                f"{directory}/{m}" for m in re.findall(r"^\| `([^`]+)` \|", match.group(3), re.M)
            }
    return listed


@pytest.mark.parametrize("path", modules())
def test_the_module_map_lists_every_module(path: str) -> None:
    if not (ROOT / path).read_text().strip():
        return  # an empty __init__.py: nothing to describe
    assert path in map_rows(), f"docs/design.md's module map has no part that covers {path}"


def test_a_module_without_a_docstring_stops_the_generator(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "bare.py").write_text("X = 1\n")
    with pytest.raises(AssertionError, match=r"pkg/bare\.py has no docstring"):
        generate.module_table("pkg", set(), tmp_path)
    (package / "bare.py").write_text('"""A role."""\n\nX = 1\n')
    assert "| `bare.py` | A role. |" in generate.module_table("pkg", set(), tmp_path)


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


def error_rows() -> dict[str, list[str]]:
    """The error table's rows: the class each names, and its cells."""
    text = section(DESIGN, "Errors")
    return {
        m.group(1): [c.strip() for c in m.group(0).split("|")[1:-1]]
        for m in re.finditer(r"^\| `(\w+)` \|.*$", text, re.M)
    }


def test_the_error_table_has_every_error_class_with_a_code() -> None:
    classes = error_classes()
    assert "ProposalError" in classes and "ClientError" in classes
    rows = error_rows()
    assert sorted(set(classes) - {"RaftbrokerError"} - set(rows)) == []
    assert sorted(set(rows) - set(classes)) == []


def test_each_row_names_the_module_and_the_base_of_its_class() -> None:
    classes = error_classes()
    for name, (_type, where, base, _what) in error_rows().items():
        assert classes[name].__module__ == where.strip("`").removesuffix(".py").replace("/", ".")
        assert classes[name].__bases__[0].__name__ == base.strip("`")


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
