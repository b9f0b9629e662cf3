"""Consumer groups: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13),
OffsetCommit (8), OffsetFetch (9), DescribeGroups (15), ListGroups (16), DeleteGroups (42),
OffsetDelete (47).

Part of the Kafka messages (cluster/kafka/messages/__init__.py has their rules): each request
class names its API, the versions served, its response and how it is refused whole.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from cluster.kafka.messages.base import Api, Request, Response, VersionRange

# -- JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13) -----------------------------


NO_GENERATION = -1
UNKNOWN_MEMBER_ID = ""  # a member's first JoinGroup: the coordinator names it


@dataclass(frozen=True, slots=True)
class JoinGroupRequestProtocol:
    name: str  # the assignor ("range", "roundrobin", "cooperative-sticky", ...)
    metadata: bytes  # opaque to the coordinator (the consumer's subscription)


@dataclass(frozen=True, slots=True)
class JoinGroupResponseMember:
    member_id: str
    metadata: bytes
    group_instance_id: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Response):
    error_code: int
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None  # v7+
    # Nullable in v7+ only: "" where none was chosen, as Kafka writes it before v7.
    protocol_name: str | None = ""
    leader: str = ""
    skip_assignment: bool = False  # v9+
    member_id: str = UNKNOWN_MEMBER_ID
    members: tuple[JoinGroupResponseMember, ...] = ()  # the leader's answer only
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class SyncGroupRequestAssignment:
    member_id: str
    assignment: bytes  # opaque to the coordinator (the consumer's partitions)


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Response):
    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatResponse(Response):
    error_code: int
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class MemberResponse:
    member_id: str
    group_instance_id: str | None
    error_code: int


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse(Response):
    error_code: int
    members: tuple[MemberResponse, ...] = ()  # v3+: each member's outcome
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class JoinGroupRequest(Request):
    API = Api.JOIN_GROUP
    VERSIONS = VersionRange(0, 9)
    RESPONSE = JoinGroupResponse

    group_id: str
    session_timeout: int
    member_id: str
    protocol_type: str  # "consumer" for Kafka's consumers
    protocols: tuple[JoinGroupRequestProtocol, ...]
    rebalance_timeout: int = -1  # v1+; v0 has none: Kafka takes the session timeout
    group_instance_id: str | None = None  # v5+: a static member's id (KIP-345)
    reason: str | None = None  # v8+: why the member (re)joins (KIP-800)

    def refusal(self, code: int, message: str) -> JoinGroupResponse:  # noqa: ARG002
        return JoinGroupResponse(code, member_id=self.member_id)


@dataclass(frozen=True, slots=True)
class SyncGroupRequest(Request):
    API = Api.SYNC_GROUP
    VERSIONS = VersionRange(0, 5)
    RESPONSE = SyncGroupResponse

    group_id: str
    generation_id: int
    member_id: str
    assignments: tuple[SyncGroupRequestAssignment, ...] = ()  # the leader's only
    group_instance_id: str | None = None  # v3+
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+

    def refusal(self, code: int, message: str) -> SyncGroupResponse:  # noqa: ARG002
        return SyncGroupResponse(code)


@dataclass(frozen=True, slots=True)
class HeartbeatRequest(Request):
    API = Api.HEARTBEAT
    VERSIONS = VersionRange(0, 4)
    RESPONSE = HeartbeatResponse

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None  # v3+

    def refusal(self, code: int, message: str) -> HeartbeatResponse:  # noqa: ARG002
        return HeartbeatResponse(code)


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest(Request):
    API = Api.LEAVE_GROUP
    VERSIONS = VersionRange(0, 5)
    RESPONSE = LeaveGroupResponse

    group_id: str
    member_id: str = ""  # v0-v2: one member
    members: tuple[MemberIdentity, ...] = ()  # v3+: several at once (KIP-345)

    def refusal(self, code: int, message: str) -> LeaveGroupResponse:  # noqa: ARG002
        return LeaveGroupResponse(code)  # as Kafka refuses it: no member's outcome


# -- OffsetCommit (8) and OffsetFetch (9) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitRequestPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1  # v6+
    committed_metadata: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitRequestTopic:
    name: str
    partitions: tuple[OffsetCommitRequestPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitResponsePartition:
    partition_index: int
    error_code: int


@dataclass(frozen=True, slots=True)
class OffsetCommitResponseTopic:
    name: str
    partitions: tuple[OffsetCommitResponsePartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Response):
    topics: tuple[OffsetCommitResponseTopic, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetFetchRequestTopic:
    name: str
    partition_indexes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetFetchRequestGroup:
    group_id: str
    topics: tuple[OffsetFetchRequestTopic, ...] | None = None  # None: every committed partition


@dataclass(frozen=True, slots=True)
class OffsetFetchResponsePartition:
    partition_index: int
    error_code: int
    committed_offset: int = -1  # -1: nothing committed
    committed_leader_epoch: int = -1  # v5+
    metadata: str | None = ""  # "" where nothing was committed, as Kafka answers


@dataclass(frozen=True, slots=True)
class OffsetFetchResponseTopic:
    name: str
    partitions: tuple[OffsetFetchResponsePartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchResponseGroup:
    group_id: str
    error_code: int
    topics: tuple[OffsetFetchResponseTopic, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Response):
    # v1-v7 answer one group in these fields (its error code from v2); v8+ every group in
    # `groups`.
    topics: tuple[OffsetFetchResponseTopic, ...] = ()
    error_code: int = 0
    groups: tuple[OffsetFetchResponseGroup, ...] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest(Request):
    # From v2, kio's oldest and the oldest a client sends (kafka-python 2.0, aiokafka 0.11); up
    # to v8, the last before KIP-848's member epochs.
    API = Api.OFFSET_COMMIT
    VERSIONS = VersionRange(2, 8)
    RESPONSE = OffsetCommitResponse

    group_id: str
    topics: tuple[OffsetCommitRequestTopic, ...]
    # The member's generation; -1 with an empty member id: a commit from outside the group
    # (a consumer with manual assignment, the admin client).
    generation_id_or_member_epoch: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None  # v7+
    retention_time: int = -1  # v2-v4; -1: the broker's retention

    def refusal(self, code: int, message: str) -> OffsetCommitResponse:  # noqa: ARG002
        return OffsetCommitResponse(commit_results(self.topics, itertools.repeat(code)))


def commit_results(
    topics: tuple[OffsetCommitRequestTopic, ...], codes: Iterable[int]
) -> tuple[OffsetCommitResponseTopic, ...]:
    """A commit's answer (OffsetCommit's or TxnOffsetCommit's): `codes`, one per partition
    in the request's order, in the request's topics."""
    each = iter(codes)
    return tuple(
        OffsetCommitResponseTopic(
            t.name,
            tuple(
                OffsetCommitResponsePartition(p.partition_index, int(next(each)))
                for p in t.partitions
            ),
        )
        for t in topics
    )


# -- TxnOffsetCommit (28) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitResponse(Response):
    topics: tuple[OffsetCommitResponseTopic, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequest(Request):
    # v0-v3 (v3: the member's generation and ids, KIP-447); v4+ ask the broker to verify the
    # transaction itself (KIP-890), which this one always does: not served.
    API = Api.TXN_OFFSET_COMMIT
    VERSIONS = VersionRange(0, 3)
    RESPONSE = TxnOffsetCommitResponse

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    topics: tuple[OffsetCommitRequestTopic, ...]
    generation_id: int = NO_GENERATION  # v3+
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None

    def refusal(self, code: int, message: str) -> TxnOffsetCommitResponse:  # noqa: ARG002
        return TxnOffsetCommitResponse(commit_results(self.topics, itertools.repeat(code)))


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest(Request):
    # As OffsetCommit's: v1 is the oldest a client sends.
    API = Api.OFFSET_FETCH
    VERSIONS = VersionRange(1, 8)
    RESPONSE = OffsetFetchResponse

    # v1-v7 ask for one group in these fields; v8+ for several in `groups` (KIP-709).
    group_id: str = ""
    topics: tuple[OffsetFetchRequestTopic, ...] | None = None  # None (v2+): every partition
    groups: tuple[OffsetFetchRequestGroup, ...] = ()
    require_stable: bool = False  # v7+ (KIP-447)

    def refusal(self, code: int, message: str) -> OffsetFetchResponse:  # noqa: ARG002
        # v1 carries codes per partition only, v2-v7 the group's too, v8+ one per group.
        return OffsetFetchResponse(
            tuple(
                OffsetFetchResponseTopic(
                    t.name,
                    tuple(OffsetFetchResponsePartition(i, code) for i in t.partition_indexes),
                )
                for t in self.topics or ()
            ),
            code,
            tuple(OffsetFetchResponseGroup(g.group_id, code) for g in self.groups),
        )


# -- DescribeGroups (15), ListGroups (16), DeleteGroups (42) -------------------------------------


@dataclass(frozen=True, slots=True)
class DescribedGroupMember:
    member_id: str
    client_id: str
    client_host: str
    member_metadata: bytes = b""
    member_assignment: bytes = b""
    group_instance_id: str | None = None  # v4+


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error_code: int
    group_state: str = ""  # "Stable", "Empty", "Dead", ... ("" with an error)
    protocol_type: str = ""
    protocol_data: str = ""  # the chosen protocol (the assignor) while the group is stable
    members: tuple[DescribedGroupMember, ...] = ()
    authorized_operations: int = -(2**31)  # v3+; -2^31: not asked for


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse(Response):
    groups: tuple[DescribedGroup, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str = ""  # v4+


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Response):
    error_code: int
    groups: tuple[ListedGroup, ...] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeletableGroupResult:
    group_id: str
    error_code: int


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse(Response):
    results: tuple[DeletableGroupResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribeGroupsRequest(Request):
    API = Api.DESCRIBE_GROUPS
    VERSIONS = VersionRange(0, 5)
    RESPONSE = DescribeGroupsResponse

    groups: tuple[str, ...]
    include_authorized_operations: bool = False  # v3+

    def refusal(self, code: int, message: str) -> DescribeGroupsResponse:  # noqa: ARG002
        return DescribeGroupsResponse(tuple(DescribedGroup(g, code) for g in self.groups))


@dataclass(frozen=True, slots=True)
class ListGroupsRequest(Request):
    API = Api.LIST_GROUPS
    VERSIONS = VersionRange(0, 4)
    RESPONSE = ListGroupsResponse

    states_filter: tuple[str, ...] = ()  # v4+: only groups in these states; () for every group

    def refusal(self, code: int, message: str) -> ListGroupsResponse:  # noqa: ARG002
        return ListGroupsResponse(code)


@dataclass(frozen=True, slots=True)
class DeleteGroupsRequest(Request):
    API = Api.DELETE_GROUPS
    VERSIONS = VersionRange(0, 2)
    RESPONSE = DeleteGroupsResponse

    groups_names: tuple[str, ...]

    def refusal(self, code: int, message: str) -> DeleteGroupsResponse:  # noqa: ARG002
        return DeleteGroupsResponse(tuple(DeletableGroupResult(g, code) for g in self.groups_names))


@dataclass(frozen=True, slots=True)
class OffsetDeleteRequestPartition:
    partition_index: int


@dataclass(frozen=True, slots=True)
class OffsetDeleteRequestTopic:
    name: str
    partitions: tuple[OffsetDeleteRequestPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponsePartition:
    partition_index: int
    error_code: int


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponseTopic:
    name: str
    partitions: tuple[OffsetDeleteResponsePartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponse(Response):
    error_code: int
    topics: tuple[OffsetDeleteResponseTopic, ...] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetDeleteRequest(Request):
    API = Api.OFFSET_DELETE
    VERSIONS = VersionRange(0, 0)
    RESPONSE = OffsetDeleteResponse

    group_id: str
    topics: tuple[OffsetDeleteRequestTopic, ...]

    def refusal(self, code: int, message: str) -> OffsetDeleteResponse:  # noqa: ARG002
        return OffsetDeleteResponse(code)
