"""The frame format: how one batch is laid out in a segment file, and its CRC rules.

Role: the bytes of a frame, written and read back, and nothing of segments or offsets beyond
the frame's own header. Each batch is one frame:

    length u32 | crc u32 | base_offset i64 | record_count i32 | append_time_ms i64 | batch

`length` counts the batch bytes; its top bit is the frame's kind (`HEAD_CHECKED`). The batch
(Kafka's record batch v2, with a CRC-32C of its own over everything from its `attributes` on)
is stored as given but for its `base_offset` and partition leader epoch, which the batch's CRC
does not cover (`records.with_base_offset`: the offset of its first record and the term of
the entry that appended it, so that a Kafka Fetch answers with the stored bytes as they
are). The frame's CRC:
- `HEAD_CHECKED` (every frame written since data format 3): a CRC-32C of the frame's header
  after the crc field and of the batch's first 21 bytes, the ones its own CRC leaves out. The
  batch's own CRC covers the rest: every batch was verified whole at the edge before it could
  enter the log, so nothing here checksums a batch's body again when it is written, and
  recovery checks both.
- otherwise (frames of format 2, read as before): zlib's CRC-32 over every byte after the crc
  field, header and batch.
Nothing else of a batch is read here.

`pread` and `pwrite` read and write at explicit positions, never a shared file position.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c

from statemachine.limits import MIB
from statemachine.records import (
    CRC_COVERED_FROM,
    NO_PARTITION_LEADER_EPOCH,
    STORED_HEAD_BYTES,
    stored_head,
    stored_intact,
)

FRAME_HEAD = struct.Struct(">II")  # length of the batch (the top bit: HEAD_CHECKED), crc
HEAD_CHECKED = 1 << 31
FRAME_TAIL = struct.Struct(">qiq")  # base_offset, record_count, append_time_ms
FRAME_HEADER_BYTES = FRAME_HEAD.size + FRAME_TAIL.size
_HEAD_CHECKED_END = FRAME_HEADER_BYTES + CRC_COVERED_FROM  # what a HEAD_CHECKED frame's CRC covers
# Far above any batch one Raft entry can carry (StateLimits.entry_bytes_max), and low enough
# that a corrupt length met during recovery cannot make a read allocate gigabytes.
FRAME_BATCH_BYTES_MAX = 64 * MIB


class StoredBatch(NamedTuple):
    """One stored batch, as appended."""

    base_offset: int
    record_count: int
    append_time_ms: int
    batch: bytes

    @property
    def next_offset(self) -> int:
        """The offset just past this batch's last record."""
        return self.base_offset + self.record_count


class Frame(NamedTuple):
    """A frame found in a file; `batch` is a view into the read buffer, not yet a copy."""

    position: int
    base_offset: int
    record_count: int
    append_time_ms: int
    batch: memoryview

    @property
    def size(self) -> int:
        return FRAME_HEADER_BYTES + len(self.batch)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    def stored(self) -> StoredBatch:
        return StoredBatch(
            self.base_offset, self.record_count, self.append_time_ms, bytes(self.batch)
        )


def max_timestamp_of(batch: bytes | memoryview) -> int:
    """A batch's largest record timestamp (its header's maxTimestamp)."""
    return int.from_bytes(batch[_MAX_TIMESTAMP_AT : _MAX_TIMESTAMP_AT + 8], "big", signed=True)


def leader_epoch_of(batch: bytes | memoryview) -> int:
    """A stored batch's partition leader epoch (`records.with_base_offset`)."""
    return int.from_bytes(batch[_LEADER_EPOCH_AT : _LEADER_EPOCH_AT + 4], "big", signed=True)


# Where a record batch v2 keeps them: base offset 8, length 4, leader epoch 4, magic 1, crc 4,
# attributes 2, last offset delta 4, first timestamp 8, max timestamp 8.
_LEADER_EPOCH_AT = 12
_MAX_TIMESTAMP_AT = 35


def frame_parts(
    base_offset: int,
    record_count: int,
    append_time_ms: int,
    batch: bytes,
    leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> tuple[bytes, bytes, memoryview]:
    """A `HEAD_CHECKED` frame of `batch` as stored (`with_base_offset`), in three parts.

    The parts are the frame's header, the batch's head patched and the rest of the batch as
    given: the head is patched on its way out (`pwrite`) rather than in a copy of the whole
    batch.
    """
    tail = FRAME_TAIL.pack(base_offset, record_count, append_time_ms)
    head = stored_head(batch, base_offset, leader_epoch)
    crc = crc32c(batch[STORED_HEAD_BYTES:CRC_COVERED_FROM], crc32c(head, crc32c(tail)))
    header = FRAME_HEAD.pack(len(batch) | HEAD_CHECKED, crc) + tail
    return header, head, memoryview(batch)[STORED_HEAD_BYTES:]


def intact(frame: memoryview, crc: int, kind: int) -> bool:
    """Whether a whole frame's checksums hold, by its kind."""
    if not kind:
        return zlib.crc32(frame[FRAME_HEAD.size :]) == crc
    head_crc = crc32c(frame[FRAME_HEAD.size : _HEAD_CHECKED_END])
    # The frame's length is under no CRC: the batch's own length field, under the head's, has
    # to agree with it exactly (`stored_intact`).
    return head_crc == crc and stored_intact(frame[FRAME_HEADER_BYTES:])


def pread(fd: int, size: int, position: int) -> bytes:
    """Up to `size` bytes at `position`: fewer only where the file ends."""
    data = os.pread(fd, size, position)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, position + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def pwrite(fd: int, parts: Sequence[bytes | memoryview], position: int) -> None:
    """Write all of `parts` at `position`: one system call unless the kernel writes short."""
    written = os.pwritev(fd, parts, position)
    if written == sum(len(part) for part in parts):
        return
    rest = memoryview(b"".join(parts))[written:]
    while rest:
        n = os.pwrite(fd, rest, position + written)
        written += n
        rest = rest[n:]
