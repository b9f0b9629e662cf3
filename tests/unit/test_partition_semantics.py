"""docs/semantics.md's statements that live in a partition's apply, one test each (`test_sN_`: SN).

Each test drives a real PartitionStateMachine with encoded log entries, exactly as a replica
applies them, and checks both the result and that the log end offset moved only for appends.
"""

from __future__ import annotations

import pytest

from statemachine.commands import AdvanceLogStart, AppendBatch, DeleteTopic, Noop
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import StateLimits
from statemachine.partition import (
    Appended,
    Duplicate,
    LogStartAdvanced,
    NoopApplied,
    PartitionStateMachine,
    ProducersExpired,
)
from statemachine.records import SEQUENCE_MODULUS
from tests.builders import append, expire, plain_batch

PID = 1_000
OOO = Rejected(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
INT32_MAX = SEQUENCE_MODULUS - 1


def appended(result: object) -> Appended:
    assert isinstance(result, Appended), result
    return result


def produce_batches(sm: PartitionStateMachine, count: int, size: int = 2) -> list[Appended]:
    """`count` contiguous batches of `size` records from PID, epoch 0."""
    return [appended(sm.apply(append(PID, 0, i * size, size))) for i in range(count)]


def test_first_batch_gets_offsets_and_fills_the_window() -> None:
    sm = PartitionStateMachine()
    first = appended(sm.apply(append(PID, 0, 0, 3, now_ms=500)))
    assert (first.base_offset, first.last_offset, first.append_time_ms) == (0, 2, 500)
    assert sm.log_end_offset == 3
    entry = sm.producers.get(PID)
    assert entry is not None
    assert (entry.epoch, entry.last_sequence, entry.last_timestamp_ms) == (0, 2, 500)


@pytest.mark.parametrize("age", [1, 2, 3, 4, 5])
def test_s1_retry_of_any_of_last_five_returns_original_offsets(age: int) -> None:
    sm = PartitionStateMachine()
    batches = produce_batches(sm, 5)
    end = sm.log_end_offset
    original = batches[-age]
    retry = sm.apply(append(PID, 0, (5 - age) * 2, 2, now_ms=9_999))
    assert retry == Duplicate(original.base_offset, original.last_offset, original.append_time_ms)
    assert sm.log_end_offset == end


def test_s2_retry_of_sixth_oldest_is_out_of_order() -> None:
    sm = PartitionStateMachine()
    produce_batches(sm, 6)
    end = sm.log_end_offset
    assert sm.apply(append(PID, 0, 0, 2)) == OOO
    assert sm.log_end_offset == end


@pytest.mark.parametrize(("base", "count"), [(4, 1), (5, 1), (4, 3), (3, 2), (5, 3)])
def test_s3_partial_overlap_is_not_a_duplicate(base: int, count: int) -> None:
    sm = PartitionStateMachine()
    produce_batches(sm, 4)  # sequences 0-1, 2-3, 4-5, 6-7
    end = sm.log_end_offset
    assert sm.apply(append(PID, 0, base, count)) == OOO
    assert sm.log_end_offset == end


def test_s4_retry_applied_after_its_original_is_a_duplicate_with_same_offsets() -> None:
    # A retry proposed while the original was uncommitted is simply a later entry.
    sm = PartitionStateMachine()
    original = appended(sm.apply(append(PID, 0, 0, 4)))
    other = appended(sm.apply(append(PID + 1, 0, 0, 1)))
    retry = sm.apply(append(PID, 0, 0, 4))
    assert retry == Duplicate(original.base_offset, original.last_offset, original.append_time_ms)
    assert sm.log_end_offset == other.last_offset + 1 == 5


@pytest.mark.parametrize(
    "base",
    [5, 100, 2, 1, 0],
    ids=["gap-of-one", "far-gap", "reorder-2", "reorder-1", "reorder-0"],
)
def test_s5_gap_or_reorder_in_same_epoch_is_out_of_order(base: int) -> None:
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 0, 0, 3)))  # sequences 0-2
    appended(sm.apply(append(PID, 0, 3, 1)))  # sequence 3; 4 is next
    end = sm.log_end_offset
    assert sm.apply(append(PID, 0, base, 1)) == OOO
    assert sm.log_end_offset == end
    assert appended(sm.apply(append(PID, 0, 4, 1))).base_offset == end


