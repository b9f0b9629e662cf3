"""One consumer group as its coordinator holds it: its members, its state, and what is read off
them (the protocol the group runs, each member's answers, the deadlines it waits on).

Role: the coordinator's own, unreplicated state of a group. Its state changes only through
`Group.move`, by the table of states.py; the group's record (`Group.record`) is what reaches
replicas, through the log.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from cluster.broker.coordinator.messages import (
    NO_MEMBER,
    Effect,
    JoinMember,
    JoinRequest,
    JoinResult,
    Protocol,
    Reply,
    SyncRequest,
    SyncResult,
)
from cluster.broker.coordinator.states import Event, GroupState, next_state
from statemachine.errors import ErrorCode
from statemachine.group_records import GroupRecord, MemberRecord


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[Protocol, ...]
    assignment: bytes = b""
    session_deadline_ms: int = 0
    join_token: int | None = None  # a JoinGroup parked until the rebalance completes
    sync_token: int | None = None  # a SyncGroup parked until the leader's assignment persists

    def metadata_for(self, protocol: str) -> bytes:
        return next((p.metadata for p in self.protocols if p.name == protocol), b"")

    def update(self, request: JoinRequest, token: int) -> None:
        """A rejoin: the member's protocols and timeouts as it now sends them, its join parked."""
        self.protocols = request.protocols
        self.session_timeout_ms = request.session_timeout_ms
        self.rebalance_timeout_ms = request.rebalance_timeout_ms
        self.join_token = token

    def release_join(self, answer: JoinResult | ErrorCode, now_ms: int) -> list[Effect]:
        """Answer a parked JoinGroup; the member's session runs again from now."""
        if self.join_token is None:
            return []
        token, self.join_token = self.join_token, None
        self.session_deadline_ms = now_ms + self.session_timeout_ms
        if isinstance(answer, ErrorCode):
            answer = JoinResult(answer, member_id=self.member_id)
        return [Reply(token, answer)]

    def release_sync(self, answer: SyncResult, now_ms: int) -> list[Effect]:
        """Answer a parked SyncGroup; the member's session runs again from now."""
        if self.sync_token is None:
            return []
        token, self.sync_token = self.sync_token, None
        self.session_deadline_ms = now_ms + self.session_timeout_ms
        return [Reply(token, answer)]


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY  # changed only by `move`
    generation: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = NO_MEMBER
    members: dict[str, Member] = field(default_factory=dict)  # in joining order
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending: dict[str, int] = field(default_factory=dict)  # KIP-394 ids issued -> deadline
    rebalance_deadline_ms: int | None = None  # PreparingRebalance gives up waiting then
    join_not_before_ms: int | None = None  # the initial rebalance delay
    sync_deadline_ms: int | None = None  # CompletingRebalance drops members not synced then
    persisting: int | None = None  # the seq of the record being committed (Persist.seq)
    # Static members whose JoinGroup waits for their new id to persist, and the leader id
    # each is told (the one before the replacement: see Coordinator._replace_static).
    static_joins: dict[str, str] = field(default_factory=dict)

    def move(self, event: Event) -> None:
        self.state = next_state(self.state, event)

    def record(self) -> GroupRecord:
        members = tuple(
            MemberRecord(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.session_timeout_ms,
                m.rebalance_timeout_ms,
                m.metadata_for(self.protocol_name),
                m.assignment,
            )
            for m in self.members.values()
        )
        return GroupRecord(
            self.generation, self.protocol_type, self.protocol_name, self.leader, members
        )

    def subscriptions(self) -> frozenset[str] | None:
        """The topics the members subscribe to, read from their metadata of the chosen
        protocol (ConsumerProtocolSubscription); None when one cannot be read or no protocol
        is chosen yet."""
        if not self.members:
            return frozenset()
        if not self.protocol_name:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            read = subscribed_topics(member.metadata_for(self.protocol_name))
            if read is None:
                return None
            topics |= read
        return frozenset(topics)

    def fenced(self, member_id: str, instance_id: str | None) -> ErrorCode:
        """UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID for a caller that is not this member."""
        if instance_id is not None:
            current = self.static.get(instance_id)
            if current is not None and current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    def fits(self, request: JoinRequest) -> bool:
        """A group with members takes a joiner of its protocol type that shares a protocol
        with every member (the one it rejoins as excepted)."""
        others = [m for m in self.members.values() if m.member_id != request.member_id]
        if not others:
            return True
        if request.protocol_type != self.protocol_type:
            return False
        names = {p.name for p in request.protocols}
        for member in others:
            names &= {p.name for p in member.protocols}
        return bool(names)

    def same_protocol(self, request: SyncRequest) -> bool:
        """SyncGroup v5+ names the protocol; older versions send None."""
        return request.protocol_type in (None, self.protocol_type) and (
            request.protocol_name in (None, self.protocol_name)
        )

    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout of the members (0 without members)."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer; a tie goes to the
        leader's preference order."""
        members = list(self.members.values())
        common = {p.name for p in members[0].protocols}
        for member in members[1:]:
            common &= {p.name for p in member.protocols}
        assert common, "a member without a common protocol was admitted"
        votes: dict[str, int] = {}
        for member in members:
            choice = next(p.name for p in member.protocols if p.name in common)
            votes[choice] = votes.get(choice, 0) + 1
        leader = self.members.get(self.leader, members[0])
        order = [p.name for p in leader.protocols if p.name in common]
        return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))

    def join_result(self, member: Member) -> JoinResult:
        """A JoinGroup's answer in this generation: the leader's carries every member."""
        members: tuple[JoinMember, ...] = ()
        if member.member_id == self.leader:
            members = tuple(
                JoinMember(m.member_id, m.instance_id, m.metadata_for(self.protocol_name))
                for m in self.members.values()
            )
        return JoinResult(
            ErrorCode.NONE,
            self.generation,
            self.protocol_type,
            self.protocol_name,
            self.leader,
            member.member_id,
            members,
        )

    def sync_result(self, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment)

    def remove(self, member: Member) -> None:
        del self.members[member.member_id]
        self.static_joins.pop(member.member_id, None)
        if member.instance_id is not None and self.static.get(member.instance_id) == (
            member.member_id
        ):
            del self.static[member.instance_id]

    def deadlines(self) -> Iterable[int]:
        """Every time at which the coordinator's tick has something to do for this group."""
        yield from self.pending.values()
        for member in self.members.values():
            if member.join_token is None and member.sync_token is None:
                yield member.session_deadline_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            assert self.rebalance_deadline_ms is not None
            yield self.join_not_before_ms or self.rebalance_deadline_ms
        if self.sync_deadline_ms is not None and self.persisting is None:
            yield self.sync_deadline_ms


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a ConsumerProtocolSubscription (every version starts with its version and
    topic names, not flexible), or None when the bytes are not one."""
    try:
        version, count = struct.unpack_from(">hi", metadata)
        if version < 0 or count < 0:
            return None
        at, topics = 6, set()
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, at)
            if not 0 <= length <= len(metadata) - at - 2:
                return None
            topics.add(metadata[at + 2 : at + 2 + length].decode())
            at += 2 + length
    except (struct.error, UnicodeDecodeError):
        return None
    return frozenset(topics)
