"""What the group coordinator is asked and answers: its limits, requests, results, effects and
the views DescribeGroups and ListGroups show. Plain values, shared by the coordinator and the
two listeners that translate their protocol's group requests into these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from cluster.broker.coordinator.states import GroupState
from statemachine.errors import ErrorCode
from statemachine.group_records import GroupRecord

NO_GENERATION = -1
NO_MEMBER = ""


@dataclass(frozen=True, slots=True)
class CoordinatorLimits:
    """Kafka's broker settings of the same names (group.min.session.timeout.ms, ...)."""

    session_timeout_ms_min: int = 6_000
    session_timeout_ms_max: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    group_members_max: int = 1_000
    groups_max: int = 10_000

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"CoordinatorLimits.{name}: {value!r} is not a count >= 0")
        if self.session_timeout_ms_min > self.session_timeout_ms_max:
            raise ValueError("CoordinatorLimits: session_timeout_ms_min > session_timeout_ms_max")


# -- requests and answers -------------------------------------------------------------------------


class Protocol(NamedTuple):
    name: str
    metadata: bytes


class JoinRequest(NamedTuple):
    group_id: str
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    require_known_member_id: bool  # JoinGroup v4+ (KIP-394)


class JoinMember(NamedTuple):
    member_id: str
    instance_id: str | None
    metadata: bytes


class JoinResult(NamedTuple):
    error: ErrorCode
    generation: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = NO_MEMBER
    member_id: str = NO_MEMBER
    members: tuple[JoinMember, ...] = ()  # the leader's only


class SyncRequest(NamedTuple):
    group_id: str
    generation: int
    member_id: str
    instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: tuple[tuple[str, bytes], ...]  # the leader's only


class SyncResult(NamedTuple):
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class MemberRef(NamedTuple):
    member_id: str
    instance_id: str | None


class Reply(NamedTuple):
    """The answer to the request the caller registered as `token`."""

    token: int
    result: JoinResult | SyncResult


class Persist(NamedTuple):
    """Commit `record` through the log, then call `persisted(group_id, seq)` (or
    `persist_failed`). `seq` tells this record from a later one of the same generation (two
    static members replaced one after the other): only the latest record's commit counts."""

    group_id: str
    record: GroupRecord
    seq: int


Effect = Reply | Persist


class MemberView(NamedTuple):
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class GroupView(NamedTuple):
    """What DescribeGroups shows of one group."""

    group_id: str
    state: GroupState
    protocol_type: str
    protocol_name: str
    members: tuple[MemberView, ...]
