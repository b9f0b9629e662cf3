"""The classic group protocol's coordinator, driven as the broker drives it: requests, the
time, and the commit of each record it asks to persist. Error codes are checked where Kafka
returns them, since the clients act on each one differently."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from cluster.broker.coordinator import (
    Coordinator,
    CoordinatorLimits,
    Effect,
    GroupState,
    JoinRequest,
    JoinResult,
    MemberRef,
    Persist,
    Protocol,
    Reply,
    SyncRequest,
    SyncResult,
)
from cluster.broker.coordinator.states import TRANSITIONS, Event, next_state
from statemachine.errors import ErrorCode
from statemachine.group_records import GroupRecord

SESSION_MS = 10_000
REBALANCE_MS = 30_000
RANGE = (Protocol("range", b"range-sub"),)


@dataclass
class Harness:
    """One coordinator, its clock, and what it answered."""

    initial_delay_ms: int = 0
    members_max: int = 1_000
    now: int = 1_000
    replies: dict[int, JoinResult | SyncResult] = field(default_factory=dict)
    persists: list[Persist] = field(default_factory=list)

    def __post_init__(self) -> None:
        ids = itertools.count(1)
        limits = CoordinatorLimits(
            initial_rebalance_delay_ms=self.initial_delay_ms, group_members_max=self.members_max
        )
        self.coordinator = Coordinator(limits, lambda prefix: f"{prefix}-{next(ids)}")
        self._tokens = itertools.count(1)

    def take(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                assert effect.token not in self.replies, f"token {effect.token} answered twice"
                self.replies[effect.token] = effect.result
            else:
                self.persists.append(effect)

    def join(
        self,
        member_id: str = "",
        *,
        instance: str | None = None,
        protocols: tuple[Protocol, ...] = RANGE,
        protocol_type: str = "consumer",
        session_ms: int = SESSION_MS,
        group: str = "g",
        client: str = "c",
    ) -> int:
        token = next(self._tokens)
        request = JoinRequest(group, member_id, instance, client, "/127.0.0.1", session_ms,
                              REBALANCE_MS, protocol_type, protocols, True)  # fmt: skip
        self.take(self.coordinator.join(request, token, self.now))
        return token

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        instance: str | None = None,
        group: str = "g",
    ) -> int:
        token = next(self._tokens)
        request = SyncRequest(group, generation, member_id, instance, "consumer", None,
                              tuple((assignments or {}).items()))  # fmt: skip
        self.take(self.coordinator.sync(request, token, self.now))
        return token

    def heartbeat(self, member_id: str, generation: int, instance: str | None = None) -> ErrorCode:
        return self.coordinator.heartbeat("g", generation, member_id, instance, self.now)

    def commit_persists(self) -> list[GroupRecord]:
        persisted, self.persists = self.persists, []
        for p in persisted:
            self.take(self.coordinator.persisted(p.group_id, p.seq, self.now))
        return [p.record for p in persisted]

    def advance(self, ms: int) -> None:
        self.now += ms
        self.take(self.coordinator.tick(self.now))

    def joined(self, token: int) -> JoinResult:
        result = self.replies[token]
        assert isinstance(result, JoinResult), result
        return result

    def synced(self, token: int) -> SyncResult:
        result = self.replies[token]
        assert isinstance(result, SyncResult), result
        return result

    def new_member(self, **kwargs: object) -> str:
        """A dynamic member through KIP-394's two joins; returns the token of the second."""
        first = self.joined(self.join(**kwargs))  # type: ignore[arg-type]
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        return first.member_id

    def stable_group(self, count: int) -> tuple[list[str], int]:
        """`count` members, Stable, each assigned its own id as bytes."""
        ids = [self.new_member() for _ in range(count)]
        tokens = [self.join(m) for m in ids]
        if any(t not in self.replies for t in tokens):
            self.advance(REBALANCE_MS)
        results = [self.joined(t) for t in tokens]
        generation = results[0].generation
        assert all(r.error is ErrorCode.NONE and r.generation == generation for r in results)
        leader = results[0].leader
        syncs = [self.sync(m, generation, {x: x.encode() for x in ids} if m == leader else None)
                 for m in ids]  # fmt: skip
        self.commit_persists()
        assert [self.synced(t).assignment for t in syncs] == [m.encode() for m in ids]
        assert self.coordinator.state("g") is GroupState.STABLE
        return ids, generation


