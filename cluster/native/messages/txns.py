"""The transactions' requests, as Kafka's: AddPartitionsToTxn, AddOffsetsToTxn and EndTxn to
the transaction coordinator (FindCoordinator with `TXN_KEY` names it), DescribeTransactions and
ListTransactions for administrators (KIP-664; ListTransactions asks one node, of the ids it
coordinates), WriteTxnMarkers for an operator's abort of a hanging transaction, to the
partition's leader, and PartitionTxnEntry, one node's coordinator to another node's partition.
TxnOffsetCommit, to the group's coordinator, is with the groups' requests.
cluster/broker/txns.py decides; docs/semantics.md, "Transactions", has the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cluster.native.messages.base import Op, Request, Response
from cluster.native.schema import (
    NAME_RULE,
    OFFSET_RULE,
    Struct,
    at_most,
    error_field,
    flag_field,
    int_field,
    many_field,
    name_field,
    partition_field,
    per_request,
    str_field,
)
from statemachine.commands import INT32_MAX
from statemachine.fields import StrRule
from statemachine.limits import DEFAULT_LIMITS
from statemachine.records import INT64_MAX, PRODUCER_EPOCH_MAX

STATE_CHARS_MAX = 32  # a state's name, as Kafka's tools print it ("PrepareCommit")
_STATES_MAX = 8  # Kafka's seven, and one it does not know
STATE_RULE = StrRule(STATE_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class TxnPartition(Struct):
    topic: str = name_field()
    partition: int = partition_field()


@dataclass(frozen=True, slots=True)
class TxnPartitionResult(Struct):
    topic: str = name_field()
    partition: int = partition_field()
    error: int = error_field()


@dataclass(frozen=True, slots=True)
class TxnErrorResponse(Response):
    """The answer of a request about one transaction: its error (NONE: done)."""

    error: int = error_field()


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnResponse(Response):
    results: tuple[TxnPartitionResult, ...] = many_field(TxnPartitionResult, per_request)


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxn(Request):
    """Partitions join the producer's transaction: NONE for each once its own Raft group has
    registered it, so the producer's transactional batches to it are taken."""

    OP: ClassVar[Op] = Op.ADD_PARTITIONS_TO_TXN
    RESPONSE: ClassVar[type[Response]] = AddPartitionsToTxnResponse
    transactional_id: str = name_field()
    producer_id: int = int_field(0, INT64_MAX)
    producer_epoch: int = int_field(0, PRODUCER_EPOCH_MAX)
    partitions: tuple[TxnPartition, ...] = many_field(TxnPartition, per_request)


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxn(Request):
    """The group's offsets join the transaction (then TxnOffsetCommit to its coordinator)."""

    OP: ClassVar[Op] = Op.ADD_OFFSETS_TO_TXN
    RESPONSE: ClassVar[type[Response]] = TxnErrorResponse
    transactional_id: str = name_field()
    producer_id: int = int_field(0, INT64_MAX)
    producer_epoch: int = int_field(0, PRODUCER_EPOCH_MAX)
    group: str = name_field()


@dataclass(frozen=True, slots=True)
class EndTxn(Request):
    """Commit or abort: answered once the decision is committed; the markers follow."""

    OP: ClassVar[Op] = Op.END_TXN
    RESPONSE: ClassVar[type[Response]] = TxnErrorResponse
    transactional_id: str = name_field()
    producer_id: int = int_field(0, INT64_MAX)
    producer_epoch: int = int_field(0, PRODUCER_EPOCH_MAX)
    commit: bool = flag_field()


@dataclass(frozen=True, slots=True)
class WriteTxnMarkers(Request):
    """An operator's abort of the producer's transaction open on one partition (Kafka's
    WriteTxnMarkers as `kafka-transactions.sh abort` sends it), to the partition's leader.
    `coordinator_epoch` is the partition's (DescribeProducers gives it)."""

    OP: ClassVar[Op] = Op.WRITE_TXN_MARKERS
    RESPONSE: ClassVar[type[Response]] = TxnErrorResponse
    topic: str = name_field()
    partition: int = partition_field()
    producer_id: int = int_field(0, INT64_MAX)
    producer_epoch: int = int_field(0, PRODUCER_EPOCH_MAX)
    coordinator_epoch: int = int_field(0, INT32_MAX)


