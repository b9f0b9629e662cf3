"""The native listener's consumer-group requests, mapped onto the node's `GroupService`.

Role: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, TxnOffsetCommit,
OffsetFetch,
DescribeGroup, ListGroups and DeleteGroup of the native protocol (cluster/native/), in the
group service's terms (cluster/broker/groups.py decides, cluster/broker/coordinator/ is the
protocol). The
Kafka listener's twin is cluster/kafka/groups.py; both reach the same coordinators, so a
native consumer and a Kafka client can share a group.

Rules:
- A group's errors are its answer's `error` field, never a refusal of the whole request: a
  JoinGroup's MEMBER_ID_REQUIRED carries the id to use, and NOT_COORDINATOR sends the client
  to FindCoordinator again.
- Every dynamic native member is a KIP-394 one (its first JoinGroup gets an id and
  MEMBER_ID_REQUIRED): a member that dies before its first answer leaves nothing behind. A
  static one (with an instance id) joins at once, as in Kafka.
- An empty `instance_id` is a dynamic member; empty strings stand for Kafka's nulls.
"""

from __future__ import annotations

from cluster import native as p
from cluster.broker.coordinator import JoinRequest, MemberRef, Protocol, SyncRequest
from cluster.broker.groups import CommitPartition, GroupService, client_host
from cluster.broker.node import Node
from statemachine.errors import ErrorCode

NO_LEADER_EPOCH = -1  # native consumers track no leader epochs


class NativeGroups:
    """The consumer-group requests of one node's native listener."""

    def __init__(self, node: Node, groups: GroupService) -> None:
        self.node = node
        self.groups = groups

    def answer_wait_s(self, request: p.Request) -> float:
        """How long a JoinGroup or SyncGroup may be parked by design."""
        if isinstance(request, p.JoinGroup):
            return self.groups.join_wait_s(request.rebalance_timeout_ms)
        if isinstance(request, p.SyncGroup):
            return self.groups.sync_wait_s(request.group)
        return 0.0

    async def handle(self, request: p.Request, source: str) -> p.Response | None:
        """The answer to a group request from address `source`; None for any other request."""
        match request:
            case p.FindCoordinator():
                return await self.find_coordinator(request)
            case p.JoinGroup():
                return await self.join(request, source)
            case p.SyncGroup():
                return await self.sync(request)
            case p.Heartbeat():
                error = self.groups.heartbeat(
                    request.group, request.generation, request.member_id, _null(request.instance_id)
                )
                return p.GroupErrorResponse(error)
            case p.LeaveGroup():
                return self.leave(request)
            case p.OffsetCommit() | p.TxnOffsetCommit():
                return await self.commit(request)
            case p.OffsetFetch():
                return self.fetch(request)
            case p.DescribeGroup():
                return self.describe(request)
            case p.ListGroups():
                return self.list()
            case p.DeleteGroup():
                return p.GroupErrorResponse(await self.groups.delete(request.group))
        return None

    async def find_coordinator(self, request: p.FindCoordinator) -> p.FindCoordinatorResponse:
        return coordinator_answer(self.node, *await self.groups.coordinator_node(request.key))

    async def join(self, request: p.JoinGroup, source: str) -> p.JoinGroupResponse:
        result = await self.groups.join(
            JoinRequest(
                request.group,
                request.member_id,
                _null(request.instance_id),
                request.client_id,
                client_host(source),
                request.session_timeout_ms,
                request.rebalance_timeout_ms,
                request.protocol_type,
                tuple(Protocol(x.name, x.metadata) for x in request.protocols),
                require_known_member_id=True,
            )
        )
        return p.JoinGroupResponse(
            result.error,
            result.generation,
            result.protocol_name or "",
            result.leader,
            result.member_id,
            tuple(
                p.JoinedMember(x.member_id, x.instance_id or "", x.metadata) for x in result.members
            ),
        )

    async def sync(self, request: p.SyncGroup) -> p.SyncGroupResponse:
        result = await self.groups.sync(
            SyncRequest(
                request.group,
                request.generation,
                request.member_id,
                _null(request.instance_id),
                None,
                None,
                tuple((a.member_id, a.assignment) for a in request.assignments),
            )
        )
        return p.SyncGroupResponse(result.error, result.assignment)

    def leave(self, request: p.LeaveGroup) -> p.GroupErrorResponse:
        ref = MemberRef(request.member_id, _null(request.instance_id))
        error, (one,) = self.groups.leave(request.group, (ref,))
        return p.GroupErrorResponse(error if error is not ErrorCode.NONE else one)

    async def commit(self, request: p.OffsetCommit | p.TxnOffsetCommit) -> p.OffsetCommitResponse:
        """OffsetCommit, or TxnOffsetCommit: the offsets pending in the producer's
        transaction."""
        asked = [
            CommitPartition(o.topic, o.partition, o.offset, NO_LEADER_EPOCH, o.metadata)
            for o in request.offsets
        ]
        producer = None
        if isinstance(request, p.TxnOffsetCommit):
            producer = (request.producer_id, request.producer_epoch)
        errors = await self.groups.commit(
            request.group,
            request.generation,
            request.member_id,
            _null(request.instance_id),
            asked,
            producer=producer,
        )
        return p.OffsetCommitResponse(
            tuple(
                p.CommitResult(o.topic, o.partition, e)
                for o, e in zip(request.offsets, errors, strict=True)
            )
        )

    def fetch(self, request: p.OffsetFetch) -> p.OffsetFetchResponse:
        asked = [(x.topic, x.partition) for x in request.partitions] or None
        error, fetched = self.groups.fetch(
            request.group, asked, require_stable=request.require_stable
        )
        return p.OffsetFetchResponse(
            error,
            tuple(
                p.GroupOffset(f.topic, f.partition, f.offset, f.metadata, f.error) for f in fetched
            ),
        )

    def describe(self, request: p.DescribeGroup) -> p.DescribeGroupResponse:
        error, view = self.groups.describe(request.group)
        return p.DescribeGroupResponse(
            error,
            view.state.value,
            view.protocol_type,
            view.protocol_name,
            tuple(
                p.DescribedMember(
                    x.member_id,
                    x.instance_id or "",
                    x.client_id,
                    x.client_host,
                    x.metadata,
                    x.assignment,
                )
                for x in view.members
            ),
        )

    def list(self) -> p.ListGroupsResponse:
        return p.ListGroupsResponse(
            tuple(
                p.ListedGroup(g.group_id, g.protocol_type, g.state.value)
                for g in self.groups.listing()
            )
        )


def coordinator_answer(node: Node, error: ErrorCode, node_id: int) -> p.FindCoordinatorResponse:
    """FindCoordinator's answer: the coordinator's id and client address, or why none."""
    peer = node.peer(node_id) if error is ErrorCode.NONE else None
    if peer is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE if error is ErrorCode.NONE else error
        return p.FindCoordinatorResponse(error, -1, "")
    return p.FindCoordinatorResponse(ErrorCode.NONE, node_id, peer.client_address)


def _null(text: str) -> str | None:
    """Kafka's null for the wire's empty string (no static instance id)."""
    return text or None
