"""The client wire: length-prefixed msgpack frames and the schema of every request and response.

Role: the one place that turns bytes from a socket into typed requests and responses and back;
the server, the client and the peer watcher speak only through it. It is the only module in
`cluster/` that imports msgpack itself, for one thing: `msgpack.Unpacker` peeks at a correlation
id without decoding a whole body. Every other use of msgpack goes through `statemachine.codec`:
the bodies of these frames, the Raft mesh's link frames (cluster/raft/mesh.py), the Raft dump
files (cluster/raft/__init__.py), and in statemachine/ the commands, record batches and
snapshots.

Rules:
- A frame is a 4-byte big-endian unsigned length, then that many bytes of msgpack. A length
  above `Limits.frame_bytes_max` is refused before a byte of the body is read.
- A request body is `[PROTOCOL_VERSION, correlation_id, op, payload]`; a response body is
  `[PROTOCOL_VERSION, correlation_id, error_code, payload]`, whose payload is the response's
  fields when `error_code` is NONE and an `ErrorInfo` otherwise. `[version, correlation_id]`
  is the fixed prefix of every version, so an error can be answered to the right request.
- A payload is the array of a frozen dataclass's fields in order; a nested record is a nested
  array and a tuple an array. Each field carries a rule in its metadata (type and range of an
  integer, length of a string, count of a tuple, the record type of a nested array), and both
  directions are driven by those rules alone: no hand-written per-class code, no pickle. A
  class's loader is generated once from its rules (`_loader`, as `dataclasses` generates an
  `__init__`): nothing read from the wire ever becomes code.
- Decoding is strict and total: anything malformed raises `ProtocolError` and nothing else,
  carrying the correlation id whenever it could be read. Malformed content is INVALID_REQUEST,
  an unknown version or op UNSUPPORTED_VERSION, an oversize frame MESSAGE_TOO_LARGE.
- Bounds here are shape, not meaning: a topic name is a string of at most `NAME_CHARS_MAX`
  characters (looser than the name rules, which the server checks with `topic_name_error`, so
  a bad name gets INVALID_TOPIC_EXCEPTION); ranges match the commands the server proposes, so
  a request that decodes never makes a command that does not. Counts of partitions in a
  request (and in its response) are bounded by `Limits.partitions_per_request_max`.
- Encoding does not validate: what it writes, a decoder checks.
"""

from __future__ import annotations

import asyncio
import operator
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, NamedTuple, TypeVar

import msgpack

from cluster.config import Limits
from cluster.errors import RaftbrokerError
from statemachine.codec import CodecError, pack, unpack
from statemachine.commands import INT32_MAX
from statemachine.errors import ErrorCode
from statemachine.fields import (
    BoolRule,
    BytesRule,
    ErrorCodeRule,
    FieldError,
    IntRule,
    Scalar,
    StrRule,
    known_error_code,
    rule,
    rules_of,
)
from statemachine.limits import DEFAULT_LIMITS, WINDOW_BATCHES
from statemachine.records import INT64_MAX, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, PRODUCER_EPOCH_MAX

PROTOCOL_VERSION = 1
LENGTH_PREFIX = struct.Struct(">I")
NAME_CHARS_MAX = 1_024  # topic names, transactional ids, cluster ids, group names
TEXT_CHARS_MAX = 4_096  # error messages and health details
ADDRESS_CHARS_MAX = DEFAULT_LIMITS.address_length_max
TIMEOUT_MS_MAX = 3_600_000
EARLIEST = -2
LATEST = -1

_DEFAULT_LIMITS = Limits()


class ProtocolError(RaftbrokerError):
    """Bytes that are not a frame, request or response of this protocol version.

    `correlation_id` is the request's, when it could be read: the answer goes to that request.
    """

    def __init__(self, error: ErrorCode, message: str, correlation_id: int | None = None) -> None:
        super().__init__(error, message)
        self.correlation_id = correlation_id


# -- Field rules: statemachine/fields.py's scalars, and the wire's nested records and arrays -----

Bound = Callable[[Limits], int]


def _per_request(limits: Limits) -> int:
    return limits.partitions_per_request_max


def _per_frame(limits: Limits) -> int:
    return limits.frame_bytes_max


def _at_most(count: int) -> Bound:
    return lambda _limits: count