def test_s6_sequence_wraps_after_int32_max() -> None:
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 0, INT32_MAX, 1)))  # unknown PID: any base sequence
    wrapped = appended(sm.apply(append(PID, 0, 0, 2)))
    assert wrapped.base_offset == 1
    entry = sm.producers.get(PID)
    assert entry is not None and entry.last_sequence == 1


def test_s6_batch_straddling_the_wrap_is_accepted_and_deduplicated() -> None:
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 0, INT32_MAX - 5, 4)))  # .. INT32_MAX - 2
    straddle = appended(sm.apply(append(PID, 0, INT32_MAX - 1, 4)))  # INT32_MAX - 1 .. 1
    entry = sm.producers.get(PID)
    assert entry is not None and entry.last_sequence == 1
    assert appended(sm.apply(append(PID, 0, 2, 1))).base_offset == 8
    retry = sm.apply(append(PID, 0, INT32_MAX - 1, 4))
    assert retry == Duplicate(straddle.base_offset, straddle.last_offset, straddle.append_time_ms)


def test_s6_wrap_needs_exactly_int32_max_before_zero() -> None:
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 0, INT32_MAX - 3, 1)))
    assert sm.apply(append(PID, 0, 0, 1)) == OOO


def test_s7_lower_epoch_is_fenced_even_if_sequence_fits() -> None:
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 3, 0, 2)))
    end = sm.log_end_offset
    assert sm.apply(append(PID, 2, 2, 1)) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert sm.apply(append(PID, 2, 0, 2)) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert sm.log_end_offset == end


def test_s8_higher_epoch_from_zero_is_accepted_and_clears_window() -> None:
    sm = PartitionStateMachine()
    produce_batches(sm, 3)  # epoch 0: sequences 0-1, 2-3, 4-5
    bumped = appended(sm.apply(append(PID, 1, 0, 2)))
    entry = sm.producers.get(PID)
    assert entry is not None and entry.epoch == 1 and len(entry.window) == 1
    # The old epoch's batch 2-3 is no longer a duplicate, and its epoch is now fenced.
    assert sm.apply(append(PID, 0, 2, 2)) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    # The new epoch's first batch is a duplicate of itself only.
    assert sm.apply(append(PID, 1, 0, 2)) == Duplicate(
        bumped.base_offset, bumped.last_offset, bumped.append_time_ms
    )


def test_s8_higher_epoch_not_from_zero_is_out_of_order() -> None:
    sm = PartitionStateMachine()
    produce_batches(sm, 1)
    end = sm.log_end_offset
    assert sm.apply(append(PID, 1, 2, 1)) == OOO
    assert sm.apply(append(PID, 1, 5, 1)) == OOO
    entry = sm.producers.get(PID)
    assert entry is not None and entry.epoch == 0
    assert sm.log_end_offset == end


@pytest.mark.parametrize("base", [0, 1, 77, INT32_MAX])
def test_s9_unknown_producer_is_accepted_at_any_sequence(base: int) -> None:
    sm = PartitionStateMachine()
    assert appended(sm.apply(append(PID, 5, base, 1))).base_offset == 0


def test_s9_expired_producer_is_accepted_at_any_sequence() -> None:
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 0, 0, 3, now_ms=1_000)))
    assert sm.apply(expire(now_ms=1_000 + 60_000, expiration_ms=60_000)) == ProducersExpired((PID,))
    assert sm.producers.get(PID) is None
    assert appended(sm.apply(append(PID, 0, 900, 1, now_ms=70_000))).base_offset == 3


