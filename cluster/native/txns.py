"""The native listener's transaction requests, mapped onto the node's transaction coordinator.

Role: FindCoordinator for a transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
DescribeTransactions, ListTransactions, WriteTxnMarkers (an operator's abort) and
PartitionTxnEntry (a peer's coordinator's registration or marker) of the native protocol, in the
terms of `TxnService` (cluster/broker/txns.py), which decides; the Kafka listener's twin is
cluster/kafka/producer_ids.py. TxnOffsetCommit goes to the group coordinator
(cluster/native/groups.py).

Rules: every error is the answer's own `error` field (NOT_COORDINATOR and
CONCURRENT_TRANSACTIONS among them, which a client meets by finding the coordinator again or
retrying), never a refusal of the whole request; the native protocol has no old versions, so
PRODUCER_FENCED is answered as itself.
"""

from __future__ import annotations

from cluster import native as p
from cluster.broker.node import Node
from cluster.broker.txns import TxnService
from cluster.native.groups import coordinator_answer
from statemachine.errors import ErrorCode


class NativeTxns:
    """The transaction requests of one node's native listener."""

    def __init__(self, node: Node, txns: TxnService) -> None:
        self.node = node
        self.txns = txns

    async def handle(self, request: p.Request, source: str) -> p.Response | None:
        """The answer to a transaction request (from `source`, the connection's address);
        None for any other request."""
        txns = self.txns
        match request:
            case p.FindCoordinator(key_type=p.TXN_KEY):
                return await self.find_coordinator(request.key)
            case p.AddPartitionsToTxn():
                asked = [(x.topic, x.partition) for x in request.partitions]
                errors = await txns.add_partitions(
                    request.transactional_id,
                    request.producer_id,
                    request.producer_epoch,
                    list(dict.fromkeys(asked)),
                )
                results = (p.TxnPartitionResult(t, n, errors[(t, n)]) for t, n in asked)
                return p.AddPartitionsToTxnResponse(tuple(results))
            case p.AddOffsetsToTxn():
                error = await txns.add_offsets(
                    request.transactional_id,
                    request.producer_id,
                    request.producer_epoch,
                    request.group,
                )
                return p.TxnErrorResponse(error)
            case p.EndTxn():
                error = await txns.end_txn(
                    request.transactional_id,
                    request.producer_id,
                    request.producer_epoch,
                    request.commit,
                )
                return p.TxnErrorResponse(error)
            case p.WriteTxnMarkers():
                error = await txns.abort_hanging(
                    (request.topic, request.partition),
                    request.producer_id,
                    request.producer_epoch,
                    request.coordinator_epoch,
                )
                return p.TxnErrorResponse(error)
            case p.PartitionTxnEntry():
                error = await txns.peer_entry(
                    source,
                    (request.topic, request.partition),
                    (request.producer_id, request.producer_epoch, request.txn_sequence),
                    None if request.marker == p.REGISTRATION else request.marker,
                    request.coordinator_epoch,
                )
                return p.TxnErrorResponse(error)
            case p.DescribeTransactions():
                described = tuple(self.describe(x) for x in request.transactional_ids)
                return p.DescribeTransactionsResponse(described)
            case p.ListTransactions():
                unknown, listed = txns.listing(
                    request.states, frozenset(request.producer_ids), request.running_ms_min
                )
                return p.ListTransactionsResponse(
                    unknown,
                    tuple(
                        p.ListedTxn(txn_id, txn.producer_id, txn.state.kafka_name)
                        for txn_id, txn in listed
                    ),
                )
        return None

    async def find_coordinator(self, txn_id: str) -> p.FindCoordinatorResponse:
        return coordinator_answer(self.node, *await self.txns.coordinator_node(txn_id))

    def describe(self, txn_id: str) -> p.DescribedTxn:
        txn = self.txns.describe(txn_id)
        if isinstance(txn, ErrorCode):
            return p.DescribedTxn(txn_id, txn, "", 0, -1, -1, -1, ())
        return p.DescribedTxn(
            txn_id,
            ErrorCode.NONE,
            txn.state.kafka_name,
            txn.timeout_ms,
            txn.txn_start_ms,
            txn.producer_id,
            txn.epoch,
            tuple(p.TxnPartition(t, n) for t, n in txn.partitions),
        )