@dataclass(frozen=True, slots=True)
class StructRule:
    """A nested record, encoded as the array of its fields."""

    cls: type[Struct]
    AS_IS: ClassVar[bool] = False

    def load(self, value: object, limits: Limits) -> object:
        return _load_struct(self.cls, value, limits)

    def dump(self, value: object) -> object:
        return _dump_struct(value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TupleRule:
    """A tuple of items of one rule; `bound(limits)` is the largest count accepted."""

    item: Rule
    bound: Bound
    AS_IS: ClassVar[bool] = False

    def load(self, value: object, limits: Limits) -> object:
        if type(value) is not tuple:
            raise FieldError("expected an array")
        count_max = self.bound(limits)
        if len(value) > count_max:
            raise FieldError(f"expected at most {count_max} items")
        load, items = self.item.load, []
        try:
            for item in value:
                items.append(load(item, limits))
        except FieldError as exc:
            raise exc.at(f"[{len(items)}]") from None  # the items before it loaded
        return tuple(items)

    def dump(self, value: object) -> object:
        if self.item.AS_IS:
            return value  # a tuple of plain values: msgpack writes it as the array it is
        dump = self.item.dump
        return [dump(item) for item in value]  # type: ignore[attr-defined]


Rule = Scalar | StructRule | TupleRule


def _rule(spec: Rule) -> Any:
    return rule(spec)


def _int(lo: int, hi: int) -> Any:
    return _rule(IntRule(lo, hi))


def _str(chars_max: int) -> Any:
    return _rule(StrRule(chars_max))


def _many(item: Rule | type[Struct], bound: Bound) -> Any:
    item_rule = item if not isinstance(item, type) else StructRule(item)
    return _rule(TupleRule(item_rule, bound))


_NAME = StrRule(NAME_CHARS_MAX)
_TEXT = StrRule(TEXT_CHARS_MAX)
_PARTITION = IntRule(0, INT32_MAX)
_NODE_ID = IntRule(0, INT32_MAX)
_LEADER_ID = IntRule(-1, INT32_MAX)  # -1: unknown
_COUNT = IntRule(1, INT32_MAX)
_OFFSET = IntRule(0, INT64_MAX)
_OFFSET_OR_NONE = IntRule(-1, INT64_MAX)  # -1 where an error leaves no offset
_BYTES = IntRule(0, INT32_MAX)
_TIMEOUT = IntRule(0, TIMEOUT_MS_MAX)
_TIME_MS = IntRule(0, INT64_MAX)
_SEQUENCE = IntRule(0, INT32_MAX)


# A dataclass takes ownership of each Field it is given, so every field gets a fresh one.
def _name() -> Any:
    return _rule(_NAME)


def _partition() -> Any:
    return _rule(_PARTITION)


def _address() -> Any:
    """An address field: "host:port", or "" when unknown."""
    return _str(ADDRESS_CHARS_MAX)


def _error() -> Any:
    return _rule(ErrorCodeRule())


def _flag() -> Any:
    return _rule(BoolRule())


def _blob() -> Any:
    return _rule(BytesRule())


# -- Records -------------------------------------------------------------------------------------


class Struct:
    """A record on the wire: a frozen dataclass whose fields each carry a rule."""

    __slots__ = ()


class Response(Struct):
    """The successful answer to one Request type."""

    __slots__ = ()


class Op(IntEnum):
    """Request kinds, numbered as Kafka's API keys where Kafka has the request."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUP = 15
    LIST_GROUPS = 16
    CREATE_TOPIC = 19
    DELETE_TOPIC = 20
    INIT_PRODUCER_ID = 22
    DELETE_GROUP = 42
    DESCRIBE_PRODUCERS = 61
    CLUSTER_STATUS = 1_000  # raftbroker's own: Raft group health
    FENCED_PRODUCE = 1_001  # raftbroker's own: a streaming sink's part, appended once


class Request(Struct):
    """Base of every request; subclasses set OP (unique) and RESPONSE."""

    __slots__ = ()
    OP: ClassVar[Op]
    RESPONSE: ClassVar[type[Response]]


@dataclass(frozen=True, slots=True)
class ErrorInfo(Struct):
    """The payload of an error answer; `leader` is "host:port" for NOT_LEADER_OR_FOLLOWER."""

    message: str = _rule(_TEXT)
    leader: str = _address()


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A whole request refused: the error code of the response header and its ErrorInfo."""

    error: ErrorCode
    info: ErrorInfo

    def __post_init__(self) -> None:
        if self.error == ErrorCode.NONE:
            raise ValueError("an ErrorResponse needs an error code other than NONE")


# Metadata


@dataclass(frozen=True, slots=True)
class BrokerAddress(Struct):
    node_id: int = _rule(_NODE_ID)
    address: str = _address()


@dataclass(frozen=True, slots=True)
class PartitionMetadata(Struct):
    partition: int = _partition()
    leader_id: int = _rule(_LEADER_ID)
    replicas: tuple[int, ...] = _many(_NODE_ID, _at_most(DEFAULT_LIMITS.replication_factor_max))
    term: int = _int(-1, INT64_MAX)


@dataclass(frozen=True, slots=True)
class TopicMetadata(Struct):
    name: str = _name()
    error: int = _error()
    topic_id: int = _int(-1, INT64_MAX)
    partitions: tuple[PartitionMetadata, ...] = _many(
        PartitionMetadata, _at_most(DEFAULT_LIMITS.partitions_per_topic_max)
    )


@dataclass(frozen=True, slots=True)
class MetadataResponse(Response):
    cluster_id: str = _name()
    controller_id: int = _rule(_LEADER_ID)
    brokers: tuple[BrokerAddress, ...] = _many(BrokerAddress, _at_most(DEFAULT_LIMITS.brokers_max))
    topics: tuple[TopicMetadata, ...] = _many(TopicMetadata, _at_most(DEFAULT_LIMITS.topics_max))


@dataclass(frozen=True, slots=True)
class Metadata(Request):
    """Brokers, the controller and the named topics (every topic when `topics` is empty)."""

    OP: ClassVar[Op] = Op.METADATA
    RESPONSE: ClassVar[type[Response]] = MetadataResponse
    topics: tuple[str, ...] = _many(_NAME, _per_request)


# Topics


@dataclass(frozen=True, slots=True)
class CreateTopicResponse(Response):
    topic_id: int = _rule(_OFFSET)


@dataclass(frozen=True, slots=True)
class CreateTopic(Request):
    """Retention of -1 keeps records forever (by time) or without a size bound."""

    OP: ClassVar[Op] = Op.CREATE_TOPIC
    RESPONSE: ClassVar[type[Response]] = CreateTopicResponse
    name: str = _name()
    partitions: int = _rule(_COUNT)
    replication_factor: int = _rule(_COUNT)
    retention_ms: int = _int(-1, INT64_MAX)
    retention_bytes: int = _int(-1, INT64_MAX)


@dataclass(frozen=True, slots=True)
class DeleteTopicResponse(Response):
    pass


@dataclass(frozen=True, slots=True)
class DeleteTopic(Request):
    OP: ClassVar[Op] = Op.DELETE_TOPIC
    RESPONSE: ClassVar[type[Response]] = DeleteTopicResponse
    name: str = _name()


# Producer ids


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse(Response):
    producer_id: int = _int(0, INT64_MAX)
    epoch: int = _int(0, PRODUCER_EPOCH_MAX)


@dataclass(frozen=True, slots=True)
class InitProducerId(Request):
    """An empty `transactional_id` asks for a fresh idempotent producer; `expected_*` is -1
    when the caller holds no producer id yet."""

    OP: ClassVar[Op] = Op.INIT_PRODUCER_ID
    RESPONSE: ClassVar[type[Response]] = InitProducerIdResponse
    transactional_id: str = _name()
    transaction_timeout_ms: int = _int(0, INT32_MAX)
    expected_producer_id: int = _int(NO_PRODUCER_ID, INT64_MAX)
    expected_epoch: int = _int(NO_PRODUCER_EPOCH, PRODUCER_EPOCH_MAX)


# Produce


@dataclass(frozen=True, slots=True)
class ProduceEntry(Struct):
    topic: str = _name()
    partition: int = _partition()
    batch: bytes = _blob()


@dataclass(frozen=True, slots=True)
class ProduceResult(Struct):
    """Offsets and append time are -1 when `error` is not NONE."""

    topic: str = _name()
    partition: int = _partition()
    error: int = _error()
    base_offset: int = _rule(_OFFSET_OR_NONE)
    last_offset: int = _rule(_OFFSET_OR_NONE)
    append_time_ms: int = _int(-1, INT64_MAX)
    duplicate: bool = _flag()
    leader: str = _address()


@dataclass(frozen=True, slots=True)
class ProduceResponse(Response):
    results: tuple[ProduceResult, ...] = _many(ProduceResult, _per_request)


@dataclass(frozen=True, slots=True)
class Produce(Request):
    OP: ClassVar[Op] = Op.PRODUCE
    RESPONSE: ClassVar[type[Response]] = ProduceResponse
    timeout_ms: int = _rule(_TIMEOUT)
    entries: tuple[ProduceEntry, ...] = _many(ProduceEntry, _per_request)


_PRODUCE_ENTRY = StructRule(ProduceEntry)


@dataclass(frozen=True, slots=True)
class FencedProduce(Request):
    """One part of a streaming sink's micro-batch: appended once however often it is replayed.

    The fence `(sink, writer, batch_id, part)` is checked in apply (statemachine/sink_fences.py);
    a part an earlier run appended comes back as a duplicate with offsets -1.
    """

    OP: ClassVar[Op] = Op.FENCED_PRODUCE
    RESPONSE: ClassVar[type[Response]] = ProduceResponse
    timeout_ms: int = _rule(_TIMEOUT)
    entry: ProduceEntry = _rule(_PRODUCE_ENTRY)  # noqa: RUF009 - a field spec, not a default
    sink: str = _name()
    writer: int = _rule(_PARTITION)
    batch_id: int = _rule(_OFFSET)
    part: int = _rule(_SEQUENCE)


# Fetch


@dataclass(frozen=True, slots=True)
class FetchPartition(Struct):
    topic: str = _name()
    partition: int = _partition()
    offset: int = _rule(_OFFSET)
    max_bytes: int = _rule(_BYTES)


@dataclass(frozen=True, slots=True)
class FetchedBatch(Struct):
    base_offset: int = _rule(_OFFSET)
    append_time_ms: int = _rule(_TIME_MS)
    batch: bytes = _blob()


@dataclass(frozen=True, slots=True)
class FetchResult(Struct):
    topic: str = _name()
    partition: int = _partition()
    error: int = _error()
    high_watermark: int = _rule(_OFFSET_OR_NONE)
    log_start_offset: int = _rule(_OFFSET_OR_NONE)
    leader: str = _address()
    batches: tuple[FetchedBatch, ...] = _many(FetchedBatch, _per_frame)


@dataclass(frozen=True, slots=True)
class FetchResponse(Response):
    results: tuple[FetchResult, ...] = _many(FetchResult, _per_request)


@dataclass(frozen=True, slots=True)
class Fetch(Request):
    OP: ClassVar[Op] = Op.FETCH
    RESPONSE: ClassVar[type[Response]] = FetchResponse
    max_wait_ms: int = _rule(_TIMEOUT)
    max_bytes: int = _rule(_BYTES)
    partitions: tuple[FetchPartition, ...] = _many(FetchPartition, _per_request)
    # A replica restoring records it missed reads from any replica that holds them, not only
    # from the leader (consumers leave it False).
    replica_read: bool = _flag()


# ListOffsets


@dataclass(frozen=True, slots=True)
class OffsetQuery(Struct):
    """`spec` is EARLIEST (-2, the log start offset), LATEST (-1, the high watermark), or a
    time in ms since the epoch: the first offset the leader appended at that time or later
    (the log append time, as a Kafka topic with `message.timestamp.type=LogAppendTime`), the
    high watermark when nothing was appended since."""

    topic: str = _name()
    partition: int = _partition()
    spec: int = _int(EARLIEST, INT64_MAX)


@dataclass(frozen=True, slots=True)
class OffsetResult(Struct):
    topic: str = _name()
    partition: int = _partition()
    error: int = _error()
    offset: int = _rule(_OFFSET_OR_NONE)
    leader: str = _address()


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(Response):
    results: tuple[OffsetResult, ...] = _many(OffsetResult, _per_request)


@dataclass(frozen=True, slots=True)
class ListOffsets(Request):
    OP: ClassVar[Op] = Op.LIST_OFFSETS
    RESPONSE: ClassVar[type[Response]] = ListOffsetsResponse
    partitions: tuple[OffsetQuery, ...] = _many(OffsetQuery, _per_request)


# DescribeProducers


@dataclass(frozen=True, slots=True)
class WindowEntry(Struct):
    """One batch of a producer's window of its last five (producer_state.BatchMetadata)."""

    first_seq: int = _rule(_SEQUENCE)
    last_seq: int = _rule(_SEQUENCE)
    base_offset: int = _rule(_OFFSET)
    last_offset: int = _rule(_OFFSET)
    timestamp_ms: int = _rule(_TIME_MS)


@dataclass(frozen=True, slots=True)
class ProducerDescription(Struct):
    producer_id: int = _int(0, INT64_MAX)
    epoch: int = _int(0, PRODUCER_EPOCH_MAX)
    last_sequence: int = _int(-1, INT32_MAX)
    last_timestamp_ms: int = _rule(_TIME_MS)
    window: tuple[WindowEntry, ...] = _many(WindowEntry, _at_most(WINDOW_BATCHES))


@dataclass(frozen=True, slots=True)
class PartitionProducers(Struct):
    partition: int = _partition()
    error: int = _error()
    leader: str = _address()
    producers: tuple[ProducerDescription, ...] = _many(
        ProducerDescription, _at_most(DEFAULT_LIMITS.producers_per_partition_max)
    )


@dataclass(frozen=True, slots=True)
class DescribeProducersResponse(Response):
    results: tuple[PartitionProducers, ...] = _many(PartitionProducers, _per_request)


@dataclass(frozen=True, slots=True)
class DescribeProducers(Request):
    OP: ClassVar[Op] = Op.DESCRIBE_PRODUCERS
    RESPONSE: ClassVar[type[Response]] = DescribeProducersResponse
    topic: str = _name()
    partitions: tuple[int, ...] = _many(_PARTITION, _per_request)


# ClusterStatus


@dataclass(frozen=True, slots=True)
class NodeStatus(Struct):
    node_id: int = _rule(_NODE_ID)
    address: str = _address()
    reachable: bool = _flag()


@dataclass(frozen=True, slots=True)
class GroupStatus(Struct):
    """One Raft group as this node sees it (`leader_id` -1 when unknown). `in_sync`: on its
    leader, the nodes whose replicas are in sync (Kafka's ISR), the leader first; empty
    elsewhere. The offsets are this replica's partition's (-1 for the metadata group)."""

    group: str = _name()
    leader_id: int = _rule(_LEADER_ID)
    term: int = _int(0, INT64_MAX)
    commit_index: int = _int(0, INT64_MAX)
    last_applied: int = _int(0, INT64_MAX)
    is_leader: bool = _flag()
    healthy: bool = _flag()
    detail: str = _rule(_TEXT)
    in_sync: tuple[int, ...] = _many(_NODE_ID, _at_most(DEFAULT_LIMITS.brokers_max))
    log_start_offset: int = _rule(_OFFSET_OR_NONE)
    high_watermark: int = _rule(_OFFSET_OR_NONE)


@dataclass(frozen=True, slots=True)
class ClusterStatusResponse(Response):
    node_id: int = _rule(_NODE_ID)
    nodes: tuple[NodeStatus, ...] = _many(NodeStatus, _at_most(DEFAULT_LIMITS.brokers_max))
    groups: tuple[GroupStatus, ...] = _many(GroupStatus, _per_frame)


@dataclass(frozen=True, slots=True)
class ClusterStatus(Request):
    OP: ClassVar[Op] = Op.CLUSTER_STATUS
    RESPONSE: ClassVar[type[Response]] = ClusterStatusResponse


# Consumer groups (Kafka's classic protocol; cluster/broker/groups.py decides). A group's
# requests go to its coordinator (FindCoordinator names it); the group errors of each answer
# are in its `error` (NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS among them, which a
# client meets by finding the coordinator again). An empty `instance_id` is a dynamic member.
_PROTOCOLS_MAX = 16  # a member's assignors
_GROUP_STATE_CHARS_MAX = 32


def _per_group(limits: Limits) -> int:
    return limits.group_members_max


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Response):
    error: int = _error()
    node_id: int = _rule(_LEADER_ID)
    address: str = _address()