def test_s10_retry_deduplicated_by_a_replica_that_becomes_leader() -> None:
    old_leader, new_leader = PartitionStateMachine(), PartitionStateMachine()
    entries = [append(PID, 0, i * 2, 2, now_ms=1_000 + i) for i in range(5)]
    results = [old_leader.apply(e) for e in entries]
    for e in entries:
        new_leader.apply(e)
    for i, original in enumerate(results):
        assert isinstance(original, Appended)
        retry = new_leader.apply(append(PID, 0, i * 2, 2, now_ms=50_000))
        assert retry == Duplicate(
            original.base_offset, original.last_offset, original.append_time_ms
        )


def test_s13_snapshot_restore_reproduces_windows_and_dedup() -> None:
    sm = PartitionStateMachine()
    batches = produce_batches(sm, 5)
    appended(sm.apply(append(PID + 1, 4, 10, 3)))
    restored = PartitionStateMachine.restore(sm.snapshot())
    assert restored.snapshot() == sm.snapshot()
    for i, original in enumerate(batches):
        retry = restored.apply(append(PID, 0, i * 2, 2))
        assert retry == Duplicate(
            original.base_offset, original.last_offset, original.append_time_ms
        )
    assert appended(restored.apply(append(PID, 0, 10, 1))).base_offset == sm.log_end_offset


def test_s14_idle_producer_expires_by_stamped_time_on_every_replica() -> None:
    replicas = [PartitionStateMachine(), PartitionStateMachine()]
    entries = [
        append(PID, 0, 0, 1, now_ms=1_000),
        append(PID + 1, 0, 0, 1, now_ms=5_000),
        expire(now_ms=10_999, expiration_ms=10_000),  # PID idle 9.999 s: kept
        expire(now_ms=11_000, expiration_ms=10_000),  # PID idle 10 s: expired
    ]
    for sm in replicas:
        results = [sm.apply(e) for e in entries]
        assert results[2:] == [ProducersExpired(()), ProducersExpired((PID,))]
        assert sm.producers.get(PID) is None and sm.producers.get(PID + 1) is not None
    assert replicas[0].snapshot() == replicas[1].snapshot()


def test_expiry_clock_never_runs_backwards() -> None:
    # A new leader whose clock lags must not revive time: expiry uses the largest stamp seen.
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 0, 0, 1, now_ms=1_000)))
    appended(sm.apply(append(PID + 1, 0, 0, 1, now_ms=100_000)))
    assert sm.apply(expire(now_ms=50_000, expiration_ms=60_000)) == ProducersExpired((PID,))
    assert sm.clock_ms == 100_000


def test_s22_duplicates_and_rejections_do_not_move_offsets() -> None:
    sm = PartitionStateMachine()
    produce_batches(sm, 6)
    end = sm.log_end_offset
    for entry in [
        append(PID, 0, 10, 2),  # duplicate
        append(PID, 0, 0, 2),  # 6th oldest
        append(PID, 0, 99, 1),  # gap
        b"\x93\x01\x01\xa1x",  # malformed entry
        AppendBatch(1, b"not a batch").encode(),
    ]:
        assert not isinstance(sm.apply(entry), Appended)
        assert sm.log_end_offset == end
    assert appended(sm.apply(append(PID, 0, 12, 1))).base_offset == end


def test_non_idempotent_batches_skip_producer_state() -> None:
    sm = PartitionStateMachine()
    first = appended(sm.apply(AppendBatch(1, plain_batch(3)).encode()))
    again = appended(sm.apply(AppendBatch(2, plain_batch(3)).encode()))
    assert (first.base_offset, again.base_offset) == (0, 3)
    assert len(sm.producers) == 0


def small_table(capacity: int) -> PartitionStateMachine:
    return PartitionStateMachine(StateLimits(producers_per_partition_max=capacity))


