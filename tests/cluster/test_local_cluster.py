"""The local cluster's commands, run for real: `raftbroker cluster down` signals only processes
that are its nodes and says what it stopped.

A pid in cluster.json is only a hint: these tests point it at processes that are not nodes
(one with the node's command line but another start time) and check they live on, and start a
node by hand, unrecorded, which `down` must find by its data directory's lock and stop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.broker import layout
from cluster.local import launcher
from tests.cluster.conftest import uses_conventional_ports
from tests.cluster.procs import REPO, stop_recorded_cluster
from tests.cluster.test_cli import raftbroker as cli
from tests.polling import poll_until

# `cluster up` takes the conventional ports when they are free: one test process at a time.
pytestmark = uses_conventional_ports()

CLI_TIMEOUT_S = 90.0


def raftbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout_s=CLI_TIMEOUT_S)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


@pytest.fixture
def strangers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes of the test's own that are no node: killed after the test, whatever it did."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def record(data_dir: Path, pids: list[tuple[int, int]]) -> None:
    """A cluster.json naming `pids` ((pid, start ticks) per node) as nodes 1, 2, ..."""
    nodes = tuple(
        launcher.NodeProcess(i + 1, launcher.host_of(i), 9092, 19092, 8092, pid, ticks)
        for i, (pid, ticks) in enumerate(pids)
    )
    launcher.LocalCluster(data_dir, nodes).save()


def test_down_leaves_processes_that_are_not_its_nodes_alone(
    tmp_path: Path, strangers: list[subprocess.Popen[bytes]]
) -> None:
    config = launcher.config_path(tmp_path, 2)
    # Node 1's pid is a `sleep` (its start time recorded right: only the command line differs).
    # Node 2's runs a command line naming node 2's configuration, but started at another time
    # than recorded (as a pid reused by a new node of another cluster run would be).
    strangers.append(subprocess.Popen(["sleep", "60"]))
    strangers.append(
        subprocess.Popen(["sh", "-c", "sleep 60", "sh", "node", "--config", str(config)])
    )
    sleep_pid, impostor_pid = (proc.pid for proc in strangers)
    sleep_ticks = poll_until(lambda: launcher.process_start_ticks(sleep_pid), 5, "sleep's stat")
    impostor_ticks = poll_until(
        lambda: launcher.process_start_ticks(impostor_pid), 5, "the impostor's stat"
    )
    record(tmp_path, [(sleep_pid, sleep_ticks), (impostor_pid, impostor_ticks - 1)])

    out = ok(raftbroker("cluster", "down", "--data-dir", str(tmp_path)))

    assert all(proc.poll() is None for proc in strangers), "a process that is no node was hit"
    assert out.splitlines() == [
        f"no node of {tmp_path} was running",
        f"node 1: pid {sleep_pid} in cluster.json is another process now: left alone",
        f"node 2: pid {impostor_pid} in cluster.json is another process now: left alone",
    ]


def test_down_says_what_it_stopped_and_finds_a_node_started_by_hand(tmp_path: Path) -> None:
    d = ("--data-dir", str(tmp_path))
    ok(raftbroker("cluster", "up", "--detach", *d))
    try:
        started = launcher.LocalCluster.load(tmp_path)
        assert started is not None
        third = started.nodes[2]
        launcher.kill(third.pid, signal.SIGKILL, wait_s=10)

        out = ok(raftbroker("cluster", "down", *d))

        assert out.splitlines() == [f"stopped 2 nodes of {tmp_path}; node 3 was not running"]
        assert not any(launcher.alive(n.pid) for n in started.nodes)
        assert ok(raftbroker("cluster", "down", *d)).splitlines() == [
            f"no node of {tmp_path} was running"
        ]

        # A node started by hand, from a relative path: cluster.json does not know its pid.
        by_hand = subprocess.Popen(
            [sys.executable, "-m", "cli", "node", "--config", "node1.toml"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            node1_dir = launcher.node_dir(tmp_path, 1)
            poll_until(lambda: layout.lock_holder(node1_dir), 30, "node 1's lock")
            second = raftbroker("node", "--config", str(launcher.config_path(tmp_path, 1)))
            assert second.returncode == 71  # two nodes never share a data directory
            assert f"is in use by process {by_hand.pid}" in second.stderr

            out = ok(raftbroker("cluster", "down", *d))

            assert out.splitlines()[0] == (
                f"stopped 1 node of {tmp_path}; nodes 2, 3 were not running"
            )
            assert by_hand.wait(10) == 0  # SIGTERM: a clean stop
        finally:
            if by_hand.poll() is None:
                by_hand.kill()
                by_hand.wait()
        state = json.loads((tmp_path / launcher.STATE_FILE).read_text())
        assert [n["node_id"] for n in state["nodes"]] == [1, 2, 3]  # kept for the next `up`
    finally:
        stop_recorded_cluster(tmp_path)


def test_up_starts_the_missing_node_of_a_partly_running_cluster(tmp_path: Path) -> None:
    d = ("--data-dir", str(tmp_path))
    first = ok(raftbroker("cluster", "up", "--detach", *d))
    try:
        before = launcher.LocalCluster.load(tmp_path)
        assert before is not None
        # cluster.json records each node's Kafka port, and `up` prints both bootstraps
        assert all(n.kafka_port for n in before.nodes)
        assert f"bootstrap: {','.join(before.bootstrap)}" in first.splitlines()
        assert f"kafka bootstrap: {','.join(before.kafka_bootstrap)}" in first.splitlines()
        launcher.kill(before.nodes[1].pid, signal.SIGKILL, wait_s=10)

        out = ok(raftbroker("cluster", "up", "--detach", *d))

        assert out.splitlines()[:2] == [
            "started node 2 (nodes 1, 3 were running already)",
            f"raftbroker cluster of 3 nodes ready in {tmp_path}",
        ]
        after = launcher.LocalCluster.load(tmp_path)
        assert after is not None
        assert [n.pid for n in after.nodes][::2] == [n.pid for n in before.nodes][::2]
        assert all(launcher.node_pid(after, n) == n.pid for n in after.nodes)
        assert ok(raftbroker("cluster", "up", "--detach", *d)).splitlines()[0] == (
            "all 3 nodes were running already"
        )

        assert ok(raftbroker("cluster", "down", *d)).splitlines() == [
            f"stopped 3 nodes of {tmp_path}"
        ]
        assert not any(launcher.alive(n.pid) for n in after.nodes)
    finally:
        stop_recorded_cluster(tmp_path)


def test_up_reports_a_node_that_dies_at_start_in_one_line_and_never_says_ready(
    tmp_path: Path,
) -> None:
    d = ("--data-dir", str(tmp_path))
    ok(raftbroker("cluster", "up", "--detach", *d))
    ok(raftbroker("cluster", "down", *d))
    cluster = launcher.LocalCluster.load(tmp_path)
    assert cluster is not None
    third = cluster.nodes[2]
    blocker = socket.create_server((third.host, third.client_port))  # a stranger takes its port
    try:
        result = raftbroker("cluster", "up", "--detach", *d)

        assert result.returncode == 1
        assert "ready" not in result.stdout
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("raftbroker: node 3 is not running: cannot run: ")
        assert "address already in use" in result.stderr.lower()
        now = launcher.LocalCluster.load(tmp_path)
        assert now is not None
        assert all(launcher.node_pid(now, n) is None for n in now.nodes)  # none left behind
    finally:
        blocker.close()
        stop_recorded_cluster(tmp_path)
