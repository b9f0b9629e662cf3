"""How a node talks to its peers: over their native listeners, as a client of the protocol.

Role: the `PeerTalk` (cluster/broker/peers.py) the composition root gives the core. Status polls
(ClusterStatus, for `PeerWatcher`) and a transaction coordinator's entries for a partition
hosted elsewhere (PartitionTxnEntry, for `TxnService`: only a peer's address may send one) each
keep one connection per peer, dialled from the node's own host so that the peer seats it as a
peer's; restoration reads (a replica's Fetch, for `NodeDuties`) go through one pooled client. A
peer that does not answer is a value (None, no batches, COORDINATOR_NOT_AVAILABLE), never an
exception: the caller tries again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from cluster import native as p
from cluster.broker.peers import GroupSeen, MissedBatch
from cluster.client import Client, ClientError, Connection
from cluster.config import NodeConfig, Peer
from statemachine.commands import RegisterTxnPartition, WriteTxnMarker
from statemachine.errors import ErrorCode

RESTORE_TIMEOUT_S = 5.0  # one restoration read of up to RESTORE_BYTES from a peer


class NativePeerTalk:
    def __init__(self, config: NodeConfig) -> None:
        self._host = config.host
        others = [peer.client_address for peer in config.peers if peer.node_id != config.node_id]
        self._pool = Client(others or [config.client_address], request_timeout_s=RESTORE_TIMEOUT_S)
        self._status: dict[int, Connection] = {}
        # A coordinator's entries wait up to their write timeout: a lane of their own, so that
        # no status poll waits behind one.
        self._entries: dict[int, Connection] = {}

    async def groups_of(self, peer: Peer, timeout_s: float) -> Sequence[GroupSeen] | None:
        status = await self._ask(self._status, peer, p.ClusterStatus(), timeout_s)
        if status is None:
            return None
        assert isinstance(status, p.ClusterStatusResponse)
        return [GroupSeen(g.group, g.is_leader, g.term, g.in_sync) for g in status.groups]

    async def _ask(
        self, lane: dict[int, Connection], peer: Peer, request: p.Request, timeout_s: float
    ) -> p.Response | None:
        """`request` on `lane`'s connection to `peer`, dialled from this node's host (the peer
        seats it as a peer's); None, and the connection dropped, if it fails. Several requests
        may share the connection (a coordinator registers partitions at once): the first to
        open one keeps it, and a failure drops only the connection it used."""
        connection = lane.get(peer.node_id)
        try:
            if connection is None:
                opened = await Connection.open(
                    peer.client_address, timeout_s, local_host=self._host
                )
                connection = lane.setdefault(peer.node_id, opened)
                if connection is not opened:  # another request opened one meanwhile
                    await opened.close()
            return await connection.request(request, timeout_s)
        except (OSError, TimeoutError, ClientError):
            if connection is not None and lane.get(peer.node_id) is connection:
                del lane[peer.node_id]
                await connection.close()
            return None

    async def batches_from(
        self, peer: Peer, topic: str, partition: int, offset: int, max_bytes: int
    ) -> Sequence[MissedBatch]:
        want = p.FetchPartition(topic, partition, offset, max_bytes)
        request = p.Fetch(0, max_bytes, (want,), replica_read=True)
        with contextlib.suppress(ClientError):
            response = await self._pool.send(peer.client_address, request)
            assert isinstance(response, p.FetchResponse)
            result = response.results[0]
            if result.error == ErrorCode.NONE:
                return [
                    MissedBatch(b.base_offset, b.append_time_ms, b.batch) for b in result.batches
                ]
        return ()

    async def txn_entry(
        self,
        peer: Peer,
        tp: tuple[str, int],
        entry: RegisterTxnPartition | WriteTxnMarker,
        timeout_s: float,
    ) -> ErrorCode:
        marker, epoch = (
            (entry.commit, entry.coordinator_epoch)
            if isinstance(entry, WriteTxnMarker)
            else (p.REGISTRATION, 0)
        )
        request = p.PartitionTxnEntry(
            *tp, entry.producer_id, entry.producer_epoch, entry.txn_sequence, marker, epoch
        )
        response = await self._ask(self._entries, peer, request, timeout_s)
        if response is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert isinstance(response, p.TxnErrorResponse)
        return ErrorCode(response.error)

    async def close(self) -> None:
        connections = [*self._status.values(), *self._entries.values()]
        self._status, self._entries = {}, {}
        for connection in connections:
            await connection.close()
        await self._pool.close()