def test_a_new_member_gets_an_id_first_and_joins_with_it() -> None:
    h = Harness()
    first = h.joined(h.join(client="app"))
    assert first.error is ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id == "app-1"
    assert h.coordinator.state("g") is GroupState.EMPTY  # the id alone does not join
    token = h.join(first.member_id)
    result = h.joined(token)
    assert (result.error, result.generation, result.leader) == (ErrorCode.NONE, 1, "app-1")
    assert result.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in result.members] == [("app-1", b"range-sub")]
    assert h.coordinator.state("g") is GroupState.COMPLETING_REBALANCE


def test_the_leaders_assignment_reaches_each_member_once_persisted() -> None:
    h = Harness()
    a, b = h.new_member(), h.new_member()
    ta, tb = h.join(a), h.join(b)
    ra, rb = h.joined(ta), h.joined(tb)
    assert ra.generation == rb.generation == 1
    assert ra.leader == rb.leader == a
    assert len(ra.members) == 2 and rb.members == ()  # only the leader sees subscriptions
    sb = h.sync(b, 1)
    assert sb not in h.replies  # a follower waits for the leader's assignment
    sa = h.sync(a, 1, {a: b"p0", b: b"p1"})
    assert sa not in h.replies and sb not in h.replies  # ... and for its commit
    [record] = h.commit_persists()
    assert record.generation == 1
    assert [(m.member_id, m.assignment) for m in record.members] == [(a, b"p0"), (b, b"p1")]
    assert (h.synced(sa).assignment, h.synced(sb).assignment) == (b"p0", b"p1")
    assert h.coordinator.state("g") is GroupState.STABLE


def test_a_newcomer_makes_every_member_rejoin_and_the_generation_move_on() -> None:
    h = Harness()
    (a,), generation = h.stable_group(1)
    c = h.new_member()
    tc = h.join(c)
    assert tc not in h.replies
    assert h.heartbeat(a, generation) is ErrorCode.REBALANCE_IN_PROGRESS
    ta = h.join(a)
    assert h.joined(ta).generation == h.joined(tc).generation == generation + 1
    assert h.joined(ta).leader == a  # the leader stays while it is a member


