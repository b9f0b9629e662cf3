"""The classic consumer-group protocol, sans I/O: what a group coordinator decides.

Role: the leader of an offsets partition (the coordinator of the groups that hash to it) keeps
one `Coordinator` for them. Each call takes a request or the time and returns `Effect`s: a
`Reply` to a request (now, or later for a JoinGroup or SyncGroup parked until the rebalance
moves on) and `Persist`, a group record the caller must commit through the partition's Raft
log before `persisted` is called (the end of a rebalance, a static member's new id, a group
left empty). The caller owns the sockets, the Raft proposals and the clock.

Rules:
- Pure, like the replicated state machines beside it: no I/O, no clock, no randomness. Time is
  the caller's `now_ms` (the coordinator's own clock: session and rebalance timers decide
  nothing on replicas; what they decide reaches replicas only as a persisted record). Member
  ids come from the caller's `new_member_id`.
- Kafka's classic protocol (kafka.coordinator.group.GroupCoordinator), its states, error codes
  and timers: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead; KIP-394's
  MEMBER_ID_REQUIRED, KIP-345's static members, the initial rebalance delay, and members that
  do not sync within their rebalance timeout dropped (KIP-814's pending-sync timeout).
- A coordinator starts from the replicated records (`load`): a group with members resumes
  Stable in its generation, and every session timer restarts now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import NamedTuple

from statemachine.errors import ErrorCode
from statemachine.group_records import GroupRecord, MemberRecord

NO_GENERATION = -1
NO_MEMBER = ""


class GroupState(Enum):
    """Kafka's names, as DescribeGroups and ListGroups report them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


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


# -- the coordinator's own state ---------------------------------------------------------------


@dataclass(slots=True)
class _Member:
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


@dataclass(slots=True)
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = NO_MEMBER
    members: dict[str, _Member] = field(default_factory=dict)  # in joining order
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending: dict[str, int] = field(default_factory=dict)  # KIP-394 ids issued -> deadline
    rebalance_deadline_ms: int | None = None  # PreparingRebalance gives up waiting then
    join_not_before_ms: int | None = None  # the initial rebalance delay
    sync_deadline_ms: int | None = None  # CompletingRebalance drops members not synced then
    persisting: int | None = None  # the seq of the record being committed (Persist.seq)
    # Static members whose JoinGroup waits for their new id to persist, and the leader id
    # each is told (the one before the replacement: see _replace_static).
    static_joins: dict[str, str] = field(default_factory=dict)

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


