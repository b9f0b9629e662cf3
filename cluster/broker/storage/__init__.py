"""Segment files of one partition: an append-only log on disk, a sparse offset index, recovery.

Role: `PartitionStore` keeps the batches a partition's state machine accepted (the `Appended`
effects of apply) and serves them to Fetch. Records live on disk only: nothing here keeps
batch bytes after an append returns.

Threads: one. A store is not thread-safe and takes no lock: every caller runs on the node's
event loop (the replica appends, truncates and deletes when the Raft driver applies and
settles; Fetch and the restoration duty read and append there too), or on the one thread of
bench/storage.py and the tests. Each call runs to its end before the next begins, so a read
never meets a write, a truncation or a deletion half done.

Layout: one directory per partition, holding segment files (segments.py), each a run of
frames, one per batch (frames.py, which gives a frame's bytes and its CRC rules).

Rules:
- Offsets are contiguous: each frame starts at the offset where the one before it ended. An
  append at `next_offset` extends the log. An append below it is a replay after a restart: a
  batch stored with identical bytes is skipped, a different one means the tail diverged, so the
  log is truncated there and the batch appended. An append above it is a `StorageGapError`.
- A frame counts once it is whole: it is written past the segment's known end, which moves
  only after the write (and the fsync, if `fsync=True`) succeeded; bytes a failed write left
  are never read and are cut off when the segment is rolled or recovered. Reads and writes use
  `os.pread` / `os.pwritev` at explicit positions, never a shared file position.
- Recovery: a segment is fsynced when it is rolled, so only the active segment can end in a torn
  write. On open, its every frame's CRC is checked and the file is truncated at the first bad
  frame (`recovered_truncated_bytes` says how much went). Sealed segments are walked only to
  rebuild their index; damage there is not a torn write, so it raises `StorageCorruptionError`
  instead of silently dropping the log after it.
- The index is sparse, an entry per `index_interval_bytes` of log, in two `array('q')` per
  segment (16 bytes an entry). It is rebuilt on open with large sequential reads, as Kafka
  rebuilds after an unclean shutdown, and is not persisted.
- The log start offset is not persisted either: on open it is the first segment's base offset.
  The state machine, which is replayed from Raft, owns the logical log start.

Modules, each importing only those before it:
- errors.py     `StorageError` and its subclasses, with their Kafka codes
- frames.py     the frame format: header structs, CRC rules, `StoredBatch`, pread / pwrite
- segments.py   `Segment` (one file, its sparse index) and `Scanner` (its frames), file names
- retention.py  which whole segments are out of retention, as pure functions
- store.py      `PartitionStore`: appends, replays, reads, truncation, deletion, recovery

Other packages need only the names this package re-exports.
"""

from cluster.broker.storage.errors import (
    StorageCorruptionError,
    StorageError,
    StorageGapError,
)
from cluster.broker.storage.frames import (
    FRAME_BATCH_BYTES_MAX,
    FRAME_HEADER_BYTES,
    HEAD_CHECKED,
    StoredBatch,
    leader_epoch_of,
)
from cluster.broker.storage.segments import (
    READ_CHUNK_BYTES_MIN,
    SCAN_CHUNK_BYTES,
    SEGMENT_SUFFIX,
    segment_file_name,
)
from cluster.broker.storage.store import PartitionStore

__all__ = [
    "FRAME_BATCH_BYTES_MAX",
    "FRAME_HEADER_BYTES",
    "HEAD_CHECKED",
    "READ_CHUNK_BYTES_MIN",
    "SCAN_CHUNK_BYTES",
    "SEGMENT_SUFFIX",
    "PartitionStore",
    "StorageCorruptionError",
    "StorageError",
    "StorageGapError",
    "StoredBatch",
    "leader_epoch_of",
    "segment_file_name",
]
