"""Sink fences in a partition's apply: a replayed micro-batch part is appended once.

Each test drives a real PartitionStateMachine with encoded `AppendFencedBatch` entries, as a
replica applies them (statemachine/sink_fences.py states the rules).
"""

from __future__ import annotations

from statemachine.codec import pack
from statemachine.commands import AppendFencedBatch
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import StateLimits
from statemachine.partition import Appended, Duplicate, PartitionStateMachine
from tests.builders import batch, expire, plain_batch

SINK = "settlements-to-totals"


def part(
    batch_id: int,
    number: int,
    *,
    writer: int = 0,
    sink: str = SINK,
    data: bytes | None = None,
    now_ms: int = 1_000,
) -> bytes:
    return AppendFencedBatch(
        now_ms, data or plain_batch(2), sink, writer, batch_id, number
    ).encode()


def test_parts_append_in_order_and_a_replay_of_any_is_a_no_op() -> None:
    sm = PartitionStateMachine()
    first = sm.apply(part(0, 0, now_ms=100))
    assert first == Appended(0, 1, 100, plain_batch(2))
    assert isinstance(sm.apply(part(0, 1)), Appended)
    assert isinstance(sm.apply(part(1, 0)), Appended)
    end = sm.log_end_offset
    for replay in (part(0, 0), part(0, 1), part(1, 0)):
        assert sm.apply(replay) == Duplicate(-1, -1, 1_000)
    assert sm.log_end_offset == end == 6
    assert isinstance(sm.apply(part(1, 1)), Appended)  # the replay's next part is new


def test_writers_and_sinks_are_fenced_apart() -> None:
    sm = PartitionStateMachine()
    assert isinstance(sm.apply(part(5, 0, writer=0)), Appended)
    assert isinstance(sm.apply(part(0, 0, writer=1)), Appended)
    assert isinstance(sm.apply(part(0, 0, writer=0, sink="other")), Appended)
    assert sm.apply(part(4, 9, writer=0)) == Duplicate(-1, -1, 1_000)


def test_a_lost_ack_retry_of_an_idempotent_part_gets_its_offsets() -> None:
    sm = PartitionStateMachine()
    sm.apply(part(0, 0))
    first = sm.apply(part(1, 0, data=batch(7, 0, 0, 3), now_ms=2_000))
    assert first == Appended(2, 4, 2_000, batch(7, 0, 0, 3))
    # The same part from the same producer session: the producer table answers first.
    assert sm.apply(part(1, 0, data=batch(7, 0, 0, 3), now_ms=3_000)) == Duplicate(2, 4, 2_000)


def test_a_replay_by_a_new_session_leaves_its_sequences_unused() -> None:
    sm = PartitionStateMachine()
    sm.apply(part(3, 0, data=batch(7, 0, 0, 2)))
    # Spark re-runs batch 3 after a crash: a new producer id, sequence 0 again.
    assert sm.apply(part(3, 0, data=batch(8, 0, 0, 2))) == Duplicate(-1, -1, 1_000)
    assert sm.producers.get(8) is None
    # Its next, new part still starts at sequence 0: the replayed one consumed nothing.
    assert isinstance(sm.apply(part(3, 1, data=batch(8, 0, 0, 2))), Appended)


def test_producer_rules_still_apply_to_fenced_parts() -> None:
    sm = PartitionStateMachine()
    sm.apply(part(0, 0, data=batch(7, 1, 0, 1)))
    stale_epoch = part(0, 1, data=batch(7, 0, 1, 1))
    assert sm.apply(stale_epoch) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    gap = part(0, 1, data=batch(7, 1, 5, 1))
    assert sm.apply(gap) == Rejected(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert sm.sinks.get(SINK, 0) == (0, 0, 1_000)  # a refused part moves no fence


def test_a_full_table_refuses_new_writers_until_expiry_frees_it() -> None:
    sm = PartitionStateMachine(StateLimits(sink_writers_per_partition_max=2))
    sm.apply(part(0, 0, writer=0, now_ms=1_000))
    sm.apply(part(0, 0, writer=1, now_ms=5_000))
    full = sm.apply(part(0, 0, writer=2))
    assert full == Rejected(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
    assert isinstance(sm.apply(part(1, 0, writer=1)), Appended)  # known writers go on
    assert sm.expiry_due(7_000, 5_000)
    sm.apply(expire(7_000, 5_000))  # writer 0 idle since 1,000: forgotten
    assert sm.sinks.get(SINK, 0) is None
    assert isinstance(sm.apply(part(0, 0, writer=2)), Appended)


def test_an_invalid_sink_name_or_batch_is_rejected() -> None:
    sm = PartitionStateMachine()
    assert sm.apply(part(0, 0, sink="")) == Rejected(ErrorCode.INVALID_REQUEST)
    assert sm.apply(part(0, 0, sink="s" * 250)) == Rejected(ErrorCode.INVALID_REQUEST)
    corrupt = AppendFencedBatch(1, b"not a batch", SINK, 0, 0, 0).encode()
    assert sm.apply(corrupt) == Rejected(ErrorCode.CORRUPT_MESSAGE)
    assert sm.log_end_offset == 0 and len(sm.sinks) == 0


def test_fences_survive_a_snapshot_and_a_version_1_snapshot_restores_without_any() -> None:
    sm = PartitionStateMachine()
    sm.apply(part(2, 1, writer=3))
    restored = PartitionStateMachine.restore(sm.snapshot())
    assert restored.snapshot() == sm.snapshot()
    assert restored.apply(part(2, 1, writer=3)) == Duplicate(-1, -1, 1_000)
    version_1 = pack([1, 0, 4, 99, []])
    old = PartitionStateMachine.restore(version_1)
    assert (old.log_end_offset, old.clock_ms, len(old.sinks)) == (4, 99, 0)
