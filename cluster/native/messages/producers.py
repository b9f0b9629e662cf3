"""The producers' requests: InitProducerId (a producer id and epoch, by transactional id when
one is given) and DescribeProducers (each partition's producers and their windows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cluster.native.messages.base import Op, Request, Response
from cluster.native.schema import (
    OFFSET_OR_NONE_RULE,
    OFFSET_RULE,
    PARTITION_RULE,
    SEQUENCE_RULE,
    TIME_MS_RULE,
    Struct,
    address_field,
    at_most,
    error_field,
    field_of,
    int_field,
    many_field,
    name_field,
    partition_field,
    per_request,
)
from statemachine.commands import INT32_MAX
from statemachine.limits import DEFAULT_LIMITS, WINDOW_BATCHES
from statemachine.records import INT64_MAX, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, PRODUCER_EPOCH_MAX

# Producer ids


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse(Response):
    producer_id: int = int_field(0, INT64_MAX)
    epoch: int = int_field(0, PRODUCER_EPOCH_MAX)


@dataclass(frozen=True, slots=True)
class InitProducerId(Request):
    """An empty `transactional_id` asks for a fresh idempotent producer; `expected_*` is -1
    when the caller holds no producer id yet."""

    OP: ClassVar[Op] = Op.INIT_PRODUCER_ID
    RESPONSE: ClassVar[type[Response]] = InitProducerIdResponse
    transactional_id: str = name_field()
    transaction_timeout_ms: int = int_field(0, INT32_MAX)
    expected_producer_id: int = int_field(NO_PRODUCER_ID, INT64_MAX)
    expected_epoch: int = int_field(NO_PRODUCER_EPOCH, PRODUCER_EPOCH_MAX)


# DescribeProducers


@dataclass(frozen=True, slots=True)
class WindowEntry(Struct):
    """One batch of a producer's window of its last five (producer_state.BatchMetadata)."""

    first_seq: int = field_of(SEQUENCE_RULE)
    last_seq: int = field_of(SEQUENCE_RULE)
    base_offset: int = field_of(OFFSET_RULE)
    last_offset: int = field_of(OFFSET_RULE)
    timestamp_ms: int = field_of(TIME_MS_RULE)


@dataclass(frozen=True, slots=True)
class ProducerDescription(Struct):
    producer_id: int = int_field(0, INT64_MAX)
    epoch: int = int_field(0, PRODUCER_EPOCH_MAX)
    last_sequence: int = int_field(-1, INT32_MAX)
    last_timestamp_ms: int = field_of(TIME_MS_RULE)
    window: tuple[WindowEntry, ...] = many_field(WindowEntry, at_most(WINDOW_BATCHES))
    # The epoch of the last coordinator whose marker this partition took (-1: none), and the
    # first offset of the producer's open transaction here (-1: none with data yet).
    coordinator_epoch: int = int_field(-1, INT32_MAX, -1)
    txn_start_offset: int = field_of(OFFSET_OR_NONE_RULE, -1)


@dataclass(frozen=True, slots=True)
class PartitionProducers(Struct):
    partition: int = partition_field()
    error: int = error_field()
    leader: str = address_field()
    producers: tuple[ProducerDescription, ...] = many_field(
        ProducerDescription, at_most(DEFAULT_LIMITS.producers_per_partition_max)
    )


@dataclass(frozen=True, slots=True)
class DescribeProducersResponse(Response):
    results: tuple[PartitionProducers, ...] = many_field(PartitionProducers, per_request)


@dataclass(frozen=True, slots=True)
class DescribeProducers(Request):
    OP: ClassVar[Op] = Op.DESCRIBE_PRODUCERS
    RESPONSE: ClassVar[type[Response]] = DescribeProducersResponse
    topic: str = name_field()
    partitions: tuple[int, ...] = many_field(PARTITION_RULE, per_request)