def producer_ids(sm: PartitionStateMachine) -> list[int]:
    return [pid for pid, _ in sm.producers]


def test_s23_a_full_table_evicts_the_least_recently_used_producer() -> None:
    sm = small_table(3)
    for pid, now_ms in ((1, 1_000), (2, 2_000), (3, 3_000)):
        appended(sm.apply(append(pid, 0, 0, now_ms=now_ms)))
    appended(sm.apply(append(1, 0, 1, now_ms=4_000)))  # 1 is now the most recent
    duplicate = sm.apply(append(2, 0, 0, now_ms=4_500))  # a duplicate refreshes nothing
    assert isinstance(duplicate, Duplicate)
    newcomer = appended(sm.apply(append(4, 0, 0, now_ms=5_000)))
    assert newcomer.base_offset == 4
    assert producer_ids(sm) == [1, 3, 4]  # 2, whose last batch is the oldest, is gone
    appended(sm.apply(append(5, 0, 0, now_ms=5_000)))
    assert producer_ids(sm) == [1, 4, 5]


def test_s23_equal_times_evict_the_smaller_producer_id_first() -> None:
    sm = small_table(2)
    appended(sm.apply(append(7, 0, 0, now_ms=1_000)))
    appended(sm.apply(append(5, 0, 0, now_ms=1_000)))  # later in the log, same stamped time
    appended(sm.apply(append(9, 0, 0, now_ms=1_000)))
    assert producer_ids(sm) == [7, 9]


def test_s23_an_epoch_bump_keeps_a_producers_place() -> None:
    sm = small_table(2)
    appended(sm.apply(append(1, 0, 0, now_ms=1_000)))
    appended(sm.apply(append(1, 1, 0, now_ms=1_000)))  # a new epoch in the same millisecond
    appended(sm.apply(append(2, 0, 0, now_ms=1_000)))
    appended(sm.apply(append(3, 0, 0, now_ms=2_000)))
    assert producer_ids(sm) == [2, 3]
    appended(sm.apply(append(4, 0, 0, now_ms=3_000)))
    assert producer_ids(sm) == [3, 4]


def test_s23_an_evicted_producer_is_unknown_and_its_retry_is_appended_again() -> None:
    sm = small_table(1)
    first = appended(sm.apply(append(1, 0, 0, 2, now_ms=1_000)))
    appended(sm.apply(append(2, 0, 0, now_ms=2_000)))  # evicts 1
    assert sm.producers.get(1) is None
    # Rule 1: the retry of a batch already in the log is an unknown producer's batch now.
    again = appended(sm.apply(append(1, 0, 0, 2, now_ms=3_000)))
    assert (first.base_offset, again.base_offset) == (0, 3)  # the log holds it twice
    appended(sm.apply(append(2, 0, 1, now_ms=4_000)))  # evicts 1 again
    # Its next batch, at any sequence, starts a new entry (rule 1): never a sequence error.
    assert appended(sm.apply(append(1, 0, 2, now_ms=5_000))).base_offset == sm.log_end_offset - 1


def test_s23_a_restored_snapshot_evicts_as_the_replay_does() -> None:
    entries = [append(pid, 0, 0, now_ms=1_000 + 1_000 * (pid % 2)) for pid in (8, 3, 6, 1, 4)]
    entries += [append(3, 0, 1, now_ms=2_000)]
    replayed = small_table(5)
    for entry in entries:
        replayed.apply(entry)
    restored = PartitionStateMachine.restore(
        replayed.snapshot(), StateLimits(producers_per_partition_max=5)
    )
    for pid in (20, 21, 22, 23, 24):
        entry = append(pid, 0, 0, now_ms=3_000)
        assert restored.apply(entry) == replayed.apply(entry)
        assert restored.snapshot() == replayed.snapshot()
    assert producer_ids(replayed) == [20, 21, 22, 23, 24]


def recency_heap(sm: PartitionStateMachine) -> list[tuple[int, int]] | None:
    return sm.producers._recency


