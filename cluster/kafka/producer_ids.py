"""Producer ids through Kafka's protocol: InitProducerId, and the transaction APIs refused.

Role: the part of a node's Kafka listener (its frontend, frontend.py) that gives out producer
ids and epochs, through the broker core (`Broker.init_producer_id`: the metadata group's
allocator and transactional-id registry, the rules of docs/semantics.md), and refuses the
transaction APIs a client's first transaction sends (no transactions yet).
"""

from __future__ import annotations

import logging
from typing import NoReturn

from cluster.broker.core import Broker
from cluster.errors import RaftbrokerError, RequestRefusedError, quoted
from cluster.kafka import messages as m
from cluster.kafka.dispatch import Call, serves
from statemachine.errors import ErrorCode

log = logging.getLogger(__name__)
PRODUCER_FENCED_SINCE_VERSION = 4  # InitProducerId: older clients know INVALID_PRODUCER_EPOCH


class KafkaProducerIds:
    """InitProducerId, AddPartitionsToTxn and AddOffsetsToTxn, for one node's Kafka listener."""

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
            error = exc.error
            if error == ErrorCode.PRODUCER_FENCED and version < PRODUCER_FENCED_SINCE_VERSION:
                error = ErrorCode.INVALID_PRODUCER_EPOCH
            return m.InitProducerIdResponse(error)
        return m.InitProducerIdResponse(ErrorCode.NONE, answer.producer_id, answer.epoch)

    @serves(m.AddPartitionsToTxnRequest)
    async def add_partitions_to_txn(
        self, request: m.AddPartitionsToTxnRequest, call: Call
    ) -> m.ResponseBody:
        _refuse_transaction(request.v3_and_below_transactional_id, call.source)

    @serves(m.AddOffsetsToTxnRequest)
    async def add_offsets_to_txn(
        self, request: m.AddOffsetsToTxnRequest, call: Call
    ) -> m.ResponseBody:
        _refuse_transaction(request.transactional_id, call.source)


def _refuse_transaction(txn: str, source: str) -> NoReturn:
    """Transactions are not served yet: a transaction's first request (a partition or a
    group's offsets added to it) is refused INVALID_TXN_STATE, which librdkafka and Kafka's
    Java client take as fatal, so the client's first transaction fails at once with its own
    error (librdkafka's "Failed to add partitions to transaction") rather than at its
    timeout. InitProducerId with a transactional id still fences as it did."""
    log.info("transaction of %s from %s refused: not supported yet", quoted(txn), source)
    raise RequestRefusedError(ErrorCode.INVALID_TXN_STATE, "transactions are not supported yet")
