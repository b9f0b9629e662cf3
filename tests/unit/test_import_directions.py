"""Which code may import what: the layering and the one-adapter-per-library rules, checked on the
syntax tree of every .py file of the shipped packages (those pyproject.toml lists).

- statemachine/ imports nothing of ours outside statemachine/ (test_purity.py keeps it free of
  I/O, clocks and randomness);
- cluster/client/ never imports cluster.broker or cluster.raft: the library users import stays
  apart from the node process;
- cluster/broker/ (the broker core) never imports a listener, a wire or the client library
  (cluster.kafka, cluster.native, cluster.client, which speaks the native wire): the listeners
  sit on the core and translate, a node talks to its peers through the `PeerTalk` it is given,
  and cluster/service.py, the composition root, joins them;
- the two listeners stand apart: cluster/native/ and cluster/kafka/ never import each other,
  and the native protocol itself (cluster/native/ but its listener modules: wire.py,
  frontend.py, groups.py, txns.py, peer_talk.py) imports neither the broker nor the Raft
  layer, so the client library that speaks it carries no node;
- the tools (cluster.chaos, the fault-injection harness, and cluster.local, the local
  cluster's launcher) are imported only by each other, by cli/ (their commands) and by
  cluster/chaos's own modules: nothing of the broker, the Raft layer, the client library or
  the Spark source depends on them;
- pysyncobj is imported only by cluster/raft/adapter/, uvloop only in cli/, msgpack only by
  cluster/native/codec.py (the wire) and statemachine/codec.py (the replicated state), aiokafka
  only by cluster/client/batches.py (its C reader of record batches), cramjam only by
  statemachine/compression.py (the codecs of compressed batches), kio only by
  cluster/kafka/codec/ (the Kafka wire), confluent_kafka only by
  cluster/chaos/kafka_clients.py and kafka_txns.py (the chaos workload's Kafka clients and
  transactions: a `dev` dependency, imported only for `chaos run --client kafka`).

An import is any `import`, `from ... import` (relative ones resolved; `from cluster import broker`
counts as importing cluster.broker), whether at module level, in a function or under
TYPE_CHECKING, and any `importlib.import_module` or `__import__` call with a literal name.
bench/, the benchmark harness, is not shipped and is outside these rules: it measures bare
msgpack and runs on uvloop as the node does.

Each rule has a negative test: a small source that breaks it, which the checker must report.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]


def shipped_packages(root: Path = ROOT) -> list[str]:
    """The top-level import packages pyproject.toml ships."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    listed: list[str] = config["tool"]["setuptools"]["packages"]
    return sorted({name.split(".")[0] for name in listed})


OURS = frozenset(shipped_packages())
SOURCES = sorted(p for top in OURS for p in (ROOT / top).rglob("*.py"))


def module_of(path: str) -> tuple[str, bool]:
    """A repository-relative file's dotted module name, and whether it is a package's __init__."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def resolve(path: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from` import names (`from .. import x` in cluster/client/a.py is
    `cluster`)."""
    if node.level == 0:
        return node.module or ""
    module, is_package = module_of(path)
    base = module.split(".")
    drop = node.level - 1 if is_package else node.level
    anchor = base[: len(base) - drop]
    return ".".join([*anchor, *([node.module] if node.module else [])])


class Import(NamedTuple):
    line: int
    modules: tuple[str, ...]  # what the statement may import: `from m import a` is m and m.a


