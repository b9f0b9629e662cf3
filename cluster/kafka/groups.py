"""The Kafka listener's consumer-group APIs, mapped onto the node's `GroupService`.

Role: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, TxnOffsetCommit, OffsetFetch,
DescribeGroups, ListGroups and DeleteGroups in Kafka's terms; what is decided, and when it is
answered, is the group service's (cluster/broker/groups.py) and its coordinator's
(cluster/broker/coordinator/).

Rules:
- Versions differ only in what they carry, which the codec fills with our defaults: JoinGroup
  v0 has no rebalance timeout (Kafka takes the session timeout); JoinGroup v4+ requires a known
  member id (KIP-394), so a new dynamic member gets MEMBER_ID_REQUIRED and an id first;
  LeaveGroup v0-2 names one member, v3+ several; OffsetFetch v8 asks for several groups; a
  JoinGroup's protocol name is null from v7 where no protocol was chosen.
- OffsetFetch with `require_stable` (KIP-447) answers UNSTABLE_OFFSET_COMMIT for a partition
  whose offset a transaction has pending (TxnOffsetCommit, v0-3; KIP-447's member checks from
  v3), until the transaction's marker; without it, the committed offset.
- Per-partition and per-group errors are answered where Kafka answers them; a whole-request
  failure is the wire's `refusal`.
"""

from __future__ import annotations

from cluster.broker.coordinator import (
    JoinRequest,
    MemberRef,
    Protocol,
    SyncRequest,
)
from cluster.broker.groups import CommitPartition, GroupService, client_host
from cluster.kafka import messages as m
from cluster.kafka.dispatch import Call, serves
from statemachine.errors import ErrorCode

KNOWN_MEMBER_ID_SINCE_VERSION = 4  # JoinGroup (KIP-394)
NULL_PROTOCOL_NAME_SINCE_VERSION = 7  # JoinGroup
MULTI_MEMBER_LEAVE_SINCE_VERSION = 3  # LeaveGroup (KIP-345)
MULTI_GROUP_FETCH_SINCE_VERSION = 8  # OffsetFetch
GROUP_ERROR_SINCE_VERSION = 2  # OffsetFetch: a top-level error code