@dataclass(frozen=True, slots=True)
class FindCoordinator(Request):
    OP: ClassVar[Op] = Op.FIND_COORDINATOR
    RESPONSE: ClassVar[type[Response]] = FindCoordinatorResponse
    group: str = _name()


@dataclass(frozen=True, slots=True)
class GroupProtocol(Struct):
    """One assignor a member can use, with its subscription (opaque to the broker)."""

    name: str = _name()
    metadata: bytes = _blob()


@dataclass(frozen=True, slots=True)
class JoinedMember(Struct):
    member_id: str = _name()
    instance_id: str = _name()
    metadata: bytes = _blob()


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Response):
    """`members` is the leader's only. MEMBER_ID_REQUIRED carries the id to join with."""

    error: int = _error()
    generation: int = _int(-1, INT32_MAX)
    protocol_name: str = _name()
    leader: str = _name()
    member_id: str = _name()
    members: tuple[JoinedMember, ...] = _many(JoinedMember, _per_group)


@dataclass(frozen=True, slots=True)
class JoinGroup(Request):
    """A new member joins with an empty `member_id` and is given one (KIP-394) to join with."""

    OP: ClassVar[Op] = Op.JOIN_GROUP
    RESPONSE: ClassVar[type[Response]] = JoinGroupResponse
    group: str = _name()
    member_id: str = _name()
    instance_id: str = _name()
    client_id: str = _name()
    session_timeout_ms: int = _rule(_TIMEOUT)
    rebalance_timeout_ms: int = _rule(_TIMEOUT)
    protocol_type: str = _name()
    protocols: tuple[GroupProtocol, ...] = _many(GroupProtocol, _at_most(_PROTOCOLS_MAX))


