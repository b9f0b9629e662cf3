"""Fixtures for cluster tests: a real 3-node cluster of `raftbroker node` processes on
127.0.0.2-4, started per test module in a temporary directory and stopped by PID afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from cluster.client import Client
from cluster.local import launcher
from tests.kafka_wire import Captured, capturing

READY_TIMEOUT_S = 60.0
# Shared by every test process of this machine (the two workers of a run, and another run).
CONVENTIONAL_PORTS_LOCK = Path(tempfile.gettempdir()) / "raftbroker-tests-conventional-ports.lock"
# A test that waits for the ports may wait for a whole module that holds them (the README's
# examples: about two minutes) before its own work: its timeout counts the wait.
CONVENTIONAL_PORTS_TIMEOUT_S = 420


@contextlib.contextmanager
def conventional_ports_held() -> Iterator[None]:
    """The conventional ports (`launcher.CONVENTIONAL_PORTS` on 127.0.0.2-4) to this test
    process alone: `cluster up` takes them when they are free, and the README's examples
    need them, so two test workers must not start such clusters at once. A blocking `flock`,
    which the kernel releases with the file however the process ends."""
    with CONVENTIONAL_PORTS_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def conventional_ports() -> Iterator[None]:
    with conventional_ports_held():
        yield


def uses_conventional_ports() -> list[pytest.MarkDecorator]:
    """A module's `pytestmark` when its tests may start clusters on the conventional ports."""
    return [
        pytest.mark.usefixtures("conventional_ports"),
        pytest.mark.timeout(CONVENTIONAL_PORTS_TIMEOUT_S),
    ]


async def wait_ready(cluster: launcher.LocalCluster, timeout_s: float = READY_TIMEOUT_S) -> None:
    await launcher.wait_ready(cluster, timeout_s)


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@contextlib.contextmanager
def running_cluster(data_dir: Path, extra_toml: str = "") -> Iterator[launcher.LocalCluster]:
    """A ready 3-node cluster in `data_dir` (nodes configured with `extra_toml`), stopped after."""
    cluster = launcher.up(data_dir, 3, extra_toml=extra_toml)
    try:
        asyncio.run(wait_ready(cluster))
        yield cluster
    finally:
        launcher.down(cluster.current())


@pytest.fixture(scope="module")
def three_nodes(cluster_dir: Path) -> Iterator[launcher.LocalCluster]:
    with running_cluster(cluster_dir) as cluster:
        yield cluster


@pytest_asyncio.fixture
async def whole_cluster(three_nodes: launcher.LocalCluster) -> launcher.LocalCluster:
    """The module's cluster with every node running and ready, whatever an earlier test left
    (a test that failed between killing a node and restarting it): its current pids."""
    current = three_nodes.current()
    for node in current.nodes:
        if not launcher.alive(node.pid):
            current = launcher.restart_node(current, node.node_id)
    await wait_ready(current)
    return current


GROUP_TOML = """
[timing]
group_initial_rebalance_delay_ms = 200
group_session_timeout_ms_min = 1000
"""


@pytest.fixture(scope="module")
def group_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launcher.LocalCluster]:
    """A cluster per consumer-group module (Kafka's clients, native ones, the CLI): a new
    group's initial rebalance delay cut to 200 ms (not 3 s), and sessions from 1 s allowed, so
    that a crashed member is seen within seconds. Per module, not per package: an idle cluster
    left up through the package's later modules slowed their timing-bound tests."""
    with running_cluster(tmp_path_factory.mktemp("groups"), GROUP_TOML) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kafka_bootstrap(three_nodes: launcher.LocalCluster) -> list[str]:
    """The module's cluster as Kafka clients reach it: each node's Kafka listener."""
    assert three_nodes.kafka_bootstrap, "the local cluster has no Kafka listeners"
    return three_nodes.kafka_bootstrap


@pytest.fixture
def captured() -> Iterator[Captured]:
    """The Kafka clients' logs (kafka-python's, aiokafka's, and librdkafka's where a test hands
    it the logger `librdkafka`) while the test runs."""
    with capturing("kafka", "aiokafka", "librdkafka") as handler:
        yield handler


@pytest_asyncio.fixture
async def client(three_nodes: launcher.LocalCluster) -> AsyncIterator[Client]:
    c = Client(three_nodes.bootstrap, request_timeout_s=5.0)
    try:
        yield c
    finally:
        await c.close()
