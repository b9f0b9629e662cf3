"""What a node knows of its peers: reachability and which groups they lead.

A node knows the leader of the groups it hosts; for the others (a partition whose replicas are
elsewhere) it asks. Every `POLL_INTERVAL_S` it asks each peer, with a timeout, which groups it
holds (`PeerTalk.groups_of`) and keeps the answers: Metadata responses and NOT_LEADER hints use
them, and ClusterStatus reports a peer unreachable when it stops answering.

How a node talks to its peers is a `PeerTalk` the composition root gives it (over the peers'
native listeners: cluster/native/peer_talk.py), so the core names no wire. It dials from the
node's own configured host, as the Raft mesh does: the peer's client port knows that source as
a peer's and seats the connection in a slot kept for peers (`Limits.peer_connections_max`), so
clients that fill the peer never cut these polls off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from cluster.config import NodeConfig, Peer
from statemachine.commands import RegisterTxnPartition, WriteTxnMarker
from statemachine.errors import ErrorCode

POLL_INTERVAL_S = 0.5
STALE_AFTER_S = 3.0


class GroupSeen(NamedTuple):
    """A Raft group as a peer reports holding it; `in_sync` by node id."""

    group: str
    is_leader: bool
    term: int
    in_sync: tuple[int, ...]


class MissedBatch(NamedTuple):
    """A stored batch as a peer replica gives it to one restoring what it missed."""

    base_offset: int
    append_time_ms: int
    batch: bytes


class PeerTalk(Protocol):
    """What a node asks its peers; None or nothing when a peer does not answer in time."""

    async def groups_of(self, peer: Peer, timeout_s: float) -> Sequence[GroupSeen] | None: ...

    async def batches_from(
        self, peer: Peer, topic: str, partition: int, offset: int, max_bytes: int
    ) -> Sequence[MissedBatch]: ...

    async def txn_entry(
        self,
        peer: Peer,
        tp: tuple[str, int],
        entry: RegisterTxnPartition | WriteTxnMarker,
        timeout_s: float,
    ) -> ErrorCode: ...

    async def close(self) -> None: ...


class PeerWatcher:
    """What this node heard from each peer lately: an answer older than `STALE_AFTER_S` on
    `clock` (time.monotonic() in a node; a test drives its own) counts as none."""

    def __init__(
        self, config: NodeConfig, talk: PeerTalk, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._talk = talk
        self._clock = clock
        self._others = [peer for peer in config.peers if peer.node_id != config.node_id]
        self._seen: dict[int, tuple[float, Sequence[GroupSeen]]] = {}
        self._by_raft_address = {peer.raft_address: peer.node_id for peer in config.peers}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            for peer in self._others:
                tasks.create_task(self._watch(peer))

    async def _watch(self, peer: Peer) -> None:
        while True:
            await self.poll(peer)
            await asyncio.sleep(POLL_INTERVAL_S)

    async def poll(self, peer: Peer) -> bool:
        """Ask `peer` once; whether it answered."""
        timeout_s = self._config.timing.connection_timeout_ms / 1000
        groups = await self._talk.groups_of(peer, timeout_s)
        if groups is not None:
            self._seen[peer.node_id] = (self._clock(), groups)
        return groups is not None

    def _fresh(self) -> dict[int, Sequence[GroupSeen]]:
        horizon = self._clock() - STALE_AFTER_S
        return {n: status for n, (at, status) in self._seen.items() if at >= horizon}

    def reachable(self, node_id: int) -> bool:
        return node_id == self._config.node_id or node_id in self._fresh()

    def _leading(self, group: str) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        for node_id, groups in self._fresh().items():
            for g in groups:
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
        for g in self._fresh()[node_id]:
            if g.group == f"{topic}-{partition}" and g.is_leader and g.term == term:
                return g.in_sync
        return ()

    async def txn_entry(
        self, tp: tuple[str, int], entry: RegisterTxnPartition | WriteTxnMarker, timeout_s: float
    ) -> ErrorCode:
        """A transaction coordinator's entry for a partition this node hosts no replica of,
        handed to the peer leading it (`PeerTalk.txn_entry`): its answer, or
        COORDINATOR_NOT_AVAILABLE when no peer reported leading it lately or the one asked
        hosts it no longer."""
        node_id = self.leader_of(*tp)
        peer = next((p for p in self._others if p.node_id == node_id), None)
        if peer is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = await self._talk.txn_entry(peer, tp, entry, timeout_s)
        # A peer that no longer hosts the partition (our view of its leader was stale) is asked
        # again once the peers report anew: retriable, as its client must take it.
        return (
            ErrorCode.COORDINATOR_NOT_AVAILABLE
            if error == ErrorCode.NOT_LEADER_OR_FOLLOWER
            else error
        )

    def node_of_raft_address(self, address: str | None) -> int | None:
        """The node with this Raft address: one port per node carries all of its groups (the
        mesh), so a group's leader address is its node's `raft_address`, as configured."""
        return None if address is None else self._by_raft_address.get(address)
