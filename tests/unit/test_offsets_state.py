"""The offsets partition's state machine: committed offsets and group records, their expiry,
and snapshots equal on every replica."""

from __future__ import annotations

import pytest

from statemachine.codec import pack
from statemachine.commands import (
    CommitOffsets,
    DeleteGroup,
    DeleteOffsets,
    DeleteTopicOffsets,
    ExpireOffsets,
    StoreGroup,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.group_records import GroupRecord, MemberRecord
from statemachine.limits import StateLimits
from statemachine.offsets import (
    GroupDeleted,
    GroupStored,
    OffsetsCommitted,
    OffsetsRemoved,
    OffsetsStateMachine,
)

DAY_MS = 86_400_000
MEMBER = MemberRecord("m-1", None, "c", "/127.0.0.1", 10_000, 30_000, b"sub", b"assigned")


def commit(group: str, now_ms: int, *offsets: tuple[str, int, int]) -> bytes:
    packed = pack([[t, p, o, -1, ""] for t, p, o in offsets])
    return CommitOffsets(group, now_ms, packed).encode()


def store(group: str, now_ms: int, generation: int, *members: MemberRecord) -> bytes:
    leader = members[0].member_id if members else ""
    record = GroupRecord(generation, "consumer", "range" if members else "", leader, members)
    return StoreGroup(group, now_ms, record.encode()).encode()


def committed(machine: OffsetsStateMachine, group: str) -> dict[tuple[str, int], int]:
    return {tp: c.offset for tp, c in machine.groups[group].offsets.items()}


def test_commits_and_group_records_are_kept_per_group() -> None:
    machine = OffsetsStateMachine()
    assert machine.apply(commit("g", 10, ("t", 0, 5), ("t", 1, 7))) == OffsetsCommitted(2)
    assert machine.apply(commit("g", 20, ("t", 0, 9))) == OffsetsCommitted(1)
    assert machine.apply(store("g", 30, 3, MEMBER)) == GroupStored("g", 3)
    assert committed(machine, "g") == {("t", 0): 9, ("t", 1): 7}
    record = machine.groups["g"].record
    assert record is not None and record.members == (MEMBER,)


@pytest.mark.parametrize(
    "entry",
    [
        CommitOffsets("g", 1, b"\xc1").encode(),  # not msgpack
        CommitOffsets("g", 1, pack([["t", 0, -2, -1, ""]])).encode(),  # below -1
        CommitOffsets("g", 1, pack([["", 0, 5, -1, ""]])).encode(),  # no topic
        CommitOffsets("g", 1, pack([["t", 0, 5, -1, "x" * 4097]])).encode(),  # metadata
        CommitOffsets("g", 1, pack([["t", 0, 5]])).encode(),  # a short item
        StoreGroup("g", 1, pack([1, "consumer", "range", "ghost", []])).encode(),  # leader
        StoreGroup("g", 1, b"").encode(),
    ],
)
def test_a_malformed_entry_is_a_rejection_and_changes_nothing(entry: bytes) -> None:
    machine = OffsetsStateMachine()
    machine.apply(commit("g", 1, ("t", 0, 1)))
    before = machine.snapshot()
    assert machine.apply(entry) == Rejected(ErrorCode.INVALID_REQUEST)
    assert machine.snapshot() == before


def test_an_invalid_group_id_is_refused() -> None:
    machine = OffsetsStateMachine()
    assert machine.apply(commit("", 1, ("t", 0, 1))) == Rejected(ErrorCode.INVALID_GROUP_ID)
    assert machine.apply(commit("a\nb", 1, ("t", 0, 1))) == Rejected(ErrorCode.INVALID_GROUP_ID)


def test_offsets_expire_only_while_the_group_has_no_members() -> None:
    machine = OffsetsStateMachine()
    machine.apply(store("g", 0, 1, MEMBER))
    machine.apply(commit("g", 0, ("t", 0, 5)))
    assert machine.apply(ExpireOffsets(10 * DAY_MS, DAY_MS).encode()) == OffsetsRemoved(())
    machine.apply(store("g", 10 * DAY_MS, 2))  # the last member left: empty from now on
    expire_at = 11 * DAY_MS
    assert machine.apply(ExpireOffsets(expire_at - 1, DAY_MS).encode()) == OffsetsRemoved(())
    assert machine.apply(ExpireOffsets(expire_at, DAY_MS).encode()) == OffsetsRemoved((("g", 1),))
    assert "g" not in machine.groups  # no members, no offsets: the group is gone


def test_a_simple_consumers_offsets_expire_each_a_retention_after_its_commit() -> None:
    machine = OffsetsStateMachine()
    machine.apply(commit("g", 0, ("t", 0, 5)))
    machine.apply(commit("g", DAY_MS // 2, ("t", 1, 5)))
    assert machine.apply(ExpireOffsets(DAY_MS, DAY_MS).encode()) == OffsetsRemoved((("g", 1),))
    assert committed(machine, "g") == {("t", 1): 5}


def test_a_deleted_topics_offsets_go_from_every_group() -> None:
    machine = OffsetsStateMachine()
    machine.apply(commit("a", 1, ("gone", 0, 5), ("kept", 0, 1)))
    machine.apply(commit("b", 1, ("gone", 3, 5)))
    result = machine.apply(DeleteTopicOffsets("gone").encode())
    assert result == OffsetsRemoved((("a", 1), ("b", 1)))
    assert committed(machine, "a") == {("kept", 0): 1}
    assert "b" not in machine.groups


def test_offset_delete_removes_only_the_listed_offsets_of_one_group() -> None:
    machine = OffsetsStateMachine()
    machine.apply(commit("a", 1, ("t", 0, 5), ("t", 1, 6)))
    machine.apply(commit("b", 1, ("t", 0, 7)))
    result = machine.apply(DeleteOffsets("a", pack([["t", 0], ["t", 9]])).encode())
    assert result == OffsetsRemoved((("a", 1),))
    assert committed(machine, "a") == {("t", 1): 6} and committed(machine, "b") == {("t", 0): 7}
    assert machine.apply(DeleteOffsets("a", pack([["t", 1]])).encode()) == OffsetsRemoved(
        (("a", 1),)
    )
    assert "a" not in machine.groups, "a group with neither members nor offsets is gone"
    assert machine.apply(DeleteOffsets("a", pack([["t", -1]])).encode()) == Rejected(
        ErrorCode.INVALID_REQUEST
    )


def test_delete_group() -> None:
    machine = OffsetsStateMachine()
    machine.apply(commit("g", 1, ("t", 0, 5)))
    assert machine.apply(DeleteGroup("g").encode()) == GroupDeleted("g")
    assert machine.apply(DeleteGroup("g").encode()) == Rejected(ErrorCode.GROUP_ID_NOT_FOUND)


def test_limits_on_groups_and_their_offsets() -> None:
    machine = OffsetsStateMachine(StateLimits(groups_per_partition_max=1, group_offsets_max=2))
    assert machine.apply(commit("g", 1, ("t", 0, 1), ("t", 1, 1))) == OffsetsCommitted(2)
    assert machine.apply(commit("g", 1, ("t", 2, 1))) == Rejected(ErrorCode.POLICY_VIOLATION)
    assert machine.apply(commit("g", 1, ("t", 1, 2))) == OffsetsCommitted(1)  # not a new one
    full = Rejected(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    assert machine.apply(commit("h", 1, ("t", 0, 1))) == full


def test_replicas_that_apply_the_same_entries_hold_byte_identical_snapshots() -> None:
    entries = [
        commit("b", 5, ("t", 1, 3), ("t", 0, 2)),
        store("a", 6, 1, MEMBER),
        commit("a", 7, ("u", 0, 1)),
        store("a", 8, 2),
        ExpireOffsets(9, 100).encode(),
    ]
    one, two = OffsetsStateMachine(), OffsetsStateMachine()
    for entry in entries:
        one.apply(entry)
        two.apply(entry)
    assert one.snapshot() == two.snapshot()
    restored = OffsetsStateMachine.restore(one.snapshot())
    assert restored.snapshot() == one.snapshot()
    assert restored.groups == one.groups