@dataclass(frozen=True, slots=True)
class MemberAssignment(Struct):
    member_id: str = _name()
    assignment: bytes = _blob()


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Response):
    error: int = _error()
    assignment: bytes = _blob()


@dataclass(frozen=True, slots=True)
class SyncGroup(Request):
    """`assignments` is the leader's only."""

    OP: ClassVar[Op] = Op.SYNC_GROUP
    RESPONSE: ClassVar[type[Response]] = SyncGroupResponse
    group: str = _name()
    generation: int = _int(-1, INT32_MAX)
    member_id: str = _name()
    instance_id: str = _name()
    assignments: tuple[MemberAssignment, ...] = _many(MemberAssignment, _per_group)


@dataclass(frozen=True, slots=True)
class GroupErrorResponse(Response):
    error: int = _error()


@dataclass(frozen=True, slots=True)
class Heartbeat(Request):
    OP: ClassVar[Op] = Op.HEARTBEAT
    RESPONSE: ClassVar[type[Response]] = GroupErrorResponse
    group: str = _name()
    generation: int = _int(-1, INT32_MAX)
    member_id: str = _name()
    instance_id: str = _name()


@dataclass(frozen=True, slots=True)
class LeaveGroup(Request):
    OP: ClassVar[Op] = Op.LEAVE_GROUP
    RESPONSE: ClassVar[type[Response]] = GroupErrorResponse
    group: str = _name()
    member_id: str = _name()
    instance_id: str = _name()


