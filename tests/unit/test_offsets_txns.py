"""Offsets in a transaction on an offsets partition (TxnOffsetCommit): taken only inside the
coordinator's registration, pending until the marker, committed or dropped by it, and kept
whole (no expiry, no deletion, room for the commit) meanwhile. Kafka's
GroupMetadataManagerTest cases on transactional offsets, as far as they translate, and
ProducerStateManagerTest's one on offsets partitions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from statemachine.codec import pack
from statemachine.commands import (
    CommitOffsets,
    CommitTxnOffsets,
    DeleteGroup,
    DeleteOffsets,
    DeleteTopicOffsets,
    ExpireOffsets,
    RegisterTxnPartition,
    WriteTxnMarker,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import StateLimits
from statemachine.offsets import OffsetsCommitted, OffsetsStateMachine
from statemachine.partition import TxnEnded, TxnRegistered
from tests.property.replica_logs import check_restore_everywhere, check_two_replicas
from tests.unit.test_offsets_state import commit, committed

PID, EPOCH = 7, 0
DAY_MS = 86_400_000


def register(seq: int, pid: int = PID, epoch: int = EPOCH, now_ms: int = 1) -> bytes:
    return RegisterTxnPartition(now_ms, pid, epoch, seq).encode()


def txn_commit(
    group: str, *offsets: tuple[str, int, int], pid: int = PID, epoch: int = EPOCH
) -> bytes:
    packed = pack([[t, p, o, -1, ""] for t, p, o in offsets])
    return CommitTxnOffsets(group, 2, pid, epoch, packed).encode()


def marker(seq: int, commit_: bool, pid: int = PID, epoch: int = EPOCH, coord: int = 1) -> bytes:
    return WriteTxnMarker(3, pid, epoch, seq, int(commit_), coord).encode()


def test_offsets_pending_in_a_transaction_are_committed_by_its_commit_marker() -> None:
    machine = OffsetsStateMachine()
    machine.apply(commit("g", 1, ("t", 0, 5)))
    assert machine.apply(register(1)) == TxnRegistered(PID, 1)
    assert machine.apply(txn_commit("g", ("t", 0, 9), ("t", 1, 4))) == OffsetsCommitted(2)
    assert committed(machine, "g") == {("t", 0): 5}  # not visible before the marker
    entry = machine.groups["g"]
    assert entry.is_pending(("t", 0)) and entry.is_pending(("t", 1))
    assert machine.apply(marker(1, True)) == TxnEnded(PID, 1)
    assert committed(machine, "g") == {("t", 0): 9, ("t", 1): 4}
    assert not machine.groups["g"].pending


def test_an_abort_marker_drops_them_and_leaves_no_empty_group() -> None:
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    machine.apply(txn_commit("g", ("t", 0, 9)))
    assert machine.apply(marker(1, False)) == TxnEnded(PID, 1)
    assert "g" not in machine.groups


def test_without_a_registration_in_the_epoch_nothing_is_taken() -> None:
    machine = OffsetsStateMachine()
    assert machine.apply(txn_commit("g", ("t", 0, 9))) == Rejected(ErrorCode.INVALID_TXN_STATE)
    machine.apply(register(1, epoch=3))
    refused = machine.apply(txn_commit("g", ("t", 0, 9), epoch=2))
    assert refused == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)  # a zombie
    machine.apply(marker(1, True, epoch=3))
    assert machine.apply(txn_commit("g", ("t", 0, 9), epoch=3)) == Rejected(
        ErrorCode.INVALID_TXN_STATE
    )  # its transaction ended here: a late commit is not in the next one
    assert "g" not in machine.groups


def test_a_stale_or_replayed_marker_changes_nothing() -> None:
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    machine.apply(txn_commit("g", ("t", 0, 9)))
    machine.apply(marker(1, True))
    machine.apply(register(2))
    machine.apply(txn_commit("g", ("t", 0, 12)))
    before = machine.snapshot()
    assert machine.apply(marker(1, True)) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert machine.apply(marker(2, True, coord=0)) == Rejected(
        ErrorCode.TRANSACTION_COORDINATOR_FENCED
    )
    assert machine.snapshot() == before
    machine.apply(marker(2, False))
    assert machine.apply(marker(2, False)) == TxnEnded(PID, 2)  # a replay: harmless
    assert committed(machine, "g") == {("t", 0): 9}


def test_two_producers_pending_on_one_group_end_apart() -> None:
    machine = OffsetsStateMachine()
    machine.apply(register(1, pid=1))
    machine.apply(register(1, pid=2))
    machine.apply(txn_commit("g", ("t", 0, 3), pid=1))
    machine.apply(txn_commit("g", ("t", 1, 4), pid=2))
    machine.apply(marker(1, False, pid=1))
    assert machine.groups["g"].is_pending(("t", 1))
    assert not machine.groups["g"].is_pending(("t", 0))
    machine.apply(marker(1, True, pid=2))
    assert committed(machine, "g") == {("t", 1): 4}


def test_a_group_with_pending_offsets_neither_expires_nor_is_deleted() -> None:
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    machine.apply(txn_commit("g", ("t", 0, 9)))
    machine.apply(ExpireOffsets(30 * DAY_MS, DAY_MS).encode())
    assert machine.groups["g"].is_pending(("t", 0))
    assert machine.apply(DeleteGroup("g").encode()) == Rejected(ErrorCode.NON_EMPTY_GROUP)
    machine.apply(marker(1, True))
    assert committed(machine, "g") == {("t", 0): 9}


def test_a_deleted_topics_pending_offsets_go_too() -> None:
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    machine.apply(txn_commit("g", ("t", 0, 9), ("u", 0, 1)))
    machine.apply(DeleteTopicOffsets("t").encode())
    machine.apply(marker(1, True))
    assert committed(machine, "g") == {("u", 0): 1}


def test_committed_and_pending_partitions_share_the_group_bound() -> None:
    machine = OffsetsStateMachine(StateLimits(group_offsets_max=2))
    machine.apply(commit("g", 1, ("t", 0, 1)))
    machine.apply(register(1))
    assert machine.apply(txn_commit("g", ("t", 1, 1))) == OffsetsCommitted(1)
    over = Rejected(ErrorCode.POLICY_VIOLATION)
    assert machine.apply(commit("g", 1, ("t", 2, 1))) == over  # the pending one holds its room
    assert machine.apply(txn_commit("g", ("t", 2, 1))) == over
    machine.apply(marker(1, True))
    assert committed(machine, "g") == {("t", 0): 1, ("t", 1): 1}


def test_idle_producers_records_expire_with_the_offsets_retention() -> None:
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    machine.apply(marker(1, True))
    assert machine.txns.producers
    machine.apply(ExpireOffsets(2 * DAY_MS, DAY_MS).encode())
    assert not machine.txns.producers


def test_snapshots_carry_pending_offsets_and_open_transactions() -> None:
    machine = OffsetsStateMachine()
    machine.apply(commit("g", 1, ("t", 0, 1)))
    machine.apply(register(1))
    machine.apply(txn_commit("g", ("t", 0, 9)))
    restored = OffsetsStateMachine.restore(machine.snapshot())
    assert restored.snapshot() == machine.snapshot()
    restored.apply(marker(1, True))
    assert committed(restored, "g") == {("t", 0): 9}


def test_a_version_1_snapshot_still_restores() -> None:
    old = pack([1, 5, [["g", None, 0, [["t", 0, 3, -1, "", 4]]]]])
    machine = OffsetsStateMachine.restore(old)
    assert committed(machine, "g") == {("t", 0): 3}
    assert not machine.txns.producers


# -- replicas converge, snapshots are as good as replay, the invariants hold --------------------

GROUPS = st.sampled_from(["g", "h"])
TXN_PIDS = st.integers(1, 3)
TXN_EPOCHS = st.integers(0, 2)
SEQUENCES = st.integers(0, 3)
OFFSET_LISTS = st.lists(
    st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 2), st.integers(0, 9)), max_size=3
).map(lambda offsets: pack([[t, p, o, -1, ""] for t, p, o in offsets]))
ENTRIES = st.one_of(
    st.builds(CommitOffsets, GROUPS, st.integers(0, 5_000), OFFSET_LISTS),
    st.builds(CommitTxnOffsets, GROUPS, st.integers(0, 5_000), TXN_PIDS, TXN_EPOCHS, OFFSET_LISTS),
    st.builds(RegisterTxnPartition, st.integers(0, 5_000), TXN_PIDS, TXN_EPOCHS, SEQUENCES),
    st.builds(
        WriteTxnMarker,
        st.integers(0, 5_000),
        TXN_PIDS,
        TXN_EPOCHS,
        SEQUENCES,
        st.integers(0, 1),
        st.integers(0, 2),
    ),
    st.builds(ExpireOffsets, st.integers(0, 10_000), st.integers(1, 3_000)),
    st.builds(DeleteGroup, GROUPS),
    st.builds(DeleteTopicOffsets, st.sampled_from(["t", "u"])),
).map(lambda command: command.encode())
SMALL = StateLimits(group_offsets_max=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(ENTRIES, max_size=40))
def test_offsets_replicas_converge_and_restore_anywhere(entries: list[bytes]) -> None:
    check_two_replicas(entries, lambda: OffsetsStateMachine(SMALL))
    check_restore_everywhere(
        entries,
        lambda: OffsetsStateMachine(SMALL),
        lambda data: OffsetsStateMachine.restore(data, SMALL),
    )
    machine = OffsetsStateMachine(SMALL)
    for entry in entries:
        machine.apply(entry)
        for group in machine.groups.values():
            assert group.room_for((), SMALL.group_offsets_max)  # a commit marker has room
            assert group.record is not None or not group.removable  # nothing left: gone
            for pid in group.pending:
                assert machine.txns.in_transaction(pid)  # pending only inside a transaction


def test_a_later_plain_commit_wins_over_an_earlier_pending_offset() -> None:
    """Kafka keeps the offset written last: a reset between the TxnOffsetCommit and the
    marker is not undone by the marker; a pending offset written after the reset still wins."""
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    machine.apply(txn_commit("g", ("t", 0, 100), ("t", 1, 100)))
    machine.apply(commit("g", 5, ("t", 0, 150)))
    machine.apply(marker(1, True))
    assert committed(machine, "g") == {("t", 0): 150, ("t", 1): 100}
    machine.apply(register(2))
    machine.apply(commit("g", 6, ("t", 0, 160)))
    machine.apply(txn_commit("g", ("t", 0, 170)))
    machine.apply(marker(2, True))
    assert committed(machine, "g")[("t", 0)] == 170


def test_an_offset_delete_drops_the_pending_offset_too() -> None:
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    machine.apply(txn_commit("g", ("t", 0, 9), ("t", 1, 9)))
    machine.apply(DeleteOffsets("g", pack([["t", 0]])).encode())
    machine.apply(marker(1, True))
    assert committed(machine, "g") == {("t", 1): 9}


def test_txn_offset_commits_carry_no_sequence_and_a_repeat_is_taken() -> None:
    """Kafka: ProducerStateManagerTest.testSequenceNotValidatedForGroupMetadataTopic: the
    coordinator's transactional writes to an offsets partition carry no sequence to validate.
    A TxnOffsetCommit entry has none here either: a repeat (a retry, or a later commit in the
    same transaction) is taken, and the marker installs the last offset of each partition."""
    machine = OffsetsStateMachine()
    machine.apply(register(1))
    assert machine.apply(txn_commit("g", ("t", 0, 5))) == OffsetsCommitted(1)
    assert machine.apply(txn_commit("g", ("t", 0, 5))) == OffsetsCommitted(1)
    assert machine.apply(txn_commit("g", ("t", 0, 8), ("t", 1, 2))) == OffsetsCommitted(2)
    machine.apply(marker(1, True))
    assert committed(machine, "g") == {("t", 0): 8, ("t", 1): 2}
