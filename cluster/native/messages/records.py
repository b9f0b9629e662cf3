"""The records' requests: Produce, FencedProduce (raftbroker's own: a streaming sink's part,
appended once however often it is sent), Fetch and ListOffsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cluster.native.messages.base import Op, Request, Response
from cluster.native.schema import (
    BYTES_RULE,
    EARLIEST,
    OFFSET_OR_NONE_RULE,
    OFFSET_RULE,
    PARTITION_RULE,
    SEQUENCE_RULE,
    TIME_MS_RULE,
    TIMEOUT_RULE,
    Struct,
    StructRule,
    address_field,
    blob_field,
    error_field,
    field_of,
    flag_field,
    int_field,
    many_field,
    name_field,
    partition_field,
    per_frame,
    per_request,
)
from statemachine.records import INT64_MAX

# Produce


@dataclass(frozen=True, slots=True)
class ProduceEntry(Struct):
    topic: str = name_field()
    partition: int = partition_field()
    batch: bytes = blob_field()


@dataclass(frozen=True, slots=True)
class ProduceResult(Struct):
    """Offsets and append time are -1 when `error` is not NONE."""

    topic: str = name_field()
    partition: int = partition_field()
    error: int = error_field()
    base_offset: int = field_of(OFFSET_OR_NONE_RULE)
    last_offset: int = field_of(OFFSET_OR_NONE_RULE)
    append_time_ms: int = int_field(-1, INT64_MAX)
    duplicate: bool = flag_field()
    leader: str = address_field()


@dataclass(frozen=True, slots=True)
class ProduceResponse(Response):
    results: tuple[ProduceResult, ...] = many_field(ProduceResult, per_request)


@dataclass(frozen=True, slots=True)
class Produce(Request):
    OP: ClassVar[Op] = Op.PRODUCE
    RESPONSE: ClassVar[type[Response]] = ProduceResponse
    timeout_ms: int = field_of(TIMEOUT_RULE)
    entries: tuple[ProduceEntry, ...] = many_field(ProduceEntry, per_request)


_PRODUCE_ENTRY = StructRule(ProduceEntry)


@dataclass(frozen=True, slots=True)
class FencedProduce(Request):
    """One part of a streaming sink's micro-batch: appended once however often it is replayed.

    The fence `(sink, writer, batch_id, part)` is checked in apply (statemachine/sink_fences.py);
    a part an earlier run appended comes back as a duplicate with offsets -1.
    """

    OP: ClassVar[Op] = Op.FENCED_PRODUCE
    RESPONSE: ClassVar[type[Response]] = ProduceResponse
    timeout_ms: int = field_of(TIMEOUT_RULE)
    entry: ProduceEntry = field_of(_PRODUCE_ENTRY)  # noqa: RUF009 - a field spec, not a default
    sink: str = name_field()
    writer: int = field_of(PARTITION_RULE)
    batch_id: int = field_of(OFFSET_RULE)
    part: int = field_of(SEQUENCE_RULE)


# Fetch


@dataclass(frozen=True, slots=True)
class FetchPartition(Struct):
    topic: str = name_field()
    partition: int = partition_field()
    offset: int = field_of(OFFSET_RULE)
    max_bytes: int = field_of(BYTES_RULE)


@dataclass(frozen=True, slots=True)
class FetchedBatch(Struct):
    base_offset: int = field_of(OFFSET_RULE)
    append_time_ms: int = field_of(TIME_MS_RULE)
    batch: bytes = blob_field()


@dataclass(frozen=True, slots=True)
class FetchResult(Struct):
    """`batches` hold only what the reader keeps: for a read_committed one, no aborted
    transaction's data and no marker (the broker drops them, from its aborted index), so
    `next_offset`, where the reader goes on from, can lie past the last batch given; -1 with
    an error. `last_stable_offset` is -1 with an error too."""

    topic: str = name_field()
    partition: int = partition_field()
    error: int = error_field()
    high_watermark: int = field_of(OFFSET_OR_NONE_RULE)
    log_start_offset: int = field_of(OFFSET_OR_NONE_RULE)
    leader: str = address_field()
    batches: tuple[FetchedBatch, ...] = many_field(FetchedBatch, per_frame)
    last_stable_offset: int = field_of(OFFSET_OR_NONE_RULE, -1)
    next_offset: int = field_of(OFFSET_OR_NONE_RULE, -1)


@dataclass(frozen=True, slots=True)
class FetchResponse(Response):
    results: tuple[FetchResult, ...] = many_field(FetchResult, per_request)


@dataclass(frozen=True, slots=True)
class Fetch(Request):
    """`read_committed`: Kafka's isolation level 1, up to the last stable offset and without
    aborted transactions' data (a consumer's default, as librdkafka's)."""

    OP: ClassVar[Op] = Op.FETCH
    RESPONSE: ClassVar[type[Response]] = FetchResponse
    max_wait_ms: int = field_of(TIMEOUT_RULE)
    max_bytes: int = field_of(BYTES_RULE)
    partitions: tuple[FetchPartition, ...] = many_field(FetchPartition, per_request)
    # A replica restoring records it missed reads from any replica that holds them, not only
    # from the leader (consumers leave it False).
    replica_read: bool = flag_field()
    read_committed: bool = flag_field(False)


# ListOffsets


@dataclass(frozen=True, slots=True)
class OffsetQuery(Struct):
    """`spec` is EARLIEST (-2, the log start offset), LATEST (-1, the high watermark), or a
    time in ms since the epoch: the first offset the leader appended at that time or later
    (the log append time, as a Kafka topic with `message.timestamp.type=LogAppendTime`), the
    high watermark when nothing was appended since."""

    topic: str = name_field()
    partition: int = partition_field()
    spec: int = int_field(EARLIEST, INT64_MAX)


@dataclass(frozen=True, slots=True)
class OffsetResult(Struct):
    topic: str = name_field()
    partition: int = partition_field()
    error: int = error_field()
    offset: int = field_of(OFFSET_OR_NONE_RULE)
    leader: str = address_field()


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(Response):
    results: tuple[OffsetResult, ...] = many_field(OffsetResult, per_request)


@dataclass(frozen=True, slots=True)
class ListOffsets(Request):
    OP: ClassVar[Op] = Op.LIST_OFFSETS
    RESPONSE: ClassVar[type[Response]] = ListOffsetsResponse
    partitions: tuple[OffsetQuery, ...] = many_field(OffsetQuery, per_request)
    read_committed: bool = flag_field(False)  # LATEST is the last stable offset