@dataclass(frozen=True, slots=True)
class CommitEntry(Struct):
    topic: str = _name()
    partition: int = _partition()
    offset: int = _rule(_OFFSET)
    metadata: str = _rule(_TEXT)


@dataclass(frozen=True, slots=True)
class CommitResult(Struct):
    topic: str = _name()
    partition: int = _partition()
    error: int = _error()


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Response):
    results: tuple[CommitResult, ...] = _many(CommitResult, _per_request)


@dataclass(frozen=True, slots=True)
class OffsetCommit(Request):
    """A member's commit; generation -1 with an empty `member_id` commits for an empty group
    (an administrator's reset), as Kafka's."""

    OP: ClassVar[Op] = Op.OFFSET_COMMIT
    RESPONSE: ClassVar[type[Response]] = OffsetCommitResponse
    group: str = _name()
    generation: int = _int(-1, INT32_MAX)
    member_id: str = _name()
    instance_id: str = _name()
    offsets: tuple[CommitEntry, ...] = _many(CommitEntry, _per_request)


@dataclass(frozen=True, slots=True)
class GroupPartition(Struct):
    topic: str = _name()
    partition: int = _partition()


@dataclass(frozen=True, slots=True)
class GroupOffset(Struct):
    """`offset` -1: the group has committed none for the partition."""

    topic: str = _name()
    partition: int = _partition()
    offset: int = _rule(_OFFSET_OR_NONE)
    metadata: str = _rule(_TEXT)


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Response):
    error: int = _error()
    offsets: tuple[GroupOffset, ...] = _many(
        GroupOffset, _at_most(DEFAULT_LIMITS.group_offsets_max)
    )


