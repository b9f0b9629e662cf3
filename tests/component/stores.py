"""The segment store as the component tests use it: tiny segments, batches numbered by
index, and the few ways to open, fill and list a store (tests/component/test_storage*.py)."""

from __future__ import annotations

from pathlib import Path

from cluster.broker.storage import (
    FRAME_HEADER_BYTES,
    PartitionStore,
    StoredBatch,
)
from statemachine.records import Record, RecordBatch, with_base_offset

PID = 7
SEGMENT_BYTES = 1_024
INDEX_INTERVAL = 256


def encoded(index: int, records: int = 3, value_bytes: int = 40, version: int = 0) -> bytes:
    """A distinct batch per (index, version): `records` records of `value_bytes` each."""
    value = bytes([(index + 31 * version) % 256]) * value_bytes
    items = tuple(Record(f"k{index}.{j}".encode(), value, 1_000 + index) for j in range(records))
    return RecordBatch(PID, version, index * records, items).encode()


def as_stored(base_offset: int, count: int, append_time_ms: int, batch: bytes) -> StoredBatch:
    """A batch as the store gives it back: its base offset set to its first record's."""
    return StoredBatch(base_offset, count, append_time_ms, with_base_offset(batch, base_offset))


def frame_bytes(batch: StoredBatch) -> int:
    return FRAME_HEADER_BYTES + len(batch.batch)


def open_store(
    directory: Path,
    *,
    segment_bytes_max: int = SEGMENT_BYTES,
    index_interval_bytes: int = INDEX_INTERVAL,
    fsync: bool = False,
) -> PartitionStore:
    return PartitionStore(
        directory,
        segment_bytes_max=segment_bytes_max,
        index_interval_bytes=index_interval_bytes,
        fsync=fsync,
    )


def fill(store: PartitionStore, count: int, records: int = 3, first: int = 0) -> list[StoredBatch]:
    """Append batches `first`..`first+count-1` at the log end; return them as stored."""
    stored = []
    for index in range(first, first + count):
        batch = as_stored(store.next_offset, records, 10_000 + index, encoded(index, records))
        store.append(*batch)
        stored.append(batch)
    return stored


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def read_all(store: PartitionStore) -> list[StoredBatch]:
    return store.read(store.log_start_offset, 1 << 30)