def imports(path: str, tree: ast.AST) -> Iterator[Import]:
    """Every import statement of the file, with the module names it may import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield Import(node.lineno, tuple(alias.name for alias in node.names))
        elif isinstance(node, ast.ImportFrom):
            module = resolve(path, node)
            names = (f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
            yield Import(node.lineno, (module, *names))
        elif isinstance(node, ast.Call) and dynamic_import(node):
            argument = node.args[0]
            assert isinstance(argument, ast.Constant) and isinstance(argument.value, str)
            yield Import(node.lineno, (argument.value,))


def dynamic_import(call: ast.Call) -> bool:
    """`importlib.import_module("m")` or `__import__("m")` with a literal name."""
    func = call.func
    named = (isinstance(func, ast.Name) and func.id in {"__import__", "import_module"}) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    first = call.args[0] if call.args else None
    return named and isinstance(first, ast.Constant) and isinstance(first.value, str)


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@dataclass(frozen=True)
class Rule:
    """Modules that `about` selects may be imported only by files that `allowed` admits."""

    name: str
    about: Callable[[str], bool]
    allowed: Callable[[str], bool]


# The native listener: the modules of cluster/native/ that sit on the broker core.
NATIVE_LISTENER = frozenset(
    f"cluster/native/{name}.py" for name in ("wire", "frontend", "groups", "txns", "peer_talk")
)
RULES = (
    Rule(
        "statemachine/ imports nothing of ours outside statemachine/",
        lambda m: m.split(".")[0] in OURS and not within(m, "statemachine"),
        lambda path: not path.startswith("statemachine/"),
    ),
    Rule(
        "cluster/client/ never imports cluster.broker or cluster.raft",
        lambda m: within(m, "cluster.broker") or within(m, "cluster.raft"),
        lambda path: not path.startswith("cluster/client/"),
    ),
    Rule(
        "cluster/broker/ never imports a listener, a wire or the client library",
        lambda m: any(within(m, p) for p in ("cluster.kafka", "cluster.native", "cluster.client")),
        lambda path: not path.startswith("cluster/broker/"),
    ),
    Rule(
        "the native protocol imports neither the broker nor the Raft layer",
        lambda m: within(m, "cluster.broker") or within(m, "cluster.raft"),
        lambda path: not path.startswith("cluster/native/") or path in NATIVE_LISTENER,
    ),
    Rule(
        "cluster/native/ never imports the Kafka listener",
        lambda m: within(m, "cluster.kafka"),
        lambda path: not path.startswith("cluster/native/"),
    ),
    Rule(
        "cluster/kafka/ never imports the native protocol or listener",
        lambda m: within(m, "cluster.native"),
        lambda path: not path.startswith("cluster/kafka/"),
    ),
    Rule(
        "the tools (cluster.chaos, cluster.local) are imported only by tools and cli/",
        lambda m: within(m, "cluster.chaos") or within(m, "cluster.local"),
        lambda path: path.startswith(("cluster/chaos/", "cluster/local/", "cli/")),
    ),
    Rule(
        "pysyncobj is imported only by cluster/raft/adapter/",
        lambda m: within(m, "pysyncobj"),
        lambda path: path.startswith("cluster/raft/adapter/"),
    ),
    Rule(
        "uvloop is imported only in cli/",
        lambda m: within(m, "uvloop"),
        lambda path: path.startswith("cli/"),
    ),
    Rule(
        "kio is imported only by cluster/kafka/codec/",
        lambda m: within(m, "kio"),
        lambda path: path.startswith("cluster/kafka/codec/"),
    ),
    Rule(
        "msgpack is imported only by cluster/native/codec.py and statemachine/codec.py",
        lambda m: within(m, "msgpack"),
        lambda path: path in {"cluster/native/codec.py", "statemachine/codec.py"},
    ),
    Rule(
        "aiokafka is imported only by cluster/client/batches.py",
        lambda m: within(m, "aiokafka"),
        lambda path: path == "cluster/client/batches.py",
    ),
    Rule(
        "confluent_kafka is imported only by cluster/chaos/kafka_clients.py and kafka_txns.py",
        lambda m: within(m, "confluent_kafka"),
        lambda path: path in {"cluster/chaos/kafka_clients.py", "cluster/chaos/kafka_txns.py"},
    ),
    Rule(
        "cramjam is imported only by statemachine/compression.py",
        lambda m: within(m, "cramjam"),
        lambda path: path == "statemachine/compression.py",
    ),
)


def violations(path: str, source: str) -> list[str]:
    """Each import of the file at `path` (repository-relative) that a rule forbids, named."""
    found = sorted(imports(path, ast.parse(source, filename=path)))
    return [
        f"{rule.name}: line {line} imports {', '.join(m for m in modules if rule.about(m))}"
        for rule in RULES
        if not rule.allowed(path)
        for line, modules in found
        if any(rule.about(m) for m in modules)
    ]


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_rules_see_every_shipped_package() -> None:
    assert {"statemachine", "cluster", "cli", "pipeline"} <= OURS
    assert any(relative(p).startswith("cluster/client/") for p in SOURCES)
    assert len(SOURCES) >= 40


@pytest.mark.parametrize("path", SOURCES, ids=relative)
def test_imports_go_only_where_the_rules_allow(path: Path) -> None:
    assert violations(relative(path), path.read_text()) == []


# -- the checker catches each kind of break ---------------------------------------------------

BREAKS = [
    ("statemachine/partition.py", "from cluster.native import Produce\n"),
    ("statemachine/sub/table.py", "import cli.main\n"),
    ("statemachine/codec.py", "def f():\n    from pipeline import sink\n"),
    ("cluster/client/__init__.py", "import cluster.broker\n"),
    ("cluster/client/sync.py", "from cluster import broker\n"),
    ("cluster/client/fenced.py", "from cluster.raft.mesh import Mesh\n"),
    ("cluster/client/fenced.py", "from .. import raft\n"),
    ("cluster/client/fenced.py", "from ..broker.node import Node\n"),
    ("cluster/client/sync.py", "import importlib\nimportlib.import_module('cluster.broker')\n"),
    ("cluster/raft/__init__.py", "from pysyncobj import SyncObj\n"),
    ("cluster/broker/node.py", "from cluster.kafka.wire import KafkaWire\n"),
    ("cluster/broker/groups.py", "def f():\n    from ..kafka import groups\n"),
    ("cluster/broker/server.py", "from cluster.local import launcher\n"),
    ("cluster/broker/peers.py", "from cluster import native as p\n"),
    ("cluster/broker/duties.py", "from cluster.client import ClientError, Client\n"),
    ("cluster/broker/core.py", "from cluster.native.frontend import NativeFrontend\n"),
    ("cluster/native/codec.py", "from cluster.broker.node import Node\n"),
    ("cluster/native/messages/groups.py", "from cluster.raft import GroupStatus\n"),
    ("cluster/native/messages/groups.py", "from cluster.kafka import messages\n"),
    ("cluster/native/frontend.py", "from cluster.kafka.frontend import KafkaFrontend\n"),
    ("cluster/kafka/codec/headers.py", "from cluster.native import ProtocolError\n"),
    ("cluster/kafka/frontend.py", "from cluster import native as p\n"),
    ("cluster/kafka/groups.py", "from cluster.native.groups import NativeGroups\n"),
    ("cluster/raft/driver.py", "import cluster.chaos.power\n"),
    ("pipeline/broker.py", "from cluster.local.launcher import up\n"),
    ("cluster/raft/group.py", "import pysyncobj.journal\n"),
    ("cluster/service.py", "import uvloop\n"),
    ("pipeline/sink.py", "def run():\n    import uvloop\n"),
    ("cluster/client/__init__.py", "import msgpack\n"),
    ("statemachine/partition.py", "from msgpack import packb\n"),
    ("cluster/raft/adapter/transport.py", "__import__('msgpack')\n"),
    ("cluster/raft/driver.py", "from pysyncobj.node import TCPNode\n"),
    ("cluster/client/consumer.py", "from aiokafka.record import default_records\n"),
    ("cluster/broker/core.py", "import cramjam\n"),
    ("statemachine/records.py", "import cramjam\n"),
    ("cluster/kafka/frontend.py", "from kio.schema.errors import ErrorCode\n"),
    ("cluster/broker/server.py", "import kio.serial\n"),
    ("cluster/chaos/runner.py", "from confluent_kafka import Producer\n"),
    ("cluster/chaos/workload.py", "def f():\n    import confluent_kafka.admin\n"),
]


@pytest.mark.parametrize(("path", "source"), BREAKS, ids=[f"{p}:{s}" for p, s in BREAKS])
def test_the_checker_reports_a_break(path: str, source: str) -> None:
    assert violations(path, source), f"{source!r} in {path} went unnoticed"


ALLOWED = [
    ("statemachine/partition.py", "from statemachine.codec import pack\nimport zlib\n"),
    ("cluster/client/__init__.py", "from cluster import protocol as p\nfrom . import sync\n"),
    ("cluster/broker/node.py", "from cluster.raft import RaftGroup\nimport cluster.config\n"),
    ("cluster/native/frontend.py", "from cluster.broker.core import Broker\n"),
    ("cluster/native/peer_talk.py", "from cluster.client import Client\n"),
    ("cluster/raft/adapter/replica.py", "from pysyncobj import SyncObj\n"),
    ("cluster/service.py", "from cluster.kafka.wire import KafkaWire\n"),
    ("cluster/kafka/frontend.py", "from cluster.broker.core import Broker\n"),
    ("cli/chaos_cmd.py", "from cluster.chaos.runner import run_chaos\n"),
    ("cluster/chaos/runner.py", "from cluster.local import launcher\n"),
    ("cli/runtime.py", "def run():\n    import uvloop\n"),
    ("cluster/native/codec.py", "import msgpack\n"),
    ("statemachine/codec.py", "import msgpack\n"),
    ("cluster/client/batches.py", "from aiokafka.record.default_records import X\n"),
    ("statemachine/compression.py", "import cramjam\n"),
    (
        "cluster/kafka/codec/reader.py",
        "import kio.serial\nfrom kio.index import load_request_schema\n",
    ),
    ("cluster/chaos/kafka_clients.py", "from confluent_kafka import Consumer\n"),
]


@pytest.mark.parametrize(("path", "source"), ALLOWED, ids=[f"{p}:{s}" for p, s in ALLOWED])
def test_the_checker_lets_an_allowed_import_through(path: str, source: str) -> None:
    assert violations(path, source) == []


def test_relative_imports_resolve_against_the_package() -> None:
    def resolved(path: str, source: str) -> str:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ImportFrom)
        return resolve(path, node)

    assert resolved("cluster/client/fenced.py", "from . import x") == "cluster.client"
    assert resolved("cluster/client/fenced.py", "from .. import x") == "cluster"
    assert resolved("cluster/client/__init__.py", "from . import x") == "cluster.client"
    assert resolved("cluster/client/__init__.py", "from ..raft import x") == "cluster.raft"
