"""PartitionStore's max timestamp (ListOffsets -3, KIP-734) on real files: the batch holding the
largest producer timestamp from the log start on, kept per segment as batches are appended,
rebuilt when a store opens, and found again by a scan where retention or a truncation took
the batch that held it. Segments hold a few batches each, so every case crosses them."""

from __future__ import annotations

from pathlib import Path

from cluster.broker.storage import PartitionStore
from statemachine.records import Record, RecordBatch

SEGMENT_BYTES = 320


def batch(index: int, timestamps: tuple[int, ...]) -> bytes:
    records = tuple(Record(f"k{j}".encode(), b"v" * 40, t) for j, t in enumerate(timestamps))
    return RecordBatch(7, 0, index * 10, records).encode()


def open_store(directory: Path, segment_bytes: int = SEGMENT_BYTES) -> PartitionStore:
    return PartitionStore(directory, segment_bytes_max=segment_bytes, index_interval_bytes=128)


# Batch i holds these record timestamps; the largest, 9_000, is batch 3's (offsets 6..7).
TIMESTAMPS = ((1_000, 1_500), (2_000,), (1_200, 3_000), (4_000, 9_000), (5_000,), (8_000, 100))


def filled(directory: Path, segment_bytes: int = SEGMENT_BYTES) -> tuple[PartitionStore, list[int]]:
    store, bases, offset = open_store(directory, segment_bytes), [], 0
    for i, stamps in enumerate(TIMESTAMPS):
        store.append(offset, len(stamps), 10 + i, batch(i, stamps))
        bases.append(offset)
        offset += len(stamps)
    return store, bases


def test_the_batch_with_the_largest_timestamp_is_found(tmp_path: Path) -> None:
    store, bases = filled(tmp_path)
    assert len(list(tmp_path.glob("*.log"))) >= 3, "the batches span several segments"
    assert store.max_timestamp(store.log_start_offset) == (9_000, bases[3])
    store.close()
    reopened = open_store(tmp_path)  # rebuilt from the files
    assert reopened.max_timestamp(0) == (9_000, bases[3])
    reopened.close()


def test_an_empty_store_has_none(tmp_path: Path) -> None:
    assert open_store(tmp_path).max_timestamp(0) == (-1, -1)


def test_past_the_log_start_the_largest_left_is_found(tmp_path: Path) -> None:
    store, bases = filled(tmp_path, segment_bytes=1 << 20)  # one segment: it stays, scanned
    store.delete_before(bases[4])  # batch 3 (9_000) is below the log start now
    assert store.max_timestamp(store.log_start_offset) == (8_000, bases[5])
    store.delete_before(bases[5] + 1)  # inside batch 5: it still counts, whole
    assert store.max_timestamp(store.log_start_offset) == (8_000, bases[5])


def test_after_a_truncation_the_segment_is_scanned_again(tmp_path: Path) -> None:
    store, bases = filled(tmp_path)
    store.truncate_to(bases[3])  # batch 3 and everything after it go
    assert store.max_timestamp(store.log_start_offset) == (3_000, bases[2])
    store.append(bases[3], 1, 99, batch(9, (7_000,)))
    assert store.max_timestamp(store.log_start_offset) == (7_000, bases[3])


def test_a_reopened_store_answers_from_the_log_start_it_is_given(tmp_path: Path) -> None:
    # A store opens at its first segment's base; the log start is the state machine's.
    store, bases = filled(tmp_path, segment_bytes=1 << 20)
    store.delete_before(bases[4])
    store.close()
    reopened = open_store(tmp_path, 1 << 20)
    assert reopened.max_timestamp(bases[4]) == (8_000, bases[5])
    assert reopened.max_timestamp(bases[5] + 2) == (-1, -1), "past every record"


def test_a_replay_over_a_batch_stored_without_its_epoch_keeps_it(tmp_path: Path) -> None:
    """Batches stored before leader epochs were stamped hold -1; replayed after the upgrade
    with their entry's term, each is the same batch, not a diverged tail to cut off."""
    store, bases = filled(tmp_path)
    size = sum(f.stat().st_size for f in tmp_path.glob("*.log"))
    store.append(bases[1], len(TIMESTAMPS[1]), 11, batch(1, TIMESTAMPS[1]), 4)
    assert store.next_offset == bases[5] + 2, "nothing truncated"
    assert sum(f.stat().st_size for f in tmp_path.glob("*.log")) == size
    store.append(bases[2], 1, 12, batch(99, (1,)), 4)  # a different batch: the tail diverged
    assert store.next_offset == bases[2] + 1