@dataclass(frozen=True, slots=True)
class OffsetFetch(Request):
    """The group's committed offsets of `partitions` (of every partition it has: empty)."""

    OP: ClassVar[Op] = Op.OFFSET_FETCH
    RESPONSE: ClassVar[type[Response]] = OffsetFetchResponse
    group: str = _name()
    partitions: tuple[GroupPartition, ...] = _many(GroupPartition, _per_request)


@dataclass(frozen=True, slots=True)
class DescribedMember(Struct):
    member_id: str = _name()
    instance_id: str = _name()
    client_id: str = _name()
    client_host: str = _address()
    metadata: bytes = _blob()
    assignment: bytes = _blob()


@dataclass(frozen=True, slots=True)
class DescribeGroupResponse(Response):
    """`state` as Kafka names it: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    (a group the coordinator does not know)."""

    error: int = _error()
    state: str = _str(_GROUP_STATE_CHARS_MAX)
    protocol_type: str = _name()
    protocol_name: str = _name()
    members: tuple[DescribedMember, ...] = _many(DescribedMember, _per_group)


@dataclass(frozen=True, slots=True)
class DescribeGroup(Request):
    OP: ClassVar[Op] = Op.DESCRIBE_GROUP
    RESPONSE: ClassVar[type[Response]] = DescribeGroupResponse
    group: str = _name()


@dataclass(frozen=True, slots=True)
class ListedGroup(Struct):
    group: str = _name()
    protocol_type: str = _name()
    state: str = _str(_GROUP_STATE_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Response):
    groups: tuple[ListedGroup, ...] = _many(ListedGroup, _per_frame)


@dataclass(frozen=True, slots=True)
class ListGroups(Request):
    """The groups the answering node coordinates (a client asks every node, as Kafka's)."""

    OP: ClassVar[Op] = Op.LIST_GROUPS
    RESPONSE: ClassVar[type[Response]] = ListGroupsResponse


@dataclass(frozen=True, slots=True)
class DeleteGroup(Request):
    """An empty group and its committed offsets; NON_EMPTY_GROUP while it has members."""

    OP: ClassVar[Op] = Op.DELETE_GROUP
    RESPONSE: ClassVar[type[Response]] = GroupErrorResponse
    group: str = _name()


REQUEST_TYPES: tuple[type[Request], ...] = (
    Metadata,
    CreateTopic,
    DeleteTopic,
    InitProducerId,
    Produce,
    Fetch,
    ListOffsets,
    DescribeProducers,
    ClusterStatus,
    FencedProduce,
    FindCoordinator,
    JoinGroup,
    SyncGroup,
    Heartbeat,
    LeaveGroup,
    OffsetCommit,
    OffsetFetch,
    DescribeGroup,
    ListGroups,
    DeleteGroup,
)


def _request_types_by_op() -> dict[int, type[Request]]:
    by_op: dict[int, type[Request]] = {int(cls.OP): cls for cls in REQUEST_TYPES}
    assert sorted(by_op) == sorted(int(op) for op in Op), "one request type per Op"
    return by_op


_BY_OP = _request_types_by_op()


# -- Records <-> arrays --------------------------------------------------------------------------

S = TypeVar("S", bound=Struct)


class _Plan(NamedTuple):
    """A record class's rules, prepared once for both directions."""

    rules: tuple[tuple[str, Rule], ...]
    loads: tuple[Callable[[object, Limits], object], ...]
    values_of: Callable[[Any], tuple[object, ...]]  # every field's value, in one call
    dumps: tuple[tuple[int, Callable[[object], object]], ...]  # the fields not written as is
    load: Callable[[object, Limits], Any]  # `_load_fields`, as one function of the class


_PLANS: dict[type[Struct], _Plan] = {}


def _new_plan(cls: type[Struct]) -> _Plan:
    """Prepare `cls` (once: callers look in `_PLANS` first, which saves a call per record)."""
    rules = rules_of(cls)
    plan = _PLANS[cls] = _Plan(
        rules,
        tuple(rule.load for _, rule in rules),
        _values_getter([name for name, _ in rules]),
        tuple((i, rule.dump) for i, (_, rule) in enumerate(rules) if not rule.AS_IS),
        _loader(cls, rules),
    )
    return plan


