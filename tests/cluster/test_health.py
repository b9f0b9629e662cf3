"""A replica that stops replicating is visible, not silent: ClusterStatus, /healthz, /metrics.

A follower is paused with SIGSTOP while records are produced: the leader sees its replicated
index stand still below the commit index and reports the group unhealthy (and /healthz 503);
after SIGCONT it catches up and everything is healthy again.
"""

from __future__ import annotations

import asyncio
import re
import signal
import urllib.request

import pytest

from cli.runtime import load_node_config
from cluster.broker.peers import STALE_AFTER_S, PeerWatcher
from cluster.client import Admin, Client, Producer
from cluster.local import launcher
from cluster.native.peer_talk import NativePeerTalk
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")


def http_get(host: str, port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def group_health(client: Client, address: str, group: str) -> tuple[bool, str]:
    status = await Admin(client).cluster_status(address)
    found = next(g for g in status.groups if g.group == group)
    return found.healthy, found.detail


async def poll_health(
    client: Client, address: str, group: str, want: bool, timeout_s: float = 20
) -> str:
    """The group's health detail once `address` reports it healthy == `want`."""

    async def reported() -> tuple[str] | None:
        healthy, detail = await group_health(client, address, group)
        return (detail,) if healthy == want else None  # a tuple: the detail may be ""

    (detail,) = await apoll_until(reported, timeout_s, f"{group} healthy={want}", interval_s=0.2)
    return detail


async def settled_leader(
    client: Client, cluster: launcher.LocalCluster, group: str
) -> launcher.NodeProcess:
    """The node that leads `group` with every replica in sync. Just after a topic is created,
    the leader a metadata refresh names may not have won its first election yet; on a loaded
    machine another node can win it."""

    async def leading() -> tuple[launcher.NodeProcess] | None:
        for node in cluster.nodes:
            status = await Admin(client).cluster_status(node.client_address)
            found = next((g for g in status.groups if g.group == group), None)
            if found is not None and found.is_leader and len(found.in_sync) == len(cluster.nodes):
                return (node,)
        return None

    (node,) = await apoll_until(leading, 20, f"{group} led with every replica in sync")
    return node


@pytest.mark.alone  # a pause timed against the election timeout
async def test_a_paused_follower_makes_the_leader_report_unhealthy(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    await Admin(client).create_topic("watched", 1, 3)
    leader = await settled_leader(client, three_nodes, "watched-0")
    follower = next(n for n in three_nodes.nodes if n.node_id != leader.node_id)
    assert http_get(leader.host, leader.http_port, "/healthz")[0] == 200

    launcher.kill(follower.pid, signal.SIGSTOP)
    try:
        async with Producer(client) as producer:
            await asyncio.gather(*[await producer.send("watched", b"x") for _ in range(50)])
        detail = await poll_health(client, leader.client_address, "watched-0", want=False)
        assert f"followers not replicating: node {follower.node_id} at " in detail  # not a port
        code, body = http_get(leader.host, leader.http_port, "/healthz")
        assert code == 503
        assert "watched-0" in body
    finally:
        launcher.kill(follower.pid, signal.SIGCONT)
    await poll_health(client, leader.client_address, "watched-0", want=True)

    code, metrics = http_get(leader.host, leader.http_port, "/metrics")
    assert code == 200
    assert 'raftbroker_raft_is_leader{group="watched-0"} 1.0' in metrics
    assert 'raftbroker_requests_total{error="NONE",op="Produce"}' in metrics
    assert "raftbroker_produced_records_total 50.0" in metrics
    # The groups' messages to the follower, and its answers, counted by its Raft address.
    for direction in ("sent", "received"):
        line = f'raftbroker_raft_messages_total{{direction="{direction}",peer="{follower.host}:'
        assert re.search(re.escape(line) + rf'{follower.raft_port}"}} [1-9]', metrics), direction
    assert http_get(leader.host, leader.http_port, "/nope")[0] == 404


async def test_a_peer_heard_from_too_long_ago_counts_as_gone_on_the_watchers_clock(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    """The PeerWatcher of node 1, against the real peers, on a clock the test drives: what a
    peer said is believed for STALE_AFTER_S, then the peer is unreachable and its leadership
    forgotten, without the test waiting for it."""
    await Admin(client).create_topic("peered", 1, 3)
    leader = await settled_leader(client, three_nodes, "peered-0")
    watcher_node = next(n for n in three_nodes.nodes if n.node_id != leader.node_id)
    config = load_node_config(launcher.config_path(three_nodes.data_dir, watcher_node.node_id))
    now_s = [1_000.0]
    talk = NativePeerTalk(config)
    watcher = PeerWatcher(config, talk, clock=lambda: now_s[0])
    try:
        peer = next(p for p in config.peers if p.node_id == leader.node_id)
        assert not watcher.reachable(leader.node_id)  # never heard from
        assert await watcher.poll(peer)
        assert watcher.reachable(leader.node_id)
        assert watcher.leader_of("peered", 0) == leader.node_id
        now_s[0] += STALE_AFTER_S - 0.01
        assert watcher.reachable(leader.node_id)
        now_s[0] += 0.02
        assert not watcher.reachable(leader.node_id)
        assert watcher.leader_of("peered", 0) is None
        assert watcher.reachable(watcher_node.node_id)  # itself, always
    finally:
        await talk.close()