def test_a_member_that_does_not_rejoin_in_the_rebalance_timeout_is_dropped() -> None:
    h = Harness()
    (a, b), generation = h.stable_group(2)
    c = h.new_member()
    tc = h.join(c)
    ta = h.join(a)
    for _ in range(REBALANCE_MS // 5_000 - 1):  # b heartbeats (so its session holds), never joins
        h.advance(5_000)
        assert h.heartbeat(b, generation) is ErrorCode.REBALANCE_IN_PROGRESS
    h.advance(4_999)
    assert tc not in h.replies
    h.advance(1)
    result = h.joined(ta)
    assert result.generation == generation + 1
    assert {m.member_id for m in result.members} == {a, c}
    assert h.heartbeat(b, generation) is ErrorCode.UNKNOWN_MEMBER_ID


def test_an_expired_session_starts_a_rebalance_without_the_member() -> None:
    h = Harness()
    (a, b), generation = h.stable_group(2)
    for _ in range(3):  # a heartbeats, b is silent
        h.advance(SESSION_MS // 3)
        assert h.heartbeat(a, generation) is ErrorCode.NONE
    h.advance(SESSION_MS // 3)
    assert h.coordinator.state("g") is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, generation) is ErrorCode.REBALANCE_IN_PROGRESS
    result = h.joined(h.join(a))
    assert (result.generation, [m.member_id for m in result.members]) == (generation + 1, [a])
    assert h.heartbeat(b, generation + 1) is ErrorCode.UNKNOWN_MEMBER_ID


def test_stale_generations_and_unknown_members_are_refused() -> None:
    h = Harness()
    (a,), generation = h.stable_group(1)
    assert h.heartbeat(a, generation - 1) is ErrorCode.ILLEGAL_GENERATION
    assert h.synced(h.sync(a, generation + 1)).error is ErrorCode.ILLEGAL_GENERATION
    assert h.heartbeat("nobody", generation) is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.synced(h.sync("nobody", generation)).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.joined(h.join("nobody")).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.synced(h.sync(a, generation, group="other")).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_member_back_under_a_new_id_keeps_generation_and_assignment() -> None:
    h = Harness()
    first = h.joined(h.join(instance="i1"))  # a static member joins at once (no KIP-394)
    assert first.error is ErrorCode.NONE
    old = first.member_id
    h.take([])
    sync = h.sync(old, first.generation, {old: b"p0"})
    h.commit_persists()
    assert h.synced(sync).assignment == b"p0"
    token = h.join(instance="i1")  # the same instance restarted: a new id, no rebalance
    assert token not in h.replies  # answered once its new id is persisted
    [record] = h.commit_persists()
    result = h.joined(token)
    assert result.error is ErrorCode.NONE
    assert result.generation == first.generation == record.generation
    assert result.member_id != old and result.leader == old  # not told it leads: no reassign
    assert [(m.member_id, m.instance_id) for m in record.members] == [(result.member_id, "i1")]
    assert h.coordinator.state("g") is GroupState.STABLE
    assert h.synced(h.sync(result.member_id, result.generation)).assignment == b"p0"
    assert h.heartbeat(old, first.generation, "i1") is ErrorCode.FENCED_INSTANCE_ID


def test_two_static_members_back_at_once_are_answered_once_both_new_ids_are_persisted() -> None:
    h = Harness(initial_delay_ms=100)
    ta, tb = h.join(instance="i1"), h.join(instance="i2")
    h.advance(100)
    a, b = h.joined(ta), h.joined(tb)
    leader = a if a.members else b
    syncs = [h.sync(leader.member_id, leader.generation, {a.member_id: b"p0", b.member_id: b"p1"}),
             h.sync((b if leader is a else a).member_id, leader.generation)]  # fmt: skip
    h.commit_persists()
    assert all(h.synced(t).error is ErrorCode.NONE for t in syncs)
    again_a, again_b = h.join(instance="i1"), h.join(instance="i2")
    first, second = h.persists
    assert second.seq > first.seq
    h.persists = [first]
    h.commit_persists()  # the record holding only i1's new id: it answers nobody
    assert again_a not in h.replies and again_b not in h.replies
    h.persists = [second]
    [record] = h.commit_persists()  # both new ids in the log now
    ids = {h.joined(again_a).member_id, h.joined(again_b).member_id}
    assert {m.member_id for m in record.members} == ids
    assert h.joined(again_a).generation == h.joined(again_b).generation == a.generation


def test_members_leaving_rebalance_and_the_last_leaves_the_group_empty() -> None:
    h = Harness()
    (a, b), generation = h.stable_group(2)
    error, per_member, effects = h.coordinator.leave("g", (MemberRef(b, None),), h.now)
    h.take(effects)
    assert (error, per_member) == (ErrorCode.NONE, [ErrorCode.NONE])
    assert h.coordinator.state("g") is GroupState.PREPARING_REBALANCE
    assert h.joined(h.join(a)).generation == generation + 1
    _, per_member, effects = h.coordinator.leave(
        "g", (MemberRef(a, None), MemberRef("nobody", None)), h.now
    )
    h.take(effects)
    assert per_member == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
    [record] = h.commit_persists()
    assert (record.generation, record.members, record.leader) == (generation + 2, (), "")
    assert h.coordinator.state("g") is GroupState.EMPTY


def test_the_initial_delay_gathers_a_new_groups_members_into_one_rebalance() -> None:
    h = Harness(initial_delay_ms=3_000)
    a = h.new_member()
    ta = h.join(a)
    h.advance(2_000)
    b = h.new_member()
    tb = h.join(b)  # restarts the delay: 5,000 ms after a's join
    h.advance(2_999)
    assert ta not in h.replies and tb not in h.replies
    h.advance(1)
    assert h.joined(ta).generation == h.joined(tb).generation == 1
    assert len(h.joined(ta).members) == 2


def test_a_leader_that_never_syncs_is_dropped_and_the_rest_rebalance() -> None:
    h = Harness()
    a, b = h.new_member(), h.new_member()
    ta, tb = h.join(a), h.join(b)
    assert h.joined(ta).leader == a
    sb = h.sync(b, 1)
    h.advance(REBALANCE_MS)
    assert h.synced(sb).error is ErrorCode.REBALANCE_IN_PROGRESS
    result = h.joined(h.join(b))
    assert (result.generation, result.leader, len(result.members)) == (2, b, 1)
    del tb


def test_a_new_coordinator_resumes_stable_groups_and_restarts_their_sessions() -> None:
    h = Harness()
    (a, b), generation = h.stable_group(2)
    records = [("g", h.coordinator._groups["g"].record())]  # as the offsets partition holds it
    successor = Harness(now=h.now + 60_000)
    successor.coordinator.load(records, successor.now)
    assert successor.coordinator.state("g") is GroupState.STABLE
    successor.advance(SESSION_MS - 1)
    assert successor.heartbeat(a, generation) is ErrorCode.NONE
    assert successor.heartbeat(b, generation) is ErrorCode.NONE
    assert successor.synced(successor.sync(b, generation)).assignment == b.encode()
    successor.advance(SESSION_MS)  # nobody heartbeats now: both sessions end, the group empties
    assert successor.coordinator.state("g") is GroupState.EMPTY
    [record] = successor.commit_persists()
    assert (record.generation, record.members) == (generation + 1, ())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"protocol_type": "connect"}, ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
        ({"protocols": (Protocol("roundrobin", b""),)}, ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
        ({"session_ms": 10}, ErrorCode.INVALID_SESSION_TIMEOUT),
        ({"group": ""}, ErrorCode.INVALID_GROUP_ID),
    ],
)
def test_a_join_that_cannot_fit_the_group_is_refused(
    kwargs: dict[str, object], error: ErrorCode
) -> None:
    h = Harness()
    h.stable_group(1)
    assert h.joined(h.join(**kwargs)).error is error  # type: ignore[arg-type]


