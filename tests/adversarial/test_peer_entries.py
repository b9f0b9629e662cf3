"""Issue 19, defect 5, its second half, against real node processes: nothing a peer sends
reaches pysyncobj's unpickling.

Stock pysyncobj unpickles a forwarded command and every log entry it applies, and joins and
unpickles chunked entries as they arrive; so a peer that holds the cluster secret and connects
from a node's own address (everything the Raft port can check) could run code on every node.
Here node 3 is killed and the test takes its place: a mesh of its own at node 3's Raft address,
with the cluster's secret, links to nodes 1 and 2, and on every group it sends each of
`hostile_messages`: pickles whose unpickling would create a marker directory. The verdict: no
marker, every node alive, each attacked group reporting itself unhealthy
("N refused peer messages": an operator must look) and a WARNING naming the refusal in the
node's log; then node 3 comes back, nodes 1 and 2 are restarted one at a time (which clears the
report), and `assert_intact` finds the known records as they were.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
from pathlib import Path
from typing import Any

import pytest

from cluster.client import Admin, Client
from cluster.config import Timing
from cluster.local import launcher
from cluster.raft.driver import RaftDriver
from tests.adversarial.conftest import Known, assert_intact, current_cluster
from tests.polling import apoll_until
from tests.raft_groups import loopback_mesh

pytestmark = pytest.mark.asyncio(loop_scope="function")

LINK_TIMEOUT_S = 15.0
REPORT_TIMEOUT_S = 15.0
RESTART_TIMEOUT_S = 60.0
REFUSED_PER_GROUP = 4  # the messages of `hostile_messages`


class _Marker:
    """A pickle whose unpickling creates `path` (os.mkdir, by reference): proof of execution
    in whichever process unpickles it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.path),)


def hostile_messages(marker: Path) -> list[dict[str, Any]]:
    """A forwarded command and an appended entry without our prefix (stock pysyncobj
    unpickles them), and a chunked entry (joined and unpickled as its last chunk arrives)."""
    foreign = bytes([0]) + pickle.dumps(_Marker(marker / "entry"))  # REGULAR, then a pickle
    chunk = pickle.dumps(_Marker(marker / "chunk"))
    append = {"type": "append_entries", "term": 1, "commit_index": 0, "prevLogIdx": 0}
    append["prevLogTerm"] = 0
    return [
        {"type": "apply_command", "command": bytes([0]) + pickle.dumps(_Marker(marker / "cmd"))},
        {**append, "entries": [(foreign, 1, 1)]},
        {**append, "transmission": "start", "data": chunk},
        {**append, "transmission": "finish", "data": b""},
    ]


class _Deaf:
    """Plays node 3's replicas: hears everything, answers nothing."""

    def peer_connected(self, address: str) -> None:
        pass

    def peer_disconnected(self, address: str) -> None:
        pass

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        pass


async def group_details(client: Client, node: launcher.NodeProcess) -> dict[str, str]:
    """Each group's health detail on `node` ('' when healthy)."""
    status = await Admin(client).cluster_status(node.client_address)
    return {g.group: ("" if g.healthy else g.detail) for g in status.groups}


async def group_routes(client: Client, groups: list[str]) -> list[str]:
    """The mesh's names of `groups`: a partition's route carries its topic id as well, so that
    a deleted topic's group is never confused with a new one of the same name."""
    metadata = await Admin(client).describe_topics()
    ids = {f"{t.name}-{p.partition}": t.topic_id for t in metadata.topics for p in t.partitions}
    return [f"{g}.{ids[g]}" if g in ids else g for g in groups]


async def test_no_peer_message_is_ever_unpickled(known: Known, tmp_path: Path) -> None:
    cluster = current_cluster(known)
    node1, node2, node3 = cluster.nodes
    secret = launcher.existing_secret(cluster.data_dir)
    assert secret is not None
    marker = tmp_path / "unpickled"
    marker.mkdir()
    client = Client(cluster.bootstrap, request_timeout_s=5.0)
    try:
        groups = sorted(await group_details(client, node1))
        routes = await group_routes(client, groups)
        launcher.kill(node3.pid, wait_s=10.0)
        await impersonate(node3, (node1, node2), secret, routes, marker)

        async def all_refused() -> bool:
            assert list(marker.iterdir()) == [], "a peer's pickle was unpickled"
            for node in (node1, node2):
                details = await group_details(client, node)
                wanted = f"{REFUSED_PER_GROUP} refused peer messages"
                if any(wanted not in details.get(g, "") for g in groups):
                    return False
            return True

        await apoll_until(all_refused, REPORT_TIMEOUT_S, "every attacked group to report it")
    finally:
        await client.close()
    assert list(marker.iterdir()) == [], "a peer's pickle was unpickled"
    for node in (node1, node2):
        assert launcher.alive(node.pid), f"node {node.node_id} died"
        log = (cluster.data_dir / f"node{node.node_id}.log").read_text(errors="replace")
        # The first refusal of each group is logged (then the 10th, 100th, ...), at WARNING.
        refusals = [line for line in log.splitlines() if "refused a message from" in line]
        assert len(refusals) == len(routes), refusals
        assert all(" WARNING " in line and node3.host in line for line in refusals)
    await bring_back(known)
    await assert_intact(known)


async def impersonate(
    node: launcher.NodeProcess,
    peers: tuple[launcher.NodeProcess, ...],
    secret: str,
    routes: list[str],
    marker: Path,
) -> None:
    """As `node` (dead), from its address, with the secret: send `hostile_messages` on every
    group's route to every peer."""
    addresses = [f"{p.host}:{p.raft_port}" for p in peers]
    settings = dataclasses.replace(
        loopback_mesh(f"{node.host}:{node.raft_port}", tuple(addresses)), secret=secret
    )
    driver = RaftDriver(Timing(), settings)
    driver.start()
    try:
        mesh = driver.mesh
        for route in routes:
            mesh.register(route, _Deaf())
        await apoll_until(
            lambda: all(mesh.is_open(a) for a in addresses), LINK_TIMEOUT_S, "links to the peers"
        )
        for address in addresses:
            for route in routes:
                for message in hostile_messages(marker):
                    assert mesh.send(address, route, message), (address, route)
    finally:
        driver.stop()


async def bring_back(known: Known) -> None:
    """Node 3 back; nodes 1 and 2 restarted one at a time, each ready before the next."""
    cluster = launcher.restart_node(current_cluster(known), 3)
    await launcher.wait_ready(cluster, RESTART_TIMEOUT_S)
    for node_id in (1, 2):
        node = next(n for n in current_cluster(known).nodes if n.node_id == node_id)
        launcher.kill(node.pid, signal.SIGTERM, wait_s=RESTART_TIMEOUT_S)
        cluster = launcher.restart_node(current_cluster(known), node_id)
        await launcher.wait_ready(cluster, RESTART_TIMEOUT_S)