class Coordinator:
    """The groups of one offsets partition, on its leader."""

    def __init__(self, limits: CoordinatorLimits, new_member_id: Callable[[str], str]) -> None:
        self._limits = limits
        self._new_member_id = new_member_id
        self._groups: dict[str, _Group] = {}
        self._persist_seq = 0

    # -- loading and reading -------------------------------------------------------------------

    def load(self, records: Iterable[tuple[str, GroupRecord]], now_ms: int) -> None:
        """Resume the replicated groups: a group with members is Stable in its generation."""
        self._groups.clear()
        for group_id, record in records:
            group = _Group(
                group_id,
                GroupState.STABLE if record.members else GroupState.EMPTY,
                record.generation,
                record.protocol_type,
                record.protocol_name,
                record.leader,
            )
            for r in record.members:
                protocols = (Protocol(record.protocol_name, r.subscription),)
                member = _Member(
                    r.member_id,
                    r.instance_id,
                    r.client_id,
                    r.client_host,
                    r.session_timeout_ms,
                    r.rebalance_timeout_ms,
                    protocols,
                    r.assignment,
                    now_ms + r.session_timeout_ms,
                )
                group.members[r.member_id] = member
                if r.instance_id is not None:
                    group.static[r.instance_id] = r.member_id
            self._groups[group_id] = group

    def state(self, group_id: str) -> GroupState:
        group = self._groups.get(group_id)
        return GroupState.DEAD if group is None else group.state

    def describe(self, group_id: str) -> GroupView:
        group = self._groups.get(group_id)
        if group is None:
            return GroupView(group_id, GroupState.DEAD, "", "", ())
        stable = group.state is GroupState.STABLE
        members = tuple(
            MemberView(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupView(
            group_id,
            group.state,
            group.protocol_type,
            group.protocol_name if stable else "",
            members,
        )

    def generation(self, group_id: str) -> int:
        group = self._groups.get(group_id)
        return NO_GENERATION if group is None else group.generation

    def commit_refusal(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None, now_ms: int
    ) -> ErrorCode:
        """Why an OffsetCommit may not be written now (NONE: it may), as Kafka decides:
        generation -1 is a commit from outside the group, taken while the group has no
        members; a member commits in its generation, Stable or while the group rebalances (a
        consumer commits what it read before it rejoins), not between the join and the
        assignment. An unknown group with a generation: ILLEGAL_GENERATION (Kafka's)."""
        group = self._groups.get(group_id)
        if group is None or not group.members:
            if generation < 0:
                return ErrorCode.NONE
            return ErrorCode.ILLEGAL_GENERATION if group is None else ErrorCode.UNKNOWN_MEMBER_ID
        error = self._fenced(group, member_id, instance_id)
        if error is not ErrorCode.NONE:
            return error
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = group.members[member_id]
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        return ErrorCode.NONE

    def rebalance_timeout_ms(self, group_id: str) -> int:
        """The longest rebalance timeout of the group's members (0 for an unknown group)."""
        group = self._groups.get(group_id)
        return 0 if group is None else self._rebalance_timeout_ms(group)

    def forget(self, group_id: str) -> None:
        """DeleteGroups: the group is gone, unless members joined it meanwhile (the caller
        checked it was empty before its entry went through the log)."""
        group = self._groups.get(group_id)
        if group is not None and not group.members and not group.pending:
            del self._groups[group_id]

    def prune(self, kept: Callable[[str], bool]) -> None:
        """Forget Empty groups with nothing in flight that the log no longer `kept` (expired,
        deleted, or never more than a MEMBER_ID_REQUIRED): a coordinator's groups stay bounded
        by what is replicated and what is live."""
        for group_id in [
            g.group_id
            for g in self._groups.values()
            if g.state is GroupState.EMPTY
            and not g.members
            and not g.pending
            and g.persisting is None
            and not kept(g.group_id)
        ]:
            del self._groups[group_id]

    def listing(self) -> list[tuple[str, str, GroupState]]:
        """ListGroups: (group id, protocol type, state) of every group, by id."""
        return [(g.group_id, g.protocol_type, g.state) for _, g in sorted(self._groups.items())]

    # -- JoinGroup ---------------------------------------------------------------------------

    def join(self, request: JoinRequest, token: int, now_ms: int) -> list[Effect]:
        error = self._join_refusal(request)
        if error is not ErrorCode.NONE:
            return [Reply(token, JoinResult(error, member_id=request.member_id))]
        group = self._groups.get(request.group_id)
        if group is None and request.member_id != NO_MEMBER:
            return [
                Reply(token, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=request.member_id))
            ]
        if group is None:
            if len(self._groups) >= self._limits.groups_max:
                return [Reply(token, JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))]
            group = self._groups[request.group_id] = _Group(request.group_id)
        if not self._protocols_fit(group, request):
            return [Reply(token, JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))]
        if request.member_id == NO_MEMBER:
            return self._join_new(group, request, token, now_ms)
        return self._join_known(group, request, token, now_ms)

    def _join_refusal(self, request: JoinRequest) -> ErrorCode:
        if not request.group_id:
            return ErrorCode.INVALID_GROUP_ID
        limits = self._limits
        if not (
            limits.session_timeout_ms_min
            <= request.session_timeout_ms
            <= limits.session_timeout_ms_max
        ):
            return ErrorCode.INVALID_SESSION_TIMEOUT
        if not request.protocol_type or not request.protocols:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return ErrorCode.NONE

    @staticmethod
    def _protocols_fit(group: _Group, request: JoinRequest) -> bool:
        """A group with members takes a joiner of its protocol type that shares a protocol
        with every member (the one it rejoins as excepted)."""
        others = [m for m in group.members.values() if m.member_id != request.member_id]
        if not others:
            return True
        if request.protocol_type != group.protocol_type:
            return False
        names = {p.name for p in request.protocols}
        for member in others:
            names &= {p.name for p in member.protocols}
        return bool(names)

    def _join_new(
        self, group: _Group, request: JoinRequest, token: int, now_ms: int
    ) -> list[Effect]:
        if request.instance_id is not None and request.instance_id in group.static:
            return self._replace_static(group, request, token, now_ms)
        if len(group.members) + len(group.pending) >= self._limits.group_members_max:
            return [Reply(token, JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED))]
        member_id = self._new_member_id(request.instance_id or request.client_id)
        if request.require_known_member_id and request.instance_id is None:
            # KIP-394: the id first, the membership on the rejoin that carries it.
            group.pending[member_id] = now_ms + request.session_timeout_ms
            result = JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
            return [Reply(token, result)]
        return self._add_member(group, request, member_id, token, now_ms)

    def _join_known(
        self, group: _Group, request: JoinRequest, token: int, now_ms: int
    ) -> list[Effect]:
        member_id = request.member_id
        if member_id in group.pending:
            del group.pending[member_id]
            return self._add_member(group, request, member_id, token, now_ms)
        fenced = self._fenced(group, member_id, request.instance_id)
        if fenced is not ErrorCode.NONE:
            return [Reply(token, JoinResult(fenced, member_id=member_id))]
        member = group.members[member_id]
        effects = self._release_join(
            member, ErrorCode.REBALANCE_IN_PROGRESS, now_ms
        )  # a retried join replaces the parked one
        member.session_deadline_ms = now_ms + request.session_timeout_ms
        changed = member.protocols != request.protocols
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update(member, request, token)
            return effects + self._maybe_complete_join(group, now_ms)
        if group.state is GroupState.COMPLETING_REBALANCE and not changed:
            return [*effects, Reply(token, self._join_result(group, member))]
        if group.state is GroupState.STABLE and not changed and member_id != group.leader:
            return [*effects, Reply(token, self._join_result(group, member))]
        self._update(member, request, token)
        return effects + self._prepare_rebalance(group, now_ms)

    def _fenced(self, group: _Group, member_id: str, instance_id: str | None) -> ErrorCode:
        """UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID for a caller that is not this member."""
        if instance_id is not None:
            current = group.static.get(instance_id)
            if current is not None and current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    def _add_member(
        self, group: _Group, request: JoinRequest, member_id: str, token: int, now_ms: int
    ) -> list[Effect]:
        if not group.members:
            group.protocol_type = request.protocol_type
        member = _Member(
            member_id,
            request.instance_id,
            request.client_id,
            request.client_host,
            request.session_timeout_ms,
            request.rebalance_timeout_ms,
            request.protocols,
            session_deadline_ms=now_ms + request.session_timeout_ms,
            join_token=token,
        )
        group.members[member_id] = member
        if request.instance_id is not None:
            group.static[request.instance_id] = member_id
        if not group.leader:
            group.leader = member_id
        if group.state is GroupState.PREPARING_REBALANCE:
            if group.join_not_before_ms is not None:  # a newcomer extends the initial delay
                self._extend_initial_delay(group, now_ms)
            return self._maybe_complete_join(group, now_ms)
        return self._prepare_rebalance(group, now_ms)

    @staticmethod
    def _update(member: _Member, request: JoinRequest, token: int) -> None:
        member.protocols = request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.join_token = token

    def _replace_static(
        self, group: _Group, request: JoinRequest, token: int, now_ms: int
    ) -> list[Effect]:
        """KIP-345: a static member back under a new id takes its old one's place and the old
        id is fenced. A Stable group keeps its generation and assignments when the joiner's
        protocols leave the group's choice as it is: no rebalance."""
        assert request.instance_id is not None
        old_id = group.static[request.instance_id]
        old = group.members.pop(old_id)
        effects = self._release_join(old, ErrorCode.FENCED_INSTANCE_ID, now_ms)
        effects += self._release_sync(old, SyncResult(ErrorCode.FENCED_INSTANCE_ID), now_ms)
        group.static_joins.pop(old_id, None)
        new_id = self._new_member_id(request.instance_id)
        member = replace(
            old,
            member_id=new_id,
            client_id=request.client_id,
            client_host=request.client_host,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            protocols=request.protocols,
            session_deadline_ms=now_ms + request.session_timeout_ms,
            join_token=token,
            sync_token=None,
        )
        group.members[new_id] = member
        group.static[request.instance_id] = new_id
        leader_before = group.leader
        if group.leader == old_id:
            group.leader = new_id
        if group.state is GroupState.STABLE and self._select_protocol(group) == group.protocol_name:
            # Kafka tells it the leader id of before: a returning leader under its new id must
            # not assign, since a Stable group would never pass its assignment on.
            group.static_joins[new_id] = leader_before
            return [*effects, self._persist(group)]
        if group.state is GroupState.PREPARING_REBALANCE:
            return effects + self._maybe_complete_join(group, now_ms)
        return effects + self._prepare_rebalance(group, now_ms)

    # -- rebalancing -------------------------------------------------------------------------

    def _prepare_rebalance(self, group: _Group, now_ms: int) -> list[Effect]:
        """Every member must rejoin; members waiting on a SyncGroup are told so."""
        effects: list[Effect] = []
        for member in group.members.values():
            effects += self._release_sync(
                member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS), now_ms
            )
        if group.state is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
        initial = group.state is GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        group.sync_deadline_ms = None
        group.persisting = None
        group.rebalance_deadline_ms = now_ms + self._rebalance_timeout_ms(group)
        group.join_not_before_ms = None
        if initial and self._limits.initial_rebalance_delay_ms > 0:
            # Kafka's InitialDelayedJoin: a new group waits for the rest of its members to
            # show up rather than rebalance once per arrival.
            group.join_not_before_ms = now_ms + min(
                self._limits.initial_rebalance_delay_ms, self._rebalance_timeout_ms(group)
            )
        return effects + self._maybe_complete_join(group, now_ms)

    @staticmethod
    def _rebalance_timeout_ms(group: _Group) -> int:
        return max((m.rebalance_timeout_ms for m in group.members.values()), default=0)

    def _extend_initial_delay(self, group: _Group, now_ms: int) -> None:
        """Kafka's InitialDelayedJoin: each newcomer during the delay starts it again, up to
        the rebalance timeout."""
        assert group.join_not_before_ms is not None
        assert group.rebalance_deadline_ms is not None
        extended = now_ms + self._limits.initial_rebalance_delay_ms
        group.join_not_before_ms = min(max(group.join_not_before_ms, extended),
                                       group.rebalance_deadline_ms)  # fmt: skip

    def _maybe_complete_join(self, group: _Group, now_ms: int) -> list[Effect]:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return []
        assert group.rebalance_deadline_ms is not None
        if group.join_not_before_ms is not None:
            if now_ms < group.join_not_before_ms:
                return []
            group.join_not_before_ms = None  # the initial delay is over
        everyone = all(m.join_token is not None for m in group.members.values())
        if (everyone and not group.pending) or now_ms >= group.rebalance_deadline_ms:
            return self._complete_join(group, now_ms)
        return []

    def _complete_join(self, group: _Group, now_ms: int) -> list[Effect]:
        """Dynamic members that did not rejoin are dropped and the generation moves on: the
        members learn it, the leader with every member's subscription. A static member that
        did not rejoin stays (Kafka's rule: it may be restarting; its session, or the sync
        deadline, ends it), unless nobody rejoined: then the wait starts again."""
        for member in [
            m for m in group.members.values() if m.join_token is None and m.instance_id is None
        ]:
            self._remove(group, member)
        rejoined = [m for m in group.members.values() if m.join_token is not None]
        if group.members and not rejoined:
            group.rebalance_deadline_ms = now_ms + self._rebalance_timeout_ms(group)
            return []
        group.pending.clear()
        group.generation += 1
        group.rebalance_deadline_ms = group.join_not_before_ms = None
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_name = ""
            group.leader = NO_MEMBER
            return [self._persist(group)]
        if group.leader not in {m.member_id for m in rejoined}:
            group.leader = rejoined[0].member_id
        group.protocol_name = self._select_protocol(group)
        group.state = GroupState.COMPLETING_REBALANCE
        group.sync_deadline_ms = now_ms + self._rebalance_timeout_ms(group)
        effects: list[Effect] = []
        for member in rejoined:
            assert member.join_token is not None
            token, member.join_token = member.join_token, None
            member.session_deadline_ms = now_ms + member.session_timeout_ms
            effects.append(Reply(token, self._join_result(group, member)))
        return effects

    @staticmethod
    def _select_protocol(group: _Group) -> str:
        """The protocol every member supports that most members prefer; a tie goes to the
        leader's preference order."""
        members = list(group.members.values())
        common = {p.name for p in members[0].protocols}
        for member in members[1:]:
            common &= {p.name for p in member.protocols}
        assert common, "a member without a common protocol was admitted"
        votes: dict[str, int] = {}
        for member in members:
            choice = next(p.name for p in member.protocols if p.name in common)
            votes[choice] = votes.get(choice, 0) + 1
        leader = group.members.get(group.leader, members[0])
        order = [p.name for p in leader.protocols if p.name in common]
        return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))

    @staticmethod
    def _join_result(group: _Group, member: _Member) -> JoinResult:
        members: tuple[JoinMember, ...] = ()
        if member.member_id == group.leader:
            members = tuple(
                JoinMember(m.member_id, m.instance_id, m.metadata_for(group.protocol_name))
                for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.NONE,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader,
            member.member_id,
            members,
        )

    # -- SyncGroup ---------------------------------------------------------------------------

    def sync(self, request: SyncRequest, token: int, now_ms: int) -> list[Effect]:
        group = self._groups.get(request.group_id)
        if group is None:
            return [Reply(token, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))]
        error = self._fenced(group, request.member_id, request.instance_id)
        if error is ErrorCode.NONE and request.generation != group.generation:
            error = ErrorCode.ILLEGAL_GENERATION
        if error is ErrorCode.NONE and not self._same_protocol(group, request):
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is ErrorCode.NONE and group.state is GroupState.PREPARING_REBALANCE:
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if error is not ErrorCode.NONE:
            return [Reply(token, SyncResult(error))]
        member = group.members[request.member_id]
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if group.state is GroupState.STABLE:
            return [Reply(token, self._sync_result(group, member))]
        assert group.state is GroupState.COMPLETING_REBALANCE, group.state
        effects = self._release_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS), now_ms)
        member.sync_token = token
        if request.member_id != group.leader or group.persisting is not None:
            return effects
        assigned = dict(request.assignments)
        for m in group.members.values():
            m.assignment = assigned.get(m.member_id, b"")
        return [*effects, self._persist(group)]

    @staticmethod
    def _same_protocol(group: _Group, request: SyncRequest) -> bool:
        """SyncGroup v5+ names the protocol; older versions send None."""
        return request.protocol_type in (None, group.protocol_type) and (
            request.protocol_name in (None, group.protocol_name)
        )

    @staticmethod
    def _sync_result(group: _Group, member: _Member) -> SyncResult:
        return SyncResult(
            ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
        )

    # -- persisted records -------------------------------------------------------------------

    def _persist(self, group: _Group) -> Persist:
        """The group's record to commit; what waits on it waits for this one's commit."""
        self._persist_seq += 1
        group.persisting = self._persist_seq
        return Persist(group.group_id, group.record(), self._persist_seq)

    def persisted(self, group_id: str, seq: int, now_ms: int) -> list[Effect]:
        """The record `seq` is committed: what waited on it goes on."""
        group = self._groups.get(group_id)
        if group is None or group.persisting != seq:
            return []  # overtaken by a later record, whose commit answers for both
        group.persisting = None
        effects: list[Effect] = []
        if group.state is GroupState.COMPLETING_REBALANCE:
            group.state = GroupState.STABLE
            group.sync_deadline_ms = None
            for member in group.members.values():
                member.session_deadline_ms = now_ms + member.session_timeout_ms
                effects += self._release_sync(member, self._sync_result(group, member), now_ms)
        for member_id, leader in group.static_joins.items():
            member = group.members[member_id]
            result = self._join_result(group, member)._replace(leader=leader, members=())
            effects += self._release_join(member, result, now_ms)
        group.static_joins.clear()
        return effects

    def persist_failed(self, group_id: str, seq: int, now_ms: int) -> list[Effect]:
        """The record `seq` could not be committed (still this partition's leader): its
        members rebalance again."""
        group = self._groups.get(group_id)
        if group is None or group.persisting != seq:
            return []
        group.persisting = None
        effects: list[Effect] = []
        for member_id in group.static_joins:
            error = JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=member_id)
            effects += self._release_join(group.members[member_id], error, now_ms)
        group.static_joins.clear()
        if group.members:
            effects += self._prepare_rebalance(group, now_ms)
        return effects

    def abandon(self) -> list[Reply]:
        """Leadership is lost: every parked request gets NOT_COORDINATOR, and the state goes
        (the next coordinator loads the replicated records)."""
        replies: list[Reply] = []
        for group in self._groups.values():
            for member in group.members.values():
                if member.join_token is not None:
                    replies.append(Reply(member.join_token, JoinResult(ErrorCode.NOT_COORDINATOR)))
                if member.sync_token is not None:
                    replies.append(Reply(member.sync_token, SyncResult(ErrorCode.NOT_COORDINATOR)))
        self._groups.clear()
        return replies

    # -- Heartbeat, LeaveGroup ---------------------------------------------------------------

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None, now_ms: int
    ) -> ErrorCode:
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        error = self._fenced(group, member_id, instance_id)
        if error is not ErrorCode.NONE:
            return error
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        member = group.members[member_id]
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(
        self, group_id: str, members: tuple[MemberRef, ...], now_ms: int
    ) -> tuple[ErrorCode, list[ErrorCode], list[Effect]]:
        """The group's error, one per member, and what the departures set off."""
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(members), []
        errors: list[ErrorCode] = []
        effects: list[Effect] = []
        for ref in members:
            member_id = ref.member_id
            if member_id in group.pending:  # given an id (KIP-394), never joined with it
                del group.pending[member_id]
                errors.append(ErrorCode.NONE)
                effects += self._maybe_complete_join(group, now_ms)
                continue
            if member_id == NO_MEMBER and ref.instance_id is not None:
                member_id = group.static.get(ref.instance_id, NO_MEMBER)  # KIP-345 by instance
            error = self._fenced(group, member_id, ref.instance_id)
            errors.append(error)
            if error is ErrorCode.NONE:
                effects += self._depart(group, group.members[member_id], now_ms)
        return ErrorCode.NONE, errors, effects

    def _depart(self, group: _Group, member: _Member, now_ms: int) -> list[Effect]:
        effects = self._release_join(member, ErrorCode.UNKNOWN_MEMBER_ID, now_ms)
        effects += self._release_sync(member, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID), now_ms)
        self._remove(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return effects + self._maybe_complete_join(group, now_ms)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            return effects + self._prepare_rebalance(group, now_ms)
        return effects

    @staticmethod
    def _remove(group: _Group, member: _Member) -> None:
        del group.members[member.member_id]
        group.static_joins.pop(member.member_id, None)
        if member.instance_id is not None and group.static.get(member.instance_id) == (
            member.member_id
        ):
            del group.static[member.instance_id]

    # -- time --------------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        """When `tick` next has something to do."""
        deadlines = [d for g in self._groups.values() for d in self._deadlines(g)]
        return min(deadlines, default=None)

    @staticmethod
    def _deadlines(group: _Group) -> Iterable[int]:
        yield from group.pending.values()
        for member in group.members.values():
            if member.join_token is None and member.sync_token is None:
                yield member.session_deadline_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            assert group.rebalance_deadline_ms is not None
            yield group.join_not_before_ms or group.rebalance_deadline_ms
        if group.sync_deadline_ms is not None and group.persisting is None:
            yield group.sync_deadline_ms

    def tick(self, now_ms: int) -> list[Effect]:
        """Expire sessions, end rebalances that waited long enough."""
        effects: list[Effect] = []
        for group in list(self._groups.values()):
            effects += self._tick_group(group, now_ms)
        return effects

    def _tick_group(self, group: _Group, now_ms: int) -> list[Effect]:
        group.pending = {m: d for m, d in group.pending.items() if d > now_ms}
        effects: list[Effect] = []
        for member in list(group.members.values()):
            if group.members.get(member.member_id) is not member:
                continue  # gone meanwhile: a rebalance the last departure completed
            parked = member.join_token is not None or member.sync_token is not None
            if not parked and member.session_deadline_ms <= now_ms:
                effects += self._depart(group, member, now_ms)
        if (
            group.state is GroupState.COMPLETING_REBALANCE
            and group.persisting is None
            and group.sync_deadline_ms is not None
            and now_ms >= group.sync_deadline_ms
        ):
            for member in [m for m in group.members.values() if m.sync_token is None]:
                if group.members.get(member.member_id) is member:
                    effects += self._depart(group, member, now_ms)
        return effects + self._maybe_complete_join(group, now_ms)

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _release_join(member: _Member, answer: JoinResult | ErrorCode, now_ms: int) -> list[Effect]:
        """Answer a parked JoinGroup; the member's session runs again from now."""
        if member.join_token is None:
            return []
        token, member.join_token = member.join_token, None
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if isinstance(answer, ErrorCode):
            answer = JoinResult(answer, member_id=member.member_id)
        return [Reply(token, answer)]

    @staticmethod
    def _release_sync(member: _Member, answer: SyncResult, now_ms: int) -> list[Effect]:
        """Answer a parked SyncGroup; the member's session runs again from now."""
        if member.sync_token is None:
            return []
        token, member.sync_token = member.sync_token, None
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        return [Reply(token, answer)]
