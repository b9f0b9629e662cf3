"""A node whose Raft port is taken stops at once with a clear error, and starts once it is free.

Every group of a node shares its one Raft port (cluster/mesh.py), so a taken port is a
configuration problem of the whole node, not of one partition: it must fail loudly at start,
not run half-connected.
"""

from __future__ import annotations

import socket
from pathlib import Path

from cluster.local import launcher
from tests.cluster.procs import running, spawn
from tests.polling import poll_until


def test_a_taken_raft_port_stops_the_node_with_a_clear_error(tmp_path: Path) -> None:
    cluster = launcher.up(tmp_path, 3)
    launcher.down(cluster)
    node = cluster.nodes[0]
    blocker = socket.create_server((node.host, node.raft_port))
    log = tmp_path / "blocked.log"
    config = tmp_path / f"node{node.node_id}.toml"
    try:
        proc = spawn(["-m", "cli", "node", "--config", str(config)], log)
        with running([proc]):
            poll_until(lambda: proc.poll() is not None, 30, "the node to give up")
        assert proc.returncode == 71
        text = log.read_text()
        assert f"cannot listen for Raft peers on {node.host}:{node.raft_port}" in text
        assert "Traceback" not in text
    finally:
        blocker.close()
    proc = spawn(["-m", "cli", "node", "--config", str(config)], tmp_path / "free.log")
    with running([proc]):
        poll_until(lambda: "serving clients" in (tmp_path / "free.log").read_text(), 30, "the node")
        assert proc.poll() is None
