"""Producer ids and transactions through Kafka's protocol: InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions, and WriteTxnMarkers for an
operator's abort of a hanging transaction.

Role: the part of a node's Kafka listener (its frontend, frontend.py) that translates these
requests for the broker core (`Broker.init_producer_id`, and its transaction coordinator
`Broker.txns`, cluster/broker/txns.py: the rules of docs/semantics.md) and back, with
Kafka's version rules (PRODUCER_FENCED is INVALID_PRODUCER_EPOCH to older clients).
"""

from __future__ import annotations

from cluster.broker.core import Broker
from cluster.errors import RaftbrokerError
from cluster.kafka import messages as m
from cluster.kafka.dispatch import Call, serves
from statemachine.errors import ErrorCode

PRODUCER_FENCED_SINCE_VERSION = 4  # InitProducerId: older clients know INVALID_PRODUCER_EPOCH
TXN_FENCED_SINCE_VERSION = 2  # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: the same


def _fenced_as(error: ErrorCode, version: int, since: int) -> ErrorCode:
    """PRODUCER_FENCED as a client of `version` knows it."""
    if error == ErrorCode.PRODUCER_FENCED and version < since:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


class KafkaProducerIds:
    """InitProducerId and the transaction APIs, for one node's Kafka listener."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @serves(m.InitProducerIdRequest)
    async def init_producer_id(
        self, request: m.InitProducerIdRequest, call: Call
    ) -> m.InitProducerIdResponse:
        version = call.version
        txn = request.transactional_id
        if txn is None:
            # Kafka gives an idempotent producer a new id whatever it passes (KIP-360's bump
            # is for transactional ids; an idempotent producer bumps its epoch by itself).
            asked: tuple[str, int, int, int] = ("", 0, -1, -1)
        elif not txn:
            return m.InitProducerIdResponse(ErrorCode.INVALID_REQUEST)
        elif request.transaction_timeout <= 0:
            return m.InitProducerIdResponse(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        elif request.producer_id < -1 or request.producer_epoch < -1:
            return m.InitProducerIdResponse(ErrorCode.INVALID_REQUEST)
        else:
            asked = (txn, request.transaction_timeout, request.producer_id, request.producer_epoch)
        try:
            answer = await self.broker.init_producer_id(*asked)
        except RaftbrokerError as exc:
            return m.InitProducerIdResponse(
                _fenced_as(exc.error, version, PRODUCER_FENCED_SINCE_VERSION)
            )
        return m.InitProducerIdResponse(ErrorCode.NONE, answer.producer_id, answer.epoch)

    @serves(m.AddPartitionsToTxnRequest)
    async def add_partitions_to_txn(
        self, request: m.AddPartitionsToTxnRequest, call: Call
    ) -> m.AddPartitionsToTxnResponse:
        """Each partition's error: NONE once it is in the transaction and registered with its
        own Raft group, so the producer's batches to it are taken."""
        asked = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        errors = await self.broker.txns.add_partitions(
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            list(dict.fromkeys(asked)),
        )
        return m.AddPartitionsToTxnResponse(
            tuple(
                m.AddPartitionsToTxnTopicResult(
                    t.name,
                    tuple(
                        m.AddPartitionsToTxnPartitionResult(
                            p,
                            _fenced_as(errors[(t.name, p)], call.version, TXN_FENCED_SINCE_VERSION),
                        )
                        for p in t.partitions
                    ),
                )
                for t in request.v3_and_below_topics
            )
        )

    @serves(m.EndTxnRequest)
    async def end_txn(self, request: m.EndTxnRequest, call: Call) -> m.EndTxnResponse:
        """NONE once the transaction is prepared to commit or abort (its markers follow)."""
        error = await self.broker.txns.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed
        )
        return m.EndTxnResponse(_fenced_as(error, call.version, TXN_FENCED_SINCE_VERSION))

    @serves(m.DescribeTransactionsRequest)
    async def describe_transactions(
        self, request: m.DescribeTransactionsRequest, _call: Call
    ) -> m.DescribeTransactionsResponse:
        """Each id's transaction, from its coordinator (kafka-transactions.sh describe)."""
        return m.DescribeTransactionsResponse(
            tuple(self._described(txn_id) for txn_id in request.transactional_ids)
        )

    def _described(self, txn_id: str) -> m.DescribedTransaction:
        txn = self.broker.txns.describe(txn_id)
        if isinstance(txn, ErrorCode):
            return m.DescribedTransaction(txn, txn_id)
        topics: dict[str, list[int]] = {}
        for topic, partition in txn.partitions:
            topics.setdefault(topic, []).append(partition)
        return m.DescribedTransaction(
            ErrorCode.NONE,
            txn_id,
            txn.state.kafka_name,
            txn.timeout_ms,
            # Kafka says -1 for an id with no transaction yet; kio, the Python clients' codec,
            # cannot read a negative time, so 0 (the Java Admin shows it as a time, not None).
            max(txn.txn_start_ms, 0),
            txn.producer_id,
            txn.epoch,
            tuple(m.TopicData(t, tuple(ps)) for t, ps in sorted(topics.items())),
        )

    @serves(m.ListTransactionsRequest)
    async def list_transactions(
        self, request: m.ListTransactionsRequest, _call: Call
    ) -> m.ListTransactionsResponse:
        """The transactional ids this node coordinates, filtered as asked; a state name Kafka
        does not have is answered in `unknown_state_filters` (kafka-transactions.sh list)."""
        unknown, listed = self.broker.txns.listing(
            request.state_filters, frozenset(request.producer_id_filters), request.duration_filter
        )
        return m.ListTransactionsResponse(
            ErrorCode.NONE,
            unknown,
            tuple(
                m.ListedTransaction(txn_id, txn.producer_id, txn.state.kafka_name)
                for txn_id, txn in listed
            ),
        )

    @serves(m.WriteTxnMarkersRequest)
    async def write_txn_markers(
        self, request: m.WriteTxnMarkersRequest, _call: Call
    ) -> m.WriteTxnMarkersResponse:
        """An operator's abort (kafka-transactions.sh abort, the Admin client's
        `abortTransaction`): an abort marker on each named partition this node leads. A commit
        marker is the coordinator's alone: INVALID_REQUEST."""
        results = []
        for marker in request.markers:
            topics = []
            for topic in marker.topics:
                partitions = []
                for index in topic.partition_indexes:
                    if marker.transaction_result:
                        error = ErrorCode.INVALID_REQUEST
                    else:
                        error = await self.broker.txns.abort_hanging(
                            (topic.name, index),
                            marker.producer_id,
                            marker.producer_epoch,
                            marker.coordinator_epoch,
                        )
                    partitions.append(m.WritableTxnMarkerPartitionResult(index, error))
                topics.append(m.WritableTxnMarkerTopicResult(topic.name, tuple(partitions)))
            results.append(m.WritableTxnMarkerResult(marker.producer_id, tuple(topics)))
        return m.WriteTxnMarkersResponse(tuple(results))

    @serves(m.AddOffsetsToTxnRequest)
    async def add_offsets_to_txn(
        self, request: m.AddOffsetsToTxnRequest, call: Call
    ) -> m.AddOffsetsToTxnResponse:
        """NONE once the group's offsets partition is in the transaction and registered, so
        the group's coordinator takes the producer's TxnOffsetCommit."""
        error = await self.broker.txns.add_offsets(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
        return m.AddOffsetsToTxnResponse(_fenced_as(error, call.version, TXN_FENCED_SINCE_VERSION))