def _loader(cls: type[S], rules: tuple[tuple[str, Rule], ...]) -> Callable[[object, Limits], S]:
    """`_load_fields` for `cls` as one function: each scalar's rule is the test it makes,
    written inline (an IntRule `type(v) is int and lo <= v <= hi`, ...), nested records and
    tuples go through their rules, and a body any of them does not accept goes to
    `_load_fields`, which accepts it after all or raises naming the field and the reason.

    Generated source, as `dataclasses` makes `__init__`: from this module's rules (integers
    and local names) only; nothing read from the wire is ever part of it. Same values, same
    errors as `_load_fields` (tests/property/test_protocol_roundtrip.py)."""
    names = [f"v{i}" for i in range(len(rules))]
    tests: list[str] = []
    args: list[str] = []
    scope: dict[str, Any] = {"cls": cls, "FieldError": FieldError, "fields": _load_fields}
    for i, (v, (_, spec)) in enumerate(zip(names, rules, strict=True)):
        match spec:
            case IntRule(lo=lo, hi=hi):
                tests.append(f"type({v}) is int and {lo} <= {v} <= {hi}")
            case StrRule(chars_max=chars_max):
                tests.append(f"type({v}) is str and len({v}) <= {chars_max}")
            case BoolRule():
                tests.append(f"type({v}) is bool")
            case BytesRule():
                tests.append(f"type({v}) is bytes")
            case _:
                scope[f"load{i}"] = spec.load
                args.append(f"load{i}({v}, limits)")
                continue
        args.append(v)
    unpacked = "".join(f"{v}, " for v in names) or "_"  # `_ = ()` for a class of no fields
    source = "\n".join(
        [
            "def load(raw, limits):",
            f"    if type(raw) is tuple and len(raw) == {len(names)}:",
            f"        {unpacked} = raw",
            f"        if {' and '.join(tests) or 'True'}:",
            "            try:",
            f"                return cls({', '.join(args)})",
            "            except FieldError:",
            "                pass",
            "    return fields(cls, raw, limits)",
        ]
    )
    exec(source, scope)  # generated from the rules above, never from input
    load: Callable[[object, Limits], S] = scope["load"]
    return load


def _values_getter(names: list[str]) -> Callable[[Any], tuple[object, ...]]:
    if len(names) > 1:
        return operator.attrgetter(*names)  # a tuple of the values, in one C call
    return lambda value: tuple(getattr(value, name) for name in names)


def field_rules(cls: type[Struct]) -> tuple[tuple[str, Rule], ...]:
    """The (name, rule) of each field of a record class, in encoding order."""
    return (_PLANS.get(cls) or _new_plan(cls)).rules


def _dump_struct(value: Struct) -> object:
    plan = _PLANS.get(type(value)) or _new_plan(type(value))
    values = plan.values_of(value)
    if not plan.dumps:
        return values  # msgpack writes the tuple as the array of the fields
    dumped = list(values)
    for i, dump in plan.dumps:
        dumped[i] = dump(dumped[i])
    return dumped


def _load_struct(cls: type[S], raw: object, limits: Limits) -> S:
    plan = _PLANS.get(cls) or _new_plan(cls)
    load: Callable[[object, Limits], S] = plan.load
    return load(raw, limits)


def _load_fields(cls: type[S], raw: object, limits: Limits) -> S:
    """A body's record, field by field: the reference loader, and the one that names the
    field (and the reason) a body breaks."""
    plan = _PLANS.get(cls) or _new_plan(cls)
    if type(raw) is not tuple or len(raw) != len(plan.loads):
        raise FieldError(f"expected an array of {len(plan.loads)} fields")
    values: list[object] = []
    try:
        for load, value in zip(plan.loads, raw, strict=True):
            values.append(load(value, limits))
    except FieldError as exc:
        raise exc.at(f".{plan.rules[len(values)][0]}") from None  # the fields before it loaded
    return cls(*values)


def _load_payload(cls: type[S], raw: object, limits: Limits, correlation_id: int) -> S:
    try:
        return _load_struct(cls, raw, limits)
    except FieldError as exc:
        message = f"{cls.__name__}{exc.path}: {exc.reason}"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, correlation_id) from None


# -- Frames and bodies ---------------------------------------------------------------------------


def _is_correlation_id(value: object) -> bool:
    return type(value) is int and 0 <= value <= INT32_MAX


def _frame(correlation_id: int, second: int, payload: Struct) -> bytes:
    if not _is_correlation_id(correlation_id):
        raise ValueError(f"a correlation id is an integer in [0, {INT32_MAX}]")
    body = pack([PROTOCOL_VERSION, correlation_id, second, _dump_struct(payload)])
    return LENGTH_PREFIX.pack(len(body)) + body


def encode_request(correlation_id: int, request: Request) -> bytes:
    """The whole frame (length prefix included) of one request."""
    return _frame(correlation_id, int(request.OP), request)


def encode_response(
    correlation_id: int,
    answer: Response | ErrorResponse | ErrorInfo,
    error: ErrorCode = ErrorCode.NONE,
) -> bytes:
    """The whole frame of an answer: a Response, an ErrorResponse, or an ErrorInfo with `error`."""
    code, payload = _error_and_payload(answer, error)
    return _frame(correlation_id, int(code), payload)


def _error_and_payload(
    answer: Response | ErrorResponse | ErrorInfo, error: ErrorCode
) -> tuple[ErrorCode, Struct]:
    if isinstance(answer, ErrorResponse):
        if error not in (ErrorCode.NONE, answer.error):
            raise ValueError("an ErrorResponse carries its own error code")
        return answer.error, answer.info
    if isinstance(answer, ErrorInfo):
        if error == ErrorCode.NONE:
            raise ValueError("an ErrorInfo needs an error code other than NONE")
        return error, answer
    if error != ErrorCode.NONE:
        raise ValueError("an error answer carries an ErrorInfo, not a response")
    return ErrorCode.NONE, answer


