"""The consumer groups' requests. Kafka's classic protocol; cluster/broker/groups.py decides. A
group's requests go to its coordinator (FindCoordinator names it); the group errors of each
answer are in its `error` (NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS among them, which a
client meets by finding the coordinator again). An empty `instance_id` is a dynamic member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cluster.config import Limits
from cluster.native.messages.base import Op, Request, Response
from cluster.native.schema import (
    LEADER_ID_RULE,
    OFFSET_OR_NONE_RULE,
    OFFSET_RULE,
    TEXT_RULE,
    TIMEOUT_RULE,
    Struct,
    address_field,
    at_most,
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
    str_field,
)
from statemachine.commands import INT32_MAX
from statemachine.errors import ErrorCode
from statemachine.limits import DEFAULT_LIMITS
from statemachine.records import INT64_MAX, PRODUCER_EPOCH_MAX

GROUP_KEY, TXN_KEY = 0, 1  # FindCoordinator's key types
_PROTOCOLS_MAX = 16  # a member's assignors
_GROUP_STATE_CHARS_MAX = 32


def _per_group(limits: Limits) -> int:
    return limits.group_members_max


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Response):
    error: int = error_field()
    node_id: int = field_of(LEADER_ID_RULE)
    address: str = address_field()


@dataclass(frozen=True, slots=True)
class FindCoordinator(Request):
    """The coordinator of a group (`key_type` GROUP_KEY, `key` its name) or of a
    transactional id (TXN_KEY), as Kafka's key types 0 and 1."""

    OP: ClassVar[Op] = Op.FIND_COORDINATOR
    RESPONSE: ClassVar[type[Response]] = FindCoordinatorResponse
    key: str = name_field()
    key_type: int = int_field(GROUP_KEY, TXN_KEY, GROUP_KEY)


@dataclass(frozen=True, slots=True)
class GroupProtocol(Struct):
    """One assignor a member can use, with its subscription (opaque to the broker)."""

    name: str = name_field()
    metadata: bytes = blob_field()


@dataclass(frozen=True, slots=True)
class JoinedMember(Struct):
    member_id: str = name_field()
    instance_id: str = name_field()
    metadata: bytes = blob_field()


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Response):
    """`members` is the leader's only. MEMBER_ID_REQUIRED carries the id to join with."""

    error: int = error_field()
    generation: int = int_field(-1, INT32_MAX)
    protocol_name: str = name_field()
    leader: str = name_field()
    member_id: str = name_field()
    members: tuple[JoinedMember, ...] = many_field(JoinedMember, _per_group)


@dataclass(frozen=True, slots=True)
class JoinGroup(Request):
    """A new member joins with an empty `member_id` and is given one (KIP-394) to join with."""

    OP: ClassVar[Op] = Op.JOIN_GROUP
    RESPONSE: ClassVar[type[Response]] = JoinGroupResponse
    group: str = name_field()
    member_id: str = name_field()
    instance_id: str = name_field()
    client_id: str = name_field()
    session_timeout_ms: int = field_of(TIMEOUT_RULE)
    rebalance_timeout_ms: int = field_of(TIMEOUT_RULE)
    protocol_type: str = name_field()
    protocols: tuple[GroupProtocol, ...] = many_field(GroupProtocol, at_most(_PROTOCOLS_MAX))


@dataclass(frozen=True, slots=True)
class MemberAssignment(Struct):
    member_id: str = name_field()
    assignment: bytes = blob_field()


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Response):
    error: int = error_field()
    assignment: bytes = blob_field()


@dataclass(frozen=True, slots=True)
class SyncGroup(Request):
    """`assignments` is the leader's only."""

    OP: ClassVar[Op] = Op.SYNC_GROUP
    RESPONSE: ClassVar[type[Response]] = SyncGroupResponse
    group: str = name_field()
    generation: int = int_field(-1, INT32_MAX)
    member_id: str = name_field()
    instance_id: str = name_field()
    assignments: tuple[MemberAssignment, ...] = many_field(MemberAssignment, _per_group)


@dataclass(frozen=True, slots=True)
class GroupErrorResponse(Response):
    error: int = error_field()


@dataclass(frozen=True, slots=True)
class Heartbeat(Request):
    OP: ClassVar[Op] = Op.HEARTBEAT
    RESPONSE: ClassVar[type[Response]] = GroupErrorResponse
    group: str = name_field()
    generation: int = int_field(-1, INT32_MAX)
    member_id: str = name_field()
    instance_id: str = name_field()


@dataclass(frozen=True, slots=True)
class LeaveGroup(Request):
    OP: ClassVar[Op] = Op.LEAVE_GROUP
    RESPONSE: ClassVar[type[Response]] = GroupErrorResponse
    group: str = name_field()
    member_id: str = name_field()
    instance_id: str = name_field()