def test_a_full_group_refuses_the_next_member() -> None:
    h = Harness(members_max=2)
    h.stable_group(2)
    assert h.joined(h.join()).error is ErrorCode.GROUP_MAX_SIZE_REACHED


def test_the_protocol_most_members_prefer_among_those_all_support_is_chosen() -> None:
    h = Harness()
    both = (Protocol("sticky", b"s"), Protocol("range", b"r"))
    range_first = (Protocol("range", b"r"), Protocol("sticky", b"s"))
    ids = [h.new_member(protocols=p) for p in (range_first, both, both)]
    tokens = [h.join(m, protocols=p) for m, p in zip(ids, (range_first, both, both), strict=True)]
    leader = h.joined(tokens[0])
    assert leader.protocol_name == "sticky"
    assert {m.metadata for m in leader.members} == {b"s"}


def test_losing_leadership_answers_every_parked_request() -> None:
    h = Harness()
    a, b = h.new_member(), h.new_member()
    ta, tb = h.join(a), h.join(b)
    sb = h.sync(b, h.joined(tb).generation)
    c = h.new_member()
    tc = h.join(c)  # parked: a rebalance starts; b's sync is told so
    assert h.synced(sb).error is ErrorCode.REBALANCE_IN_PROGRESS
    h.take(h.coordinator.abandon())
    assert h.joined(tc).error is ErrorCode.NOT_COORDINATOR
    assert h.coordinator.state("g") is GroupState.DEAD
    del ta