class KafkaGroups:
    """The consumer-group APIs of one node's Kafka listener."""

    def __init__(self, groups: GroupService) -> None:
        self.groups = groups

    def answer_wait_s(self, body: m.RequestBody) -> float:
        """How long a JoinGroup or SyncGroup may be parked by design."""
        if isinstance(body, m.JoinGroupRequest):
            return self.groups.join_wait_s(_rebalance_timeout_ms(body))
        if isinstance(body, m.SyncGroupRequest):
            return self.groups.sync_wait_s(body.group_id)
        return 0.0

    @serves(m.JoinGroupRequest)
    async def join(self, request: m.JoinGroupRequest, call: Call) -> m.JoinGroupResponse:
        version = call.version
        result = await self.groups.join(
            JoinRequest(
                request.group_id,
                request.member_id,
                request.group_instance_id,
                call.client_id or "",
                client_host(call.source),
                request.session_timeout,
                _rebalance_timeout_ms(request),
                request.protocol_type,
                tuple(Protocol(p.name, p.metadata) for p in request.protocols),
                version >= KNOWN_MEMBER_ID_SINCE_VERSION,
            )
        )
        protocol_name = result.protocol_name
        if protocol_name is None and version < NULL_PROTOCOL_NAME_SINCE_VERSION:
            protocol_name = ""
        return m.JoinGroupResponse(
            int(result.error),
            result.generation,
            result.protocol_type,
            protocol_name,
            result.leader,
            member_id=result.member_id,
            members=tuple(
                m.JoinGroupResponseMember(x.member_id, x.metadata, x.instance_id)
                for x in result.members
            ),
        )

    @serves(m.SyncGroupRequest)
    async def sync(self, request: m.SyncGroupRequest, _call: Call) -> m.SyncGroupResponse:
        result = await self.groups.sync(
            SyncRequest(
                request.group_id,
                request.generation_id,
                request.member_id,
                request.group_instance_id,
                request.protocol_type,
                request.protocol_name,
                tuple((a.member_id, a.assignment) for a in request.assignments),
            )
        )
        return m.SyncGroupResponse(
            int(result.error), result.assignment, result.protocol_type, result.protocol_name
        )

    @serves(m.HeartbeatRequest)
    async def heartbeat(self, request: m.HeartbeatRequest, _call: Call) -> m.HeartbeatResponse:
        error = self.groups.heartbeat(
            request.group_id, request.generation_id, request.member_id, request.group_instance_id
        )
        return m.HeartbeatResponse(int(error))

    @serves(m.LeaveGroupRequest)
    async def leave(self, request: m.LeaveGroupRequest, call: Call) -> m.LeaveGroupResponse:
        if call.version < MULTI_MEMBER_LEAVE_SINCE_VERSION:
            error, (one,) = self.groups.leave(
                request.group_id, (MemberRef(request.member_id, None),)
            )
            return m.LeaveGroupResponse(int(error if error is not ErrorCode.NONE else one))
        refs = tuple(MemberRef(x.member_id, x.group_instance_id) for x in request.members)
        error, errors = self.groups.leave(request.group_id, refs)
        return m.LeaveGroupResponse(
            int(error),
            tuple(
                m.MemberResponse(ref.member_id, ref.instance_id, int(e))
                for ref, e in zip(refs, errors, strict=True)
            ),
        )

    # -- offsets -----------------------------------------------------------------------------

    @serves(m.OffsetCommitRequest)
    async def commit(self, request: m.OffsetCommitRequest, _call: Call) -> m.OffsetCommitResponse:
        errors = await self.groups.commit(
            request.group_id,
            request.generation_id_or_member_epoch,
            request.member_id,
            request.group_instance_id,
            _commit_partitions(request.topics),
        )
        return m.OffsetCommitResponse(m.commit_results(request.topics, errors))

    @serves(m.TxnOffsetCommitRequest)
    async def txn_commit(
        self, request: m.TxnOffsetCommitRequest, _call: Call
    ) -> m.TxnOffsetCommitResponse:
        """Offsets pending in the producer's transaction until its marker (AddOffsetsToTxn
        registered the group's offsets partition in it first)."""
        errors = await self.groups.commit(
            request.group_id,
            request.generation_id,
            request.member_id,
            request.group_instance_id,
            _commit_partitions(request.topics),
            producer=(request.producer_id, request.producer_epoch),
        )
        return m.TxnOffsetCommitResponse(m.commit_results(request.topics, errors))

    @serves(m.OffsetFetchRequest)
    async def fetch(self, request: m.OffsetFetchRequest, call: Call) -> m.OffsetFetchResponse:
        version = call.version
        if version >= MULTI_GROUP_FETCH_SINCE_VERSION:
            return m.OffsetFetchResponse(
                groups=tuple(
                    self._fetch_group(g.group_id, g.topics, require_stable=request.require_stable)
                    for g in request.groups
                )
            )
        group = self._fetch_group(
            request.group_id, request.topics, require_stable=request.require_stable
        )
        if version < GROUP_ERROR_SINCE_VERSION and group.error_code:
            # v0-1 carry no group error: each partition says it.
            return m.OffsetFetchResponse(topics=_every_partition(request, group.error_code))
        return m.OffsetFetchResponse(topics=group.topics, error_code=group.error_code)

    def _fetch_group(
        self,
        group_id: str,
        topics: tuple[m.OffsetFetchRequestTopic, ...] | None,
        *,
        require_stable: bool,
    ) -> m.OffsetFetchResponseGroup:
        asked = (
            None if topics is None else [(t.name, i) for t in topics for i in t.partition_indexes]
        )
        error, fetched = self.groups.fetch(group_id, asked, require_stable=require_stable)
        if error is not ErrorCode.NONE:
            return m.OffsetFetchResponseGroup(group_id, int(error))
        by_topic: dict[str, list[m.OffsetFetchResponsePartition]] = {}
        for f in fetched:
            by_topic.setdefault(f.topic, []).append(
                m.OffsetFetchResponsePartition(
                    f.partition, int(f.error), f.offset, f.leader_epoch, f.metadata
                )
            )
        return m.OffsetFetchResponseGroup(
            group_id,
            int(ErrorCode.NONE),
            tuple(m.OffsetFetchResponseTopic(t, tuple(ps)) for t, ps in by_topic.items()),
        )

    # -- administration ----------------------------------------------------------------------

    @serves(m.DescribeGroupsRequest)
    async def describe(
        self, request: m.DescribeGroupsRequest, _call: Call
    ) -> m.DescribeGroupsResponse:
        described = []
        for group_id in request.groups:
            error, view = self.groups.describe(group_id)
            if error is not ErrorCode.NONE:
                described.append(m.DescribedGroup(group_id, int(error)))
                continue
            members = tuple(
                m.DescribedGroupMember(
                    x.member_id, x.client_id, x.client_host, x.metadata, x.assignment, x.instance_id
                )
                for x in view.members
            )
            described.append(
                m.DescribedGroup(
                    group_id,
                    int(ErrorCode.NONE),
                    view.state.value,
                    view.protocol_type,
                    view.protocol_name,
                    members,
                )
            )
        return m.DescribeGroupsResponse(tuple(described))

    @serves(m.ListGroupsRequest)
    async def list(self, request: m.ListGroupsRequest, _call: Call) -> m.ListGroupsResponse:
        wanted = {s.lower() for s in request.states_filter}
        return m.ListGroupsResponse(
            int(ErrorCode.NONE),
            tuple(
                m.ListedGroup(g.group_id, g.protocol_type, g.state.value)
                for g in self.groups.listing()
                if not wanted or g.state.value.lower() in wanted
            ),
        )

    @serves(m.DeleteGroupsRequest)
    async def delete(self, request: m.DeleteGroupsRequest, _call: Call) -> m.DeleteGroupsResponse:
        results = []
        for group_id in request.groups_names:
            error = await self.groups.delete(group_id)
            results.append(m.DeletableGroupResult(group_id, int(error)))
        return m.DeleteGroupsResponse(tuple(results))

    @serves(m.OffsetDeleteRequest)
    async def offset_delete(
        self, request: m.OffsetDeleteRequest, _call: Call
    ) -> m.OffsetDeleteResponse:
        asked = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
        error, errors = await self.groups.delete_offsets(request.group_id, asked)
        if error is not ErrorCode.NONE:
            return m.OffsetDeleteResponse(error)
        return m.OffsetDeleteResponse(
            ErrorCode.NONE,
            tuple(
                m.OffsetDeleteResponseTopic(
                    t.name,
                    tuple(
                        m.OffsetDeleteResponsePartition(
                            p.partition_index, errors[t.name, p.partition_index]
                        )
                        for p in t.partitions
                    ),
                )
                for t in request.topics
            ),
        )


def _commit_partitions(topics: tuple[m.OffsetCommitRequestTopic, ...]) -> list[CommitPartition]:
    return [
        CommitPartition(
            t.name,
            p.partition_index,
            p.committed_offset,
            p.committed_leader_epoch,
            p.committed_metadata or "",
        )
        for t in topics
        for p in t.partitions
    ]


def _rebalance_timeout_ms(request: m.JoinGroupRequest) -> int:
    """JoinGroup v0 has no rebalance timeout: Kafka takes the session timeout."""
    return request.rebalance_timeout if request.rebalance_timeout >= 0 else request.session_timeout


def _every_partition(
    request: m.OffsetFetchRequest, error: int
) -> tuple[m.OffsetFetchResponseTopic, ...]:
    return tuple(
        m.OffsetFetchResponseTopic(
            t.name, tuple(m.OffsetFetchResponsePartition(i, error) for i in t.partition_indexes)
        )
        for t in request.topics or ()
    )
