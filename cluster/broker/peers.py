"""What a node knows of its peers: reachability and which groups they lead.

A node knows the leader of the groups it hosts; for the others (a partition whose replicas are
elsewhere) it asks. Every `POLL_INTERVAL_S` it sends ClusterStatus to each peer over the client
protocol, with a timeout, and keeps the answers: Metadata responses and NOT_LEADER hints use
them, and ClusterStatus reports a peer unreachable when it stops answering.

It dials from the node's own configured host, as the Raft mesh does: the peer's client port
knows that source as a peer's and seats the connection in a slot kept for peers
(`Limits.peer_connections_max`), so clients that fill the peer never cut these polls off.
"""

from __future__ import annotations

import asyncio
import time

from cluster import native as p
from cluster.client import ClientError, Connection
from cluster.config import NodeConfig, Peer

POLL_INTERVAL_S = 0.5
STALE_AFTER_S = 3.0


class PeerWatcher:
    def __init__(self, config: NodeConfig) -> None:
        self._config = config
        self._others = [peer for peer in config.peers if peer.node_id != config.node_id]
        self._seen: dict[int, tuple[float, p.ClusterStatusResponse]] = {}
        self._by_raft_address = {peer.raft_address: peer.node_id for peer in config.peers}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            for peer in self._others:
                tasks.create_task(self._watch(peer))

    async def _watch(self, peer: Peer) -> None:
        timeout_s = self._config.timing.connection_timeout_ms / 1000
        connection: Connection | None = None
        try:
            while True:
                try:
                    if connection is None:
                        connection = await Connection.open(
                            peer.client_address, timeout_s, local_host=self._config.host
                        )
                    status = await connection.request(p.ClusterStatus(), timeout_s)
                    assert isinstance(status, p.ClusterStatusResponse)
                    self._seen[peer.node_id] = (time.monotonic(), status)
                except (OSError, TimeoutError, ClientError):
                    if connection is not None:
                        await connection.close()
                    connection = None
                await asyncio.sleep(POLL_INTERVAL_S)
        finally:
            if connection is not None:
                await connection.close()

    def _fresh(self) -> dict[int, p.ClusterStatusResponse]:
        horizon = time.monotonic() - STALE_AFTER_S
        return {n: status for n, (at, status) in self._seen.items() if at >= horizon}

    def reachable(self, node_id: int) -> bool:
        return node_id == self._config.node_id or node_id in self._fresh()

    def _leading(self, group: str) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        for node_id, status in self._fresh().items():
            for g in status.groups:
                if g.group == group and g.is_leader and (best is None or g.term > best[1]):
                    best = (node_id, g.term)
        return best

    def leader_of(self, topic: str, partition: int) -> int | None:
        found = self._leading(f"{topic}-{partition}")
        return None if found is None else found[0]

    def term_of(self, topic: str, partition: int) -> int:
        found = self._leading(f"{topic}-{partition}")
        return -1 if found is None else found[1]

    def in_sync_of(self, topic: str, partition: int) -> tuple[int, ...]:
        """The replicas in sync of a partition as its leader last reported them (Kafka's
        ISR), by node id; empty when no peer reported leading it lately."""
        found = self._leading(f"{topic}-{partition}")
        if found is None:
            return ()
        node_id, term = found
        for g in self._fresh()[node_id].groups:
            if g.group == f"{topic}-{partition}" and g.is_leader and g.term == term:
                return g.in_sync
        return ()

    def node_of_raft_address(self, address: str | None) -> int | None:
        """The node with this Raft address: one port per node carries all of its groups (the
        mesh), so a group's leader address is its node's `raft_address`, as configured."""
        return None if address is None else self._by_raft_address.get(address)