# PartitionTxnEntry's `marker`: a registration, else the marker's result (0 abort, 1 commit).
REGISTRATION = -1


@dataclass(frozen=True, slots=True)
class PartitionTxnEntry(Request):
    """A transaction coordinator's entry for a partition's own Raft group, sent by the
    coordinator's node to the partition's leader when it hosts no replica of the partition
    (only a replica can propose into a group): the registration of the producer's
    transaction `txn_sequence` there (`marker` REGISTRATION), or its end marker (0 abort,
    1 commit) fenced by `coordinator_epoch`. Answered once the partition's group applied it:
    NONE, or the partition's refusal (Kafka's codes)."""

    OP: ClassVar[Op] = Op.PARTITION_TXN_ENTRY
    RESPONSE: ClassVar[type[Response]] = TxnErrorResponse
    topic: str = name_field()
    partition: int = partition_field()
    producer_id: int = int_field(0, INT64_MAX)
    producer_epoch: int = int_field(0, PRODUCER_EPOCH_MAX)
    txn_sequence: int = int_field(0, INT64_MAX)
    marker: int = int_field(REGISTRATION, 1)
    coordinator_epoch: int = int_field(0, INT32_MAX)


@dataclass(frozen=True, slots=True)
class DescribedTxn(Struct):
    """One id's transaction; with an error, only the id is meaningful. `start_ms` -1: none
    began yet."""

    transactional_id: str = name_field()
    error: int = error_field()
    state: str = str_field(STATE_CHARS_MAX)
    timeout_ms: int = int_field(0, INT32_MAX)
    start_ms: int = int_field(-1, INT64_MAX)
    producer_id: int = int_field(-1, INT64_MAX)
    producer_epoch: int = int_field(-1, PRODUCER_EPOCH_MAX)
    partitions: tuple[TxnPartition, ...] = many_field(
        TxnPartition, at_most(DEFAULT_LIMITS.txn_partitions_max)
    )


@dataclass(frozen=True, slots=True)
class DescribeTransactionsResponse(Response):
    transactions: tuple[DescribedTxn, ...] = many_field(DescribedTxn, per_request)


@dataclass(frozen=True, slots=True)
class DescribeTransactions(Request):
    """Each id's transaction, from its coordinator (NOT_COORDINATOR from any other node)."""

    OP: ClassVar[Op] = Op.DESCRIBE_TRANSACTIONS
    RESPONSE: ClassVar[type[Response]] = DescribeTransactionsResponse
    transactional_ids: tuple[str, ...] = many_field(NAME_RULE, per_request)


@dataclass(frozen=True, slots=True)
class ListedTxn(Struct):
    transactional_id: str = name_field()
    producer_id: int = int_field(0, INT64_MAX)
    state: str = str_field(STATE_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class ListTransactionsResponse(Response):
    """`unknown_states`: the asked states that no transaction can be in."""

    unknown_states: tuple[str, ...] = many_field(STATE_RULE, at_most(_STATES_MAX))
    transactions: tuple[ListedTxn, ...] = many_field(
        ListedTxn, at_most(DEFAULT_LIMITS.transactional_ids_max)
    )


@dataclass(frozen=True, slots=True)
class ListTransactions(Request):
    """The ids this node coordinates, in these `states` (any: empty), of these producers
    (any: empty), open for longer than `running_ms_min` (-1: any)."""

    OP: ClassVar[Op] = Op.LIST_TRANSACTIONS
    RESPONSE: ClassVar[type[Response]] = ListTransactionsResponse
    states: tuple[str, ...] = many_field(STATE_RULE, at_most(_STATES_MAX))
    producer_ids: tuple[int, ...] = many_field(OFFSET_RULE, per_request)
    running_ms_min: int = int_field(-1, INT64_MAX)