def test_the_recency_heap_exists_only_while_the_table_evicts_and_stays_bounded() -> None:
    sm = small_table(2)
    for pid in (1, 2):
        appended(sm.apply(append(pid, 0, 0, now_ms=1_000)))
    assert recency_heap(sm) is None  # a table that never filled pays nothing
    appended(sm.apply(append(3, 0, 0, now_ms=1_001)))  # evicts 1
    for i in range(5_000):  # a new stamped time for every batch
        appended(sm.apply(append(2 + i % 2, 0, 1 + i // 2, now_ms=2_000 + i)))
        recency = recency_heap(sm)
        assert recency is not None
        assert len(recency) <= 2 * len(sm.producers) + 64
    sm.apply(expire(now_ms=7_000, expiration_ms=2))  # 2 (last at 6,998) goes, 3 stays
    assert producer_ids(sm) == [3]
    assert recency_heap(sm) is None
    for pid, now_ms in ((4, 7_000), (5, 7_001)):  # full again, then 5 evicts 3
        appended(sm.apply(append(pid, 0, 0, now_ms=now_ms)))
    assert producer_ids(sm) == [4, 5]


def test_retention_moves_log_start_within_bounds() -> None:
    sm = PartitionStateMachine()
    produce_batches(sm, 3)  # offsets 0..5
    assert sm.apply(AdvanceLogStart(4).encode()) == LogStartAdvanced(4)
    assert sm.apply(AdvanceLogStart(2).encode()) == LogStartAdvanced(4)  # never backwards
    assert sm.apply(AdvanceLogStart(100).encode()) == LogStartAdvanced(6)  # never past the end
    assert sm.log_start_offset == 6


def test_noop_and_foreign_commands() -> None:
    sm = PartitionStateMachine()
    assert sm.apply(Noop(42).encode()) == NoopApplied(42)
    assert sm.apply(DeleteTopic("t").encode()) == Rejected(ErrorCode.INVALID_REQUEST)


def test_corrupt_batch_is_a_committed_rejection() -> None:
    sm = PartitionStateMachine()
    good = append(PID, 0, 0, 1)
    assert sm.apply(AppendBatch(1, b"\x00" * 40).encode()) == Rejected(ErrorCode.CORRUPT_MESSAGE)
    assert appended(sm.apply(good)).base_offset == 0


def test_expiry_due_agrees_with_expire() -> None:
    sm = PartitionStateMachine()
    appended(sm.apply(append(PID, 0, 0, 1, now_ms=1_000)))
    assert not sm.expiry_due(1_999, 1_000)
    assert sm.expiry_due(2_000, 1_000)
    assert sm.apply(expire(now_ms=2_000, expiration_ms=1_000)) == ProducersExpired((PID,))
    assert not sm.expiry_due(10**12, 1)


def test_the_injected_fault_without_deduplication_appends_a_retry_again() -> None:
    # The chaos suite's negative control depends on this switch really breaking rule 2.
    sm = PartitionStateMachine(deduplicate=False)
    first = appended(sm.apply(append(PID, 0, 0, 4)))
    again = appended(sm.apply(append(PID, 0, 0, 4)))
    assert (first.base_offset, again.base_offset) == (0, 4)
    assert sm.log_end_offset == 8
    assert appended(sm.apply(append(PID, 0, 4, 1))).base_offset == 8  # the producer goes on


def test_the_injected_fault_survives_a_snapshot() -> None:
    sm = PartitionStateMachine(deduplicate=False)
    appended(sm.apply(append(PID, 0, 0, 4)))
    restored = PartitionStateMachine.restore(sm.snapshot(), deduplicate=False)
    assert isinstance(restored.apply(append(PID, 0, 0, 4)), Appended)
    assert isinstance(
        PartitionStateMachine.restore(sm.snapshot()).apply(append(PID, 0, 0, 4)), Duplicate
    )
