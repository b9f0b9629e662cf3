"""Small builders shared by the tests: batches and entries, encoded as the log carries them."""

from __future__ import annotations

from statemachine.commands import AppendBatch, ExpireProducers
from statemachine.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, Record, RecordBatch

VALUE_100B = b"x" * 100


def batch(
    producer_id: int, epoch: int, base_sequence: int, count: int = 1, timestamp_ms: int = 1
) -> bytes:
    """An encoded batch of `count` records from one producer session."""
    records = tuple(Record(f"k{i}".encode(), VALUE_100B, timestamp_ms) for i in range(count))
    return RecordBatch(producer_id, epoch, base_sequence, records).encode()


def plain_batch(count: int = 1) -> bytes:
    """An encoded batch of a non-idempotent producer (PID -1)."""
    records = tuple(Record(None, VALUE_100B, 1) for _ in range(count))
    return RecordBatch(NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, records).encode()


def append(
    producer_id: int, epoch: int, base_sequence: int, count: int = 1, now_ms: int = 1_000
) -> bytes:
    """The log entry of an AppendBatch of `batch(...)` stamped at `now_ms`."""
    return AppendBatch(now_ms, batch(producer_id, epoch, base_sequence, count)).encode()


def expire(now_ms: int, expiration_ms: int) -> bytes:
    return ExpireProducers(now_ms, expiration_ms).encode()