def peek_correlation_id(body: bytes) -> int:
    """The correlation id of a request or response body, reading only its first items."""
    correlation_id = _peek(body)
    if correlation_id is None:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, "no readable correlation id")
    return correlation_id


def _peek(body: bytes) -> int | None:
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=max(len(body), 1))
    try:
        unpacker.feed(body)
        if unpacker.read_array_header() < 2:
            return None
        unpacker.skip()
        value = unpacker.unpack()
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    return value if _is_correlation_id(value) else None


def _unpack(body: bytes, limits: Limits) -> object:
    if len(body) > limits.frame_bytes_max:
        message = f"a body of {len(body)} bytes exceeds the limit of {limits.frame_bytes_max}"
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message, _peek(body))
    try:
        return unpack(body, size_max=limits.frame_bytes_max)
    except CodecError as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, str(exc), _peek(body)) from None


def _header(raw: object) -> tuple[int, object, object]:
    """The correlation id, op-or-error and payload of a body, or ProtocolError."""
    if type(raw) is not tuple or len(raw) < 2 or not _is_correlation_id(raw[1]):
        message = "a body is [version, correlation_id, ...]"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, None)
    version, correlation_id = raw[0], raw[1]
    if type(version) is not int or version != PROTOCOL_VERSION:
        message = f"unsupported protocol version {version!r}"
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, message, correlation_id)
    if len(raw) != 4:
        message = f"a body of version {PROTOCOL_VERSION} has 4 items, not {len(raw)}"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, correlation_id)
    return correlation_id, raw[2], raw[3]


def decode_request(body: bytes, limits: Limits) -> tuple[int, Request]:
    """The correlation id and request of a frame body; ProtocolError for anything else."""
    correlation_id, op, payload = _header(_unpack(body, limits))
    cls = _BY_OP.get(op) if type(op) is int else None
    if cls is None:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"unknown op {op!r}", correlation_id)
    return correlation_id, _load_payload(cls, payload, limits, correlation_id)


def decode_response(
    body: bytes, request_type: type[Request], limits: Limits = _DEFAULT_LIMITS
) -> tuple[int, Response | ErrorResponse]:
    """The correlation id and answer of a frame body sent for a `request_type` request."""
    correlation_id, error, payload = split_response(body, limits)
    return correlation_id, load_response(correlation_id, error, payload, request_type, limits)


def split_response(body: bytes, limits: Limits = _DEFAULT_LIMITS) -> tuple[int, object, object]:
    """A response body's correlation id, error code and payload, still raw: a client reads
    which request it answers from the one decode of the body, then `load_response`s it."""
    return _header(_unpack(body, limits))


def load_response(
    correlation_id: int,
    error: object,
    payload: object,
    request_type: type[Request],
    limits: Limits = _DEFAULT_LIMITS,
) -> Response | ErrorResponse:
    """The answer in a `split_response` body sent for a `request_type` request."""
    code = known_error_code(error)
    if code is None:
        message = f"unknown error code {error!r}"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, correlation_id)
    if code != ErrorCode.NONE:
        return ErrorResponse(code, _load_payload(ErrorInfo, payload, limits, correlation_id))
    return _load_payload(request_type.RESPONSE, payload, limits, correlation_id)


async def read_frame(reader: asyncio.StreamReader, frame_bytes_max: int) -> bytes:
    """The body of the next frame; ProtocolError (body unread) if its length exceeds the limit.

    Raises asyncio.IncompleteReadError at end of stream; the caller applies timeouts.
    """
    (length,) = LENGTH_PREFIX.unpack(await reader.readexactly(LENGTH_PREFIX.size))
    _check_frame_length(length, frame_bytes_max)
    return await reader.readexactly(length)


def take_frame(buf: bytearray, offset: int, frame_bytes_max: int) -> tuple[bytes, int] | None:
    """`read_frame` for a protocol's input buffer: the body of the frame at `offset` and the
    offset after it, or None until all of it has arrived; ProtocolError (body unread) if its
    length exceeds the limit."""
    if len(buf) - offset < LENGTH_PREFIX.size:
        return None
    (length,) = LENGTH_PREFIX.unpack_from(buf, offset)
    _check_frame_length(length, frame_bytes_max)
    start = offset + LENGTH_PREFIX.size
    end = start + length
    if end > len(buf):
        return None
    with memoryview(buf) as view:  # one copy: a slice of the bytearray would be a second
        return bytes(view[start:end]), end


def whole_frame(data: bytes, frame_bytes_max: int) -> bool:
    """Whether `data` is exactly one frame, whole, of an allowed length."""
    if len(data) < LENGTH_PREFIX.size:
        return False
    length: int = LENGTH_PREFIX.unpack_from(data)[0]
    return length <= frame_bytes_max and len(data) == LENGTH_PREFIX.size + length


def _check_frame_length(length: int, frame_bytes_max: int) -> None:
    if length > frame_bytes_max:
        message = f"a frame of {length} bytes exceeds the limit of {frame_bytes_max}"
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message)