def test_every_deadline_is_one_tick_asks_for() -> None:
    h = Harness(initial_delay_ms=3_000)
    a, b = h.new_member(), h.new_member()
    h.join(a)
    h.join(b)
    deadline = h.coordinator.next_deadline_ms()
    assert deadline == h.now + 3_000  # the initial delay
    h.advance(deadline - h.now)
    assert h.coordinator.state("g") is GroupState.COMPLETING_REBALANCE
    assert h.coordinator.next_deadline_ms() == h.now + SESSION_MS  # sessions while unsynced
    h.sync(b, 1)  # b waits for the leader's assignment: its session pauses meanwhile
    h.advance(SESSION_MS // 2)
    assert h.heartbeat(a, 1) is ErrorCode.NONE  # a heartbeat in CompletingRebalance is fine
    assert h.coordinator.next_deadline_ms() == h.now + SESSION_MS  # a's session, not b's
    h.sync(a, 1, {a: b"", b: b""})  # the leader's: its record is committed, nothing is due
    assert h.persists
    assert h.coordinator.next_deadline_ms() is None
    h.commit_persists()
    assert h.coordinator.next_deadline_ms() == h.now + SESSION_MS  # sessions again


def test_a_member_id_issued_but_not_used_holds_the_rebalance_until_its_session_ends() -> None:
    h = Harness(initial_delay_ms=3_000)
    ta = h.join(h.new_member())
    h.new_member()  # given an id (KIP-394), never joins with it
    h.advance(3_000)
    assert ta not in h.replies  # the initial delay is over, but a member may still come
    deadline = h.coordinator.next_deadline_ms()
    assert deadline is not None and deadline > h.now  # not a deadline passed: no busy loop
    h.advance(deadline - h.now)
    assert h.joined(ta).generation == 1


def test_who_may_commit_offsets_and_when() -> None:
    h = Harness()
    check = h.coordinator.commit_refusal
    assert check("fresh", -1, "", None, h.now) is ErrorCode.NONE  # from outside any group
    assert check("fresh", 1, "m", None, h.now) is ErrorCode.ILLEGAL_GENERATION  # as Kafka
    (a, b), generation = h.stable_group(2)
    assert check("g", generation, a, None, h.now) is ErrorCode.NONE
    assert check("g", -1, "", None, h.now) is ErrorCode.UNKNOWN_MEMBER_ID  # it has members
    assert check("g", generation - 1, a, None, h.now) is ErrorCode.ILLEGAL_GENERATION
    h.join(h.new_member())  # a rebalance starts: the old generation may still commit
    assert check("g", generation, b, None, h.now) is ErrorCode.NONE
    h.join(a)
    h.join(b)  # everyone rejoined: the next generation waits for its assignment
    assert check("g", generation + 1, a, None, h.now) is ErrorCode.REBALANCE_IN_PROGRESS
    assert check("g", generation, a, None, h.now) is ErrorCode.ILLEGAL_GENERATION


def test_two_silent_members_past_every_deadline_in_one_tick() -> None:
    """b and c miss their sessions and the rebalance deadline passes, all before one tick:
    the first departure completes the rebalance (dropping the other), and the tick goes on."""
    h = Harness()
    (a, b, c), generation = h.stable_group(3)
    token = h.join(h.new_member())  # a rebalance: nobody else rejoins
    h.join(a)
    h.advance(REBALANCE_MS + SESSION_MS)
    joined = h.joined(token)
    assert joined.generation == generation + 1
    members = {m.member_id for m in h.coordinator.describe("g").members}
    assert members == {a, joined.member_id}  # b and c dropped, no KeyError on the way
    assert not {b, c} & members


def test_leaving_with_an_id_never_used_lets_the_rebalance_go_on() -> None:
    h = Harness()
    (a,), generation = h.stable_group(1)
    unused = h.new_member()  # MEMBER_ID_REQUIRED given, then the client closes
    token = h.join(h.new_member())  # a rebalance, held by the unused id
    h.join(a)
    assert token not in h.replies
    _, errors, effects = h.coordinator.leave("g", (MemberRef(unused, None),), h.now)
    h.take(effects)
    assert errors == [ErrorCode.NONE]
    assert h.joined(token).generation == generation + 1


def test_empty_groups_the_log_no_longer_holds_are_pruned() -> None:
    h = Harness()
    assert h.joined(h.join("stale-id")).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.coordinator.state("g") is GroupState.DEAD  # no group made for an unknown id
    h.new_member()  # an id given, never used: the group exists, empty, with a pending id
    h.advance(SESSION_MS)
    h.coordinator.prune(lambda _group: True)
    assert h.coordinator.state("g") is GroupState.EMPTY  # the log still holds it: kept
    h.coordinator.prune(lambda _group: False)
    assert h.coordinator.state("g") is GroupState.DEAD


def test_a_static_member_that_does_not_rejoin_stays_through_the_rebalance() -> None:
    """KIP-345: a static member restarting (its session outlasting the rebalance timeout) is
    kept in the next generation, its subscription in the leader's list; a dynamic one would
    have been dropped."""
    h = Harness()
    first = h.joined(h.join(instance="i", session_ms=60_000))  # static: no KIP-394 round
    static_id = first.member_id
    h.sync(static_id, first.generation, {static_id: b"p"})
    h.commit_persists()
    a = h.new_member()
    ta = h.join(a)  # a rebalance; the static member is restarting and does not rejoin
    h.advance(REBALANCE_MS)
    joined = h.joined(ta)
    assert joined.generation == first.generation + 1
    assert joined.leader == a  # the leader is one that rejoined
    assert {m.member_id for m in joined.members} == {a, static_id}
    assert {m.member_id for m in h.coordinator.describe("g").members} == {a, static_id}


# -- the table of moves ------------------------------------------------------------------------

# Kafka's GroupState.validPreviousStates (kafka.coordinator.group, GroupMetadata.scala), but
# for Dead: Kafka moves a group there; here a dead group is one the coordinator dropped.
KAFKAS_PREVIOUS_STATES = {
    GroupState.PREPARING_REBALANCE: {
        GroupState.STABLE,
        GroupState.COMPLETING_REBALANCE,
        GroupState.EMPTY,
    },
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
}


def test_the_table_allows_the_moves_kafka_allows_and_no_other() -> None:
    previous: dict[GroupState, set[GroupState]] = {}
    for (source, _event), target in TRANSITIONS.items():
        previous.setdefault(target, set()).add(source)
    assert previous == KAFKAS_PREVIOUS_STATES


def test_a_move_the_table_lacks_is_a_broken_invariant() -> None:
    assert next_state(GroupState.STABLE, Event.REBALANCE) is GroupState.PREPARING_REBALANCE
    with pytest.raises(AssertionError, match="a group in Stable cannot move on JOINED"):
        next_state(GroupState.STABLE, Event.JOINED)
