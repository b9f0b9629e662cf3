"""`Coordinator`: the groups of one offsets partition, on its leader, and every decision of
Kafka's classic group protocol about them (join, sync, heartbeat, leave, commit fencing,
static members, timers), sans I/O: requests and the caller's `now_ms` in, `Effect`s out.
The package docstring (cluster/broker/coordinator/__init__.py) has its rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from cluster.broker.coordinator.group import Group, Member
from cluster.broker.coordinator.messages import (
    NO_GENERATION,
    NO_MEMBER,
    CoordinatorLimits,
    Effect,
    GroupView,
    JoinRequest,
    JoinResult,
    MemberRef,
    MemberView,
    Persist,
    Protocol,
    Reply,
    SyncRequest,
    SyncResult,
)
from cluster.broker.coordinator.states import Event, GroupState
from statemachine.errors import ErrorCode
from statemachine.group_records import GroupRecord


class Coordinator:
    """The groups of one offsets partition, on its leader."""

    def __init__(self, limits: CoordinatorLimits, new_member_id: Callable[[str], str]) -> None:
        self._limits = limits
        self._new_member_id = new_member_id
        self._groups: dict[str, Group] = {}
        self._persist_seq = 0

    # -- loading and reading -------------------------------------------------------------------

    def load(self, records: Iterable[tuple[str, GroupRecord]], now_ms: int) -> None:
        """Resume the replicated groups: a group with members is Stable in its generation."""
        self._groups.clear()
        for group_id, record in records:
            group = Group(
                group_id,
                GroupState.STABLE if record.members else GroupState.EMPTY,
                record.generation,
                record.protocol_type,
                record.protocol_name,
                record.leader,
            )
            for r in record.members:
                protocols = (Protocol(record.protocol_name, r.subscription),)
                member = Member(
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

    def subscriptions(self, group_id: str) -> frozenset[str] | None:
        """The topics the group's members subscribe to (None: not known: OffsetDelete then
        keeps every offset, as Kafka does)."""
        group = self._groups.get(group_id)
        return frozenset() if group is None else group.subscriptions()

    def generation(self, group_id: str) -> int:
        group = self._groups.get(group_id)
        return NO_GENERATION if group is None else group.generation

    def commit_refusal(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        now_ms: int,
        *,
        transactional: bool = False,
    ) -> ErrorCode:
        """Why an OffsetCommit may not be written now (NONE: it may), as Kafka decides:
        generation -1 is a commit from outside the group, taken while the group has no
        members; a member commits in its generation, Stable or while the group rebalances (a
        consumer commits what it read before it rejoins), not between the join and the
        assignment. An unknown group with a generation: ILLEGAL_GENERATION (Kafka's).
        A TxnOffsetCommit (`transactional`) naming no member is taken whatever the group's
        state (the producer of a pre-KIP-447 client knows none); one naming a member is
        checked as a member's commit, except between the join and the assignment, as
        Kafka's `validateOffsetCommit`."""
        if transactional and generation < 0 and not member_id and instance_id is None:
            return ErrorCode.NONE
        group = self._groups.get(group_id)
        if group is None or not group.members:
            if generation < 0:
                return ErrorCode.NONE
            return ErrorCode.ILLEGAL_GENERATION if group is None else ErrorCode.UNKNOWN_MEMBER_ID
        error = group.fenced(member_id, instance_id)
        if error is not ErrorCode.NONE:
            return error
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE and not transactional:
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = group.members[member_id]
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        return ErrorCode.NONE

    def rebalance_timeout_ms(self, group_id: str) -> int:
        """The longest rebalance timeout of the group's members (0 for an unknown group)."""
        group = self._groups.get(group_id)
        return 0 if group is None else group.rebalance_timeout_ms()

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
            group = self._groups[request.group_id] = Group(request.group_id)
        if not group.fits(request):
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

    def _join_new(
        self, group: Group, request: JoinRequest, token: int, now_ms: int
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
        self, group: Group, request: JoinRequest, token: int, now_ms: int
    ) -> list[Effect]:
        member_id = request.member_id
        if member_id in group.pending:
            del group.pending[member_id]
            return self._add_member(group, request, member_id, token, now_ms)
        fenced = group.fenced(member_id, request.instance_id)
        if fenced is not ErrorCode.NONE:
            return [Reply(token, JoinResult(fenced, member_id=member_id))]
        member = group.members[member_id]
        effects = member.release_join(
            ErrorCode.REBALANCE_IN_PROGRESS, now_ms
        )  # a retried join replaces the parked one
        member.session_deadline_ms = now_ms + request.session_timeout_ms
        changed = member.protocols != request.protocols
        if group.state is GroupState.PREPARING_REBALANCE:
            member.update(request, token)
            return effects + self._maybe_complete_join(group, now_ms)
        if group.state is GroupState.COMPLETING_REBALANCE and not changed:
            return [*effects, Reply(token, group.join_result(member))]
        if group.state is GroupState.STABLE and not changed and member_id != group.leader:
            return [*effects, Reply(token, group.join_result(member))]
        member.update(request, token)
        return effects + self._prepare_rebalance(group, now_ms)

    def _add_member(
        self, group: Group, request: JoinRequest, member_id: str, token: int, now_ms: int
    ) -> list[Effect]:
        if not group.members:
            group.protocol_type = request.protocol_type
        member = Member(
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

    def _replace_static(
        self, group: Group, request: JoinRequest, token: int, now_ms: int
    ) -> list[Effect]:
        """KIP-345: a static member back under a new id takes its old one's place and the old
        id is fenced. A Stable group keeps its generation and assignments when the joiner's
        protocols leave the group's choice as it is: no rebalance."""
        assert request.instance_id is not None
        old_id = group.static[request.instance_id]
        old = group.members.pop(old_id)
        effects = old.release_join(ErrorCode.FENCED_INSTANCE_ID, now_ms)
        effects += old.release_sync(SyncResult(ErrorCode.FENCED_INSTANCE_ID), now_ms)
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
        if group.state is GroupState.STABLE and group.select_protocol() == group.protocol_name:
            # Kafka tells it the leader id of before: a returning leader under its new id must
            # not assign, since a Stable group would never pass its assignment on.
            group.static_joins[new_id] = leader_before
            return [*effects, self._persist(group)]
        if group.state is GroupState.PREPARING_REBALANCE:
            return effects + self._maybe_complete_join(group, now_ms)
        return effects + self._prepare_rebalance(group, now_ms)

    # -- rebalancing -------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, now_ms: int) -> list[Effect]:
        """Every member must rejoin; members waiting on a SyncGroup are told so."""
        effects: list[Effect] = []
        for member in group.members.values():
            effects += member.release_sync(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS), now_ms)
        if group.state is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
        initial = group.state is GroupState.EMPTY
        group.move(Event.REBALANCE)
        group.sync_deadline_ms = None
        group.persisting = None
        group.rebalance_deadline_ms = now_ms + group.rebalance_timeout_ms()
        group.join_not_before_ms = None
        if initial and self._limits.initial_rebalance_delay_ms > 0:
            # Kafka's InitialDelayedJoin: a new group waits for the rest of its members to
            # show up rather than rebalance once per arrival.
            group.join_not_before_ms = now_ms + min(
                self._limits.initial_rebalance_delay_ms, group.rebalance_timeout_ms()
            )
        return effects + self._maybe_complete_join(group, now_ms)

    def _extend_initial_delay(self, group: Group, now_ms: int) -> None:
        """Kafka's InitialDelayedJoin: each newcomer during the delay starts it again, up to
        the rebalance timeout."""
        assert group.join_not_before_ms is not None
        assert group.rebalance_deadline_ms is not None
        extended = now_ms + self._limits.initial_rebalance_delay_ms
        group.join_not_before_ms = min(max(group.join_not_before_ms, extended),
                                       group.rebalance_deadline_ms)  # fmt: skip

    def _maybe_complete_join(self, group: Group, now_ms: int) -> list[Effect]:
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

    def _complete_join(self, group: Group, now_ms: int) -> list[Effect]:
        """Dynamic members that did not rejoin are dropped and the generation moves on: the
        members learn it, the leader with every member's subscription. A static member that
        did not rejoin stays (Kafka's rule: it may be restarting; its session, or the sync
        deadline, ends it), unless nobody rejoined: then the wait starts again."""
        for member in [
            m for m in group.members.values() if m.join_token is None and m.instance_id is None
        ]:
            group.remove(member)
        rejoined = [m for m in group.members.values() if m.join_token is not None]
        if group.members and not rejoined:
            group.rebalance_deadline_ms = now_ms + group.rebalance_timeout_ms()
            return []
        group.pending.clear()
        group.generation += 1
        group.rebalance_deadline_ms = group.join_not_before_ms = None
        if not group.members:
            group.move(Event.EMPTIED)
            group.protocol_name = ""
            group.leader = NO_MEMBER
            return [self._persist(group)]
        if group.leader not in {m.member_id for m in rejoined}:
            group.leader = rejoined[0].member_id
        group.protocol_name = group.select_protocol()
        group.move(Event.JOINED)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms()
        effects: list[Effect] = []
        for member in rejoined:
            assert member.join_token is not None
            token, member.join_token = member.join_token, None
            member.session_deadline_ms = now_ms + member.session_timeout_ms
            effects.append(Reply(token, group.join_result(member)))
        return effects

    # -- SyncGroup ---------------------------------------------------------------------------

    def sync(self, request: SyncRequest, token: int, now_ms: int) -> list[Effect]:
        group = self._groups.get(request.group_id)
        if group is None:
            return [Reply(token, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))]
        error = group.fenced(request.member_id, request.instance_id)
        if error is ErrorCode.NONE and request.generation != group.generation:
            error = ErrorCode.ILLEGAL_GENERATION
        if error is ErrorCode.NONE and not group.same_protocol(request):
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is ErrorCode.NONE and group.state is GroupState.PREPARING_REBALANCE:
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if error is not ErrorCode.NONE:
            return [Reply(token, SyncResult(error))]
        member = group.members[request.member_id]
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if group.state is GroupState.STABLE:
            return [Reply(token, group.sync_result(member))]
        assert group.state is GroupState.COMPLETING_REBALANCE, group.state
        effects = member.release_sync(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS), now_ms)
        member.sync_token = token
        if request.member_id != group.leader or group.persisting is not None:
            return effects
        assigned = dict(request.assignments)
        for m in group.members.values():
            m.assignment = assigned.get(m.member_id, b"")
        return [*effects, self._persist(group)]

    # -- persisted records -------------------------------------------------------------------

    def _persist(self, group: Group) -> Persist:
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
            group.move(Event.ASSIGNED)
            group.sync_deadline_ms = None
            for member in group.members.values():
                member.session_deadline_ms = now_ms + member.session_timeout_ms
                effects += member.release_sync(group.sync_result(member), now_ms)
        for member_id, leader in group.static_joins.items():
            member = group.members[member_id]
            result = group.join_result(member)._replace(leader=leader, members=())
            effects += member.release_join(result, now_ms)
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
            effects += group.members[member_id].release_join(error, now_ms)
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
        error = group.fenced(member_id, instance_id)
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
            error = group.fenced(member_id, ref.instance_id)
            errors.append(error)
            if error is ErrorCode.NONE:
                effects += self._depart(group, group.members[member_id], now_ms)
        return ErrorCode.NONE, errors, effects

    def _depart(self, group: Group, member: Member, now_ms: int) -> list[Effect]:
        effects = member.release_join(ErrorCode.UNKNOWN_MEMBER_ID, now_ms)
        effects += member.release_sync(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID), now_ms)
        group.remove(member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return effects + self._maybe_complete_join(group, now_ms)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            return effects + self._prepare_rebalance(group, now_ms)
        return effects

    # -- time --------------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        """When `tick` next has something to do."""
        deadlines = [d for g in self._groups.values() for d in g.deadlines()]
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> list[Effect]:
        """Expire sessions, end rebalances that waited long enough."""
        effects: list[Effect] = []
        for group in list(self._groups.values()):
            effects += self._tick_group(group, now_ms)
        return effects

    def _tick_group(self, group: Group, now_ms: int) -> list[Effect]:
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