@dataclass(frozen=True, slots=True)
class CommitEntry(Struct):
    topic: str = name_field()
    partition: int = partition_field()
    offset: int = field_of(OFFSET_RULE)
    metadata: str = field_of(TEXT_RULE)


@dataclass(frozen=True, slots=True)
class CommitResult(Struct):
    topic: str = name_field()
    partition: int = partition_field()
    error: int = error_field()


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Response):
    results: tuple[CommitResult, ...] = many_field(CommitResult, per_request)


@dataclass(frozen=True, slots=True)
class OffsetCommit(Request):
    """A member's commit; generation -1 with an empty `member_id` commits for an empty group
    (an administrator's reset), as Kafka's."""

    OP: ClassVar[Op] = Op.OFFSET_COMMIT
    RESPONSE: ClassVar[type[Response]] = OffsetCommitResponse
    group: str = name_field()
    generation: int = int_field(-1, INT32_MAX)
    member_id: str = name_field()
    instance_id: str = name_field()
    offsets: tuple[CommitEntry, ...] = many_field(CommitEntry, per_request)


@dataclass(frozen=True, slots=True)
class TxnOffsetCommit(Request):
    """Offsets in a transaction (Kafka's TxnOffsetCommit): taken as the producer's, pending
    until its transaction's marker commits or drops them. AddOffsetsToTxn must have added
    the group to the transaction first; the member fields are KIP-447's checks (generation -1
    and an empty member id skip them)."""

    OP: ClassVar[Op] = Op.TXN_OFFSET_COMMIT
    RESPONSE: ClassVar[type[Response]] = OffsetCommitResponse
    transactional_id: str = name_field()
    group: str = name_field()
    producer_id: int = int_field(0, INT64_MAX)
    producer_epoch: int = int_field(0, PRODUCER_EPOCH_MAX)
    generation: int = int_field(-1, INT32_MAX)
    member_id: str = name_field()
    instance_id: str = name_field()
    offsets: tuple[CommitEntry, ...] = many_field(CommitEntry, per_request)


@dataclass(frozen=True, slots=True)
class GroupPartition(Struct):
    topic: str = name_field()
    partition: int = partition_field()


@dataclass(frozen=True, slots=True)
class GroupOffset(Struct):
    """`offset` -1: the group has committed none for the partition."""

    topic: str = name_field()
    partition: int = partition_field()
    offset: int = field_of(OFFSET_OR_NONE_RULE)
    metadata: str = field_of(TEXT_RULE)
    error: int = error_field(ErrorCode.NONE)  # UNSTABLE_OFFSET_COMMIT: see OffsetFetch


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Response):
    error: int = error_field()
    offsets: tuple[GroupOffset, ...] = many_field(
        GroupOffset, at_most(DEFAULT_LIMITS.group_offsets_max)
    )


@dataclass(frozen=True, slots=True)
class OffsetFetch(Request):
    """The group's committed offsets of `partitions` (of every partition it has: empty)."""

    OP: ClassVar[Op] = Op.OFFSET_FETCH
    RESPONSE: ClassVar[type[Response]] = OffsetFetchResponse
    group: str = name_field()
    partitions: tuple[GroupPartition, ...] = many_field(GroupPartition, per_request)
    # KIP-447: a partition whose offset a transaction has pending answers
    # UNSTABLE_OFFSET_COMMIT (its `error`) until the transaction ends.
    require_stable: bool = flag_field(False)


@dataclass(frozen=True, slots=True)
class DescribedMember(Struct):
    member_id: str = name_field()
    instance_id: str = name_field()
    client_id: str = name_field()
    client_host: str = address_field()
    metadata: bytes = blob_field()
    assignment: bytes = blob_field()


@dataclass(frozen=True, slots=True)
class DescribeGroupResponse(Response):
    """`state` as Kafka names it: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    (a group the coordinator does not know)."""

    error: int = error_field()
    state: str = str_field(_GROUP_STATE_CHARS_MAX)
    protocol_type: str = name_field()
    protocol_name: str = name_field()
    members: tuple[DescribedMember, ...] = many_field(DescribedMember, _per_group)


@dataclass(frozen=True, slots=True)
class DescribeGroup(Request):
    OP: ClassVar[Op] = Op.DESCRIBE_GROUP
    RESPONSE: ClassVar[type[Response]] = DescribeGroupResponse
    group: str = name_field()


@dataclass(frozen=True, slots=True)
class ListedGroup(Struct):
    group: str = name_field()
    protocol_type: str = name_field()
    state: str = str_field(_GROUP_STATE_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Response):
    groups: tuple[ListedGroup, ...] = many_field(ListedGroup, per_frame)


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
    group: str = name_field()
