"""Segment files of one partition: an append-only log on disk, a sparse offset index, recovery.

Role: `PartitionStore` keeps the batches a partition's state machine accepted (the `Appended`
effects of apply) and serves them to Fetch. Records live on disk only: nothing here keeps
batch bytes after an append returns.

Threads: one. A store is not thread-safe and takes no lock: every caller runs on the node's
event loop (the replica appends, truncates and deletes when the Raft driver applies and
settles; Fetch and the restoration duty read and append there too), or on the one thread of
bench/storage.py and the tests. Each call runs to its end before the next begins, so a read
never meets a write, a truncation or a deletion half done.

Layout: one directory per partition, holding segment files named by the offset of their first
record, zero-padded to 20 digits (`00000000000000000000.log`). Only the newest (active) segment
is written; it is rolled when the next frame would take it past `segment_bytes_max` (an empty
segment takes any frame, so an oversize batch still fits). Each batch is one frame:

    length u32 | crc u32 | base_offset i64 | record_count i32 | append_time_ms i64 | batch

`length` counts the batch bytes; its top bit is the frame's kind (`HEAD_CHECKED`). The batch
(Kafka's record batch v2, with a CRC-32C of its own over everything from its `attributes` on)
is stored as given but for its `base_offset` and partition leader epoch, which the batch's CRC
does not cover (`records.with_base_offset`: the offset of its first record, so that a Kafka
Fetch answers with the stored bytes as they are). The frame's CRC:
- `HEAD_CHECKED` (every frame written since data format 3): a CRC-32C of the frame's header
  after the crc field and of the batch's first 21 bytes, the ones its own CRC leaves out. The
  batch's own CRC covers the rest: every batch was verified whole at the edge before it could
  enter the log, so nothing here checksums a batch's body again when it is written, and
  recovery checks both.
- otherwise (frames of format 2, read as before): zlib's CRC-32 over every byte after the crc
  field, header and batch.
Nothing else of a batch is read here.

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
"""

from __future__ import annotations

import bisect
import os
import re
import struct
import zlib
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, NamedTuple, Self

from crc32c import crc32c

from cluster.config import Limits
from cluster.errors import RaftbrokerError
from cluster.files import sync_directory
from statemachine.errors import ErrorCode
from statemachine.limits import KIB, MIB
from statemachine.records import (
    CRC_COVERED_FROM,
    HEADER_BYTES,
    STORED_HEAD_BYTES,
    stored_head,
    stored_intact,
    with_base_offset,
)

_FRAME_HEAD = struct.Struct(">II")  # length of the batch (the top bit: HEAD_CHECKED), crc
HEAD_CHECKED = 1 << 31
_FRAME_TAIL = struct.Struct(">qiq")  # base_offset, record_count, append_time_ms
FRAME_HEADER_BYTES = _FRAME_HEAD.size + _FRAME_TAIL.size
_HEAD_CHECKED_END = FRAME_HEADER_BYTES + CRC_COVERED_FROM  # what a HEAD_CHECKED frame's CRC covers
# Far above any batch one Raft entry can carry (StateLimits.entry_bytes_max), and low enough
# that a corrupt length met during recovery cannot make a read allocate gigabytes.
FRAME_BATCH_BYTES_MAX = 64 * MIB
# Recovery reads whole chunks: sequential I/O, never a seek per frame.
SCAN_CHUNK_BYTES = 1 * MIB
READ_CHUNK_BYTES_MIN = 64 * KIB
SEGMENT_SUFFIX = ".log"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
_DEFAULTS = Limits()


class StorageError(RaftbrokerError):
    """The store cannot do what was asked; the caller must not go on as if it had.

    KAFKA_STORAGE_ERROR, as Kafka answers for a log it cannot use (a closed store, a log that
    diverged or has a gap): retriable, since another replica, or this one once restored, can
    serve the request.
    """

    ERROR: ClassVar[ErrorCode] = ErrorCode.KAFKA_STORAGE_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(self.ERROR, message)


class StorageGapError(StorageError):
    """An append past `next_offset`: the records in between are missing and must be re-fetched."""


class StorageCorruptionError(StorageError):
    """Damage on disk that no torn write explains: safer refused than served or dropped.

    CORRUPT_MESSAGE, as Kafka answers for stored records that fail their checks (retriable: a
    healthy replica can serve them).
    """

    ERROR: ClassVar[ErrorCode] = ErrorCode.CORRUPT_MESSAGE


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


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


class _Frame(NamedTuple):
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


def _pread(fd: int, size: int, position: int) -> bytes:
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


def _intact(frame: memoryview, crc: int, kind: int) -> bool:
    """Whether a whole frame's checksums hold, by its kind."""
    if not kind:
        return zlib.crc32(frame[_FRAME_HEAD.size :]) == crc
    head_crc = crc32c(frame[_FRAME_HEAD.size : _HEAD_CHECKED_END])
    # The frame's length is under no CRC: the batch's own length field, under the head's, has
    # to agree with it exactly (`stored_intact`).
    return head_crc == crc and stored_intact(frame[FRAME_HEADER_BYTES:])


def _pwrite(fd: int, parts: Sequence[bytes | memoryview], position: int) -> None:
    """Write all of `parts` at `position`: one system call unless the kernel writes short."""
    written = os.pwritev(fd, parts, position)
    if written == sum(len(part) for part in parts):
        return
    rest = memoryview(b"".join(parts))[written:]
    while rest:
        n = os.pwrite(fd, rest, position + written)
        written += n
        rest = rest[n:]


class _Scanner:
    """The frames of one file from `position` to `end`, read in chunks of `chunk_bytes`.

    Iteration stops at `end` or before the first frame that is not whole, plausible and (if
    `verify_crc`) intact, or that does not start at `expected_offset`; then `problem` says why
    and `position` is where that frame starts.
    """

    def __init__(
        self,
        fd: int,
        position: int,
        end: int,
        expected_offset: int,
        *,
        chunk_bytes: int,
        verify_crc: bool,
    ) -> None:
        self.position = position
        self.expected_offset = expected_offset
        self.problem: str | None = None
        self._fd = fd
        self._end = end
        self._chunk_bytes = chunk_bytes
        self._verify_crc = verify_crc
        self._buffer = b""
        self._buffer_start = position

    def __iter__(self) -> Iterator[_Frame]:
        while self.position < self._end:
            frame = self._next()
            if frame is None:
                return
            self.position += frame.size
            self.expected_offset = frame.next_offset
            yield frame

    def _next(self) -> _Frame | None:
        parsed = self._parse()
        if isinstance(parsed, str):
            self.problem = parsed
            return None
        return parsed

    def _parse(self) -> _Frame | str:
        """The frame at `position`, or what is wrong with it."""
        head = self._view(self.position, FRAME_HEADER_BYTES)
        if head is None:
            return "torn frame header"
        length, crc = _FRAME_HEAD.unpack_from(head)
        kind, length = length & HEAD_CHECKED, length & ~HEAD_CHECKED
        base_offset, record_count, append_time_ms = _FRAME_TAIL.unpack_from(head, _FRAME_HEAD.size)
        length_min = HEADER_BYTES if kind else 1
        if not length_min <= length <= FRAME_BATCH_BYTES_MAX or record_count < 1:
            return f"implausible frame header (length {length}, count {record_count})"
        frame = self._view(self.position, FRAME_HEADER_BYTES + length)
        if frame is None:
            return "torn frame"
        if self._verify_crc and not _intact(frame, crc, kind):
            return "frame CRC mismatch"
        if base_offset != self.expected_offset:
            return f"frame at offset {base_offset}, expected {self.expected_offset}"
        batch = frame[FRAME_HEADER_BYTES:]
        return _Frame(self.position, base_offset, record_count, append_time_ms, batch)

    def _view(self, position: int, size: int) -> memoryview | None:
        """`size` bytes of the file at `position`, or None if fewer lie before `end`."""
        if position + size > self._end:
            return None
        start = position - self._buffer_start
        if start + size > len(self._buffer):
            want = min(max(size, self._chunk_bytes), self._end - position)
            self._buffer = _pread(self._fd, want, position)
            self._buffer_start, start = position, 0
            if len(self._buffer) < size:
                return None
        return memoryview(self._buffer)[start : start + size]


class _Segment:
    """One segment file and what is known of it."""

    __slots__ = (
        "base_offset",
        "fd",
        "index_append_times_ms",
        "index_offsets",
        "index_positions",
        "max_append_time_ms",
        "next_offset",
        "path",
        "size",
    )

    def __init__(self, path: Path, base_offset: int, fd: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.fd = fd
        self.size = 0  # bytes of whole frames: the end reads may read up to
        self.next_offset = base_offset
        # Retention compares it with the clock; after a truncation it may be an upper bound,
        # which can keep a segment longer but never delete one early.
        self.max_append_time_ms = -1
        self.index_offsets = array("q")
        self.index_positions = array("q")
        # Per index entry, the latest append time of the segment up to the end of the frames
        # that entry covers: never decreasing, so a bisect finds where a time is first reached
        # (Kafka's time index, over the log append time).
        self.index_append_times_ms = array("q")

    def add_frame(
        self,
        frame_size: int,
        base_offset: int,
        record_count: int,
        append_time_ms: int,
        index_interval_bytes: int,
    ) -> None:
        latest_ms = max(self.max_append_time_ms, append_time_ms)
        if not self.index_positions or self.size - self.index_positions[-1] >= index_interval_bytes:
            self.index_offsets.append(base_offset)
            self.index_positions.append(self.size)
            self.index_append_times_ms.append(latest_ms)
        else:
            self.index_append_times_ms[-1] = latest_ms
        self.size += frame_size
        self.next_offset = base_offset + record_count
        self.max_append_time_ms = latest_ms

    def lookup(self, offset: int) -> tuple[int, int]:
        """Position and base offset of the last indexed frame starting at or before `offset`."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        assert i >= 0, f"offset {offset} precedes segment {self.path.name}"
        return self.index_positions[i], self.index_offsets[i]

    def cut(self, frame: _Frame) -> None:
        """Forget `frame` and everything after it."""
        keep = bisect.bisect_left(self.index_positions, frame.position)
        del self.index_offsets[keep:]
        del self.index_positions[keep:]
        del self.index_append_times_ms[keep:]
        self.size = frame.position
        self.next_offset = frame.base_offset

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _base_offset_of(segment: _Segment) -> int:
    return segment.base_offset


class _Span(NamedTuple):
    """Part of a segment a read will scan."""

    segment: _Segment
    start: int
    end: int
    expected_offset: int


class PartitionStore:
    """The on-disk log of one partition: segment files, a sparse offset index, recovery."""

    def __init__(
        self,
        directory: Path | str,
        *,
        segment_bytes_max: int = _DEFAULTS.segment_bytes_max,
        index_interval_bytes: int = _DEFAULTS.index_interval_bytes,
        fsync: bool = False,
    ) -> None:
        if segment_bytes_max <= 0 or index_interval_bytes <= 0:
            raise ValueError("segment_bytes_max and index_interval_bytes must be positive")
        self.directory = Path(directory)
        self._segment_bytes_max = segment_bytes_max
        self._index_interval_bytes = index_interval_bytes
        self._fsync = fsync
        self._segments: list[_Segment] = []
        self._log_start_offset = 0
        self._next_offset = 0
        self._size_bytes = 0
        self._closed = False
        self.recovered_truncated_bytes = 0
        self.recovery_problem: str | None = None
        self.directory.mkdir(parents=True, exist_ok=True)
        self._open()

    # -- properties --------------------------------------------------------------------------

    @property
    def fsync(self) -> bool:
        """Each append is fsynced before it returns."""
        return self._fsync

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets (the log end offset)."""
        return self._next_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of whole frames in all segment files."""
        return self._size_bytes

    # -- opening and recovery ----------------------------------------------------------------

    def _open(self) -> None:
        bases = sorted(
            int(match.group(1))
            for name in os.listdir(self.directory)
            if (match := _SEGMENT_NAME.match(name))
        )
        if not bases:
            self._segments = [self._create_segment(0)]
            return
        try:
            for i, base in enumerate(bases):
                segment = self._open_segment(base)
                self._segments.append(segment)
                if i + 1 < len(bases):
                    self._load_sealed(segment, bases[i + 1])
                else:
                    self._recover_active(segment)
        except BaseException:
            for segment in self._segments:
                segment.close()
            raise
        self._log_start_offset = bases[0]
        self._next_offset = self._segments[-1].next_offset
        self._size_bytes = sum(s.size for s in self._segments)

    def _open_segment(self, base_offset: int) -> _Segment:
        path = self.directory / segment_file_name(base_offset)
        return _Segment(path, base_offset, os.open(path, os.O_RDWR | os.O_CLOEXEC))

    def _create_segment(self, base_offset: int) -> _Segment:
        path = self.directory / segment_file_name(base_offset)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        segment = _Segment(path, base_offset, os.open(path, flags, 0o644))
        if self._fsync:
            sync_directory(self.directory)
        return segment

    def _scan_into(self, segment: _Segment, *, verify_crc: bool) -> _Scanner:
        """Walk the whole file, indexing every whole frame; the scanner tells where it stopped."""
        end = os.fstat(segment.fd).st_size
        scanner = _Scanner(
            segment.fd,
            0,
            end,
            segment.base_offset,
            chunk_bytes=SCAN_CHUNK_BYTES,
            verify_crc=verify_crc,
        )
        for frame in scanner:
            segment.add_frame(
                frame.size,
                frame.base_offset,
                frame.record_count,
                frame.append_time_ms,
                self._index_interval_bytes,
            )
        return scanner

    def _load_sealed(self, segment: _Segment, next_base_offset: int) -> None:
        # No CRC here: a rolled segment was fsynced, and each batch keeps its own CRC, which
        # consumers check; reading the bytes is all the index needs.
        scanner = self._scan_into(segment, verify_crc=False)
        if scanner.problem is not None:
            raise StorageCorruptionError(
                f"{segment.path} at byte {scanner.position}: {scanner.problem}"
            )
        if segment.next_offset != next_base_offset:
            raise StorageCorruptionError(
                f"{segment.path} ends at offset {segment.next_offset} but the next segment "
                f"starts at {next_base_offset}"
            )

    def _recover_active(self, segment: _Segment) -> None:
        scanner = self._scan_into(segment, verify_crc=True)
        if scanner.problem is None:
            return
        file_size = os.fstat(segment.fd).st_size
        self.recovered_truncated_bytes = file_size - scanner.position
        self.recovery_problem = f"{segment.path} at byte {scanner.position}: {scanner.problem}"
        os.ftruncate(segment.fd, scanner.position)
        os.fsync(segment.fd)

    # -- appending ---------------------------------------------------------------------------

    def append(
        self, base_offset: int, record_count: int, append_time_ms: int, batch: bytes
    ) -> None:
        """Store `batch` so that its first record has `base_offset`; a replay is a no-op.

        `batch` was verified whole (`records.verify_batch`, at the edge): recovery relies on its
        CRC-32C for all of it but its head, so a batch whose CRC does not hold would be cut off
        at the next start, with every frame after it.

        Raises StorageGapError if `base_offset` is past `next_offset`.
        """
        if record_count < 1 or not HEADER_BYTES <= len(batch) <= FRAME_BATCH_BYTES_MAX:
            raise ValueError(f"bad batch: {record_count} records, {len(batch)} bytes")
        self._check_open()
        if base_offset != self._next_offset:
            stored = with_base_offset(batch, base_offset)
            if self._already_stored(StoredBatch(base_offset, record_count, append_time_ms, stored)):
                return
        self._write(base_offset, record_count, append_time_ms, batch)

    def _already_stored(self, wanted: StoredBatch) -> bool:
        """Whether a replayed batch is stored as is; if it is not, make room for it."""
        if wanted.base_offset > self._next_offset:
            raise StorageGapError(
                f"append at offset {wanted.base_offset} but the log ends at "
                f"{self._next_offset}: the records in between must be fetched first"
            )
        first = self._segments[0]
        if wanted.base_offset < first.base_offset:
            if wanted.next_offset <= first.base_offset:
                return True  # stored once, since deleted by retention
            raise StorageError(
                f"replayed batch {wanted.base_offset}..{wanted.next_offset - 1} straddles the "
                f"first retained offset {first.base_offset}: the log has diverged"
            )
        segment = self._segment_for(wanted.base_offset)
        if self._locate(segment, wanted.base_offset).stored() == wanted:
            return True
        self._truncate(wanted.base_offset)
        if self._next_offset != wanted.base_offset:
            raise StorageGapError(
                f"diverged batch at {wanted.base_offset} sits inside a stored batch; "
                f"the log now ends at {self._next_offset}"
            )
        return False

    def _write(
        self, base_offset: int, record_count: int, append_time_ms: int, batch: bytes
    ) -> None:
        """A frame of `batch` as stored (`with_base_offset`), its head patched on the way out
        rather than in a copy of the whole batch."""
        assert base_offset == self._next_offset, "append must extend the log"
        tail = _FRAME_TAIL.pack(base_offset, record_count, append_time_ms)
        head = stored_head(batch, base_offset)
        crc = crc32c(batch[STORED_HEAD_BYTES:CRC_COVERED_FROM], crc32c(head, crc32c(tail)))
        header = _FRAME_HEAD.pack(len(batch) | HEAD_CHECKED, crc) + tail
        frame_size = len(header) + len(batch)
        segment = self._segments[-1]
        if segment.size and segment.size + frame_size > self._segment_bytes_max:
            segment = self._roll()
        _pwrite(segment.fd, (header, head, memoryview(batch)[STORED_HEAD_BYTES:]), segment.size)
        if self._fsync:
            os.fsync(segment.fd)
        segment.add_frame(  # only now: from here on, reads see the frame
            frame_size, base_offset, record_count, append_time_ms, self._index_interval_bytes
        )
        self._next_offset = segment.next_offset
        self._size_bytes += frame_size

    def _roll(self) -> _Segment:
        sealed = self._segments[-1]
        # A failed write may have left bytes past the last whole frame; a sealed file must hold
        # whole frames only. Syncing it is what lets recovery check only the active segment.
        os.ftruncate(sealed.fd, sealed.size)
        os.fsync(sealed.fd)
        segment = self._create_segment(self._next_offset)
        self._segments.append(segment)
        return segment

    # -- reading -----------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, at_least_one: bool = True) -> list[StoredBatch]:
        """The batches from the one holding `offset` on, up to `max_bytes` of batch bytes.

        With `at_least_one`, at least one batch whenever `offset` is stored, however large it
        is (as Kafka serves an oversize batch to the first partition of a fetch); without it,
        only whole batches within `max_bytes`. Nothing for an offset below `log_start_offset` or
        at `next_offset` and beyond. StorageCorruptionError if a frame on the way is not what
        the index says.
        """
        if max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative, got {max_bytes}")
        self._check_open()
        if not self._log_start_offset <= offset < self._next_offset:
            return []
        if max_bytes == 0 and not at_least_one:
            return []
        spans = self._spans(offset, max_bytes)
        return self._read_spans(spans, offset, max_bytes, at_least_one)

    def _spans(self, offset: int, max_bytes: int) -> list[_Span]:
        """The parts of segments a read of `max_bytes` from a stored `offset` may scan."""
        first = bisect.bisect_right(self._segments, offset, key=_base_offset_of) - 1
        position, indexed_offset = self._segments[first].lookup(offset)
        # The frame holding `offset` starts less than one index interval past `position`.
        budget = max_bytes + self._index_interval_bytes
        spans: list[_Span] = []
        for segment in self._segments[first:]:
            spans.append(_Span(segment, position, segment.size, indexed_offset))
            budget -= segment.size - position
            if budget <= 0:
                break
            position, indexed_offset = 0, segment.next_offset
        return spans

    def _read_spans(
        self, spans: list[_Span], offset: int, max_bytes: int, at_least_one: bool
    ) -> list[StoredBatch]:
        chunk_bytes = max(READ_CHUNK_BYTES_MIN, max_bytes + self._index_interval_bytes)
        batches: list[StoredBatch] = []
        total = 0
        for span in spans:
            scanner = _Scanner(
                span.segment.fd,
                span.start,
                span.end,
                span.expected_offset,
                chunk_bytes=chunk_bytes,
                verify_crc=False,
            )
            for frame in scanner:
                if frame.next_offset <= offset:
                    continue
                if (batches or not at_least_one) and total + len(frame.batch) > max_bytes:
                    return batches
                batches.append(frame.stored())
                total += len(frame.batch)
            if scanner.problem is not None:
                problem = f"{span.segment.path} at {scanner.position}: {scanner.problem}"
                raise StorageCorruptionError(problem)
        return batches

    def offset_for_time(self, time_ms: int) -> int | None:
        """The base offset of the first stored batch appended at `time_ms` or later (the log
        append time the leader stamped), or None when none was. The time index narrows the
        scan to one index interval (a few KiB) per segment it reaches."""
        self._check_open()
        for segment in self._segments:
            if segment.max_append_time_ms < time_ms:
                continue  # all of it earlier (after a truncation this may be an upper bound)
            i = bisect.bisect_left(segment.index_append_times_ms, time_ms)
            if i == len(segment.index_append_times_ms):
                continue
            scanner = _Scanner(
                segment.fd,
                segment.index_positions[i],
                segment.size,
                segment.index_offsets[i],
                chunk_bytes=READ_CHUNK_BYTES_MIN,
                verify_crc=False,
            )
            for frame in scanner:
                if frame.append_time_ms >= time_ms:
                    return max(frame.base_offset, self._log_start_offset)
        return None

    def _segment_for(self, offset: int) -> _Segment:
        i = bisect.bisect_right(self._segments, offset, key=_base_offset_of) - 1
        assert i >= 0, f"offset {offset} precedes the first segment"
        return self._segments[i]

    def _locate(self, segment: _Segment, offset: int) -> _Frame:
        """The frame of `segment` holding `offset`."""
        position, indexed_offset = segment.lookup(offset)
        scanner = _Scanner(
            segment.fd,
            position,
            segment.size,
            indexed_offset,
            chunk_bytes=READ_CHUNK_BYTES_MIN,
            verify_crc=False,
        )
        for frame in scanner:
            if frame.next_offset > offset:
                return frame
        raise StorageCorruptionError(
            f"offset {offset} not found in {segment.path}: {scanner.problem or 'past its end'}"
        )

    # -- truncation, retention, reset --------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Drop every batch holding an offset at or after `offset` (a diverged tail).

        A batch that straddles `offset` goes whole, so `next_offset` may end up below it.
        """
        self._check_open()
        self._truncate(offset)

    def _truncate(self, offset: int) -> None:
        if offset >= self._next_offset:
            return
        if offset <= self._segments[0].base_offset:
            self._reset(offset)
            return
        segment = self._segment_for(offset)
        cut = self._locate(segment, offset)
        keep = self._segments.index(segment) + 1
        doomed = self._segments[keep:]
        del self._segments[keep:]
        self._size_bytes -= sum(s.size for s in doomed) + segment.size - cut.position
        segment.cut(cut)
        self._next_offset = segment.next_offset
        self._log_start_offset = min(self._log_start_offset, self._next_offset)
        # Newest first, and durably before shortening the file: a crash in between leaves a
        # log with no gap, whose extra tail the replay compares and truncates again.
        self._delete_files(doomed[::-1], sync=True)
        os.ftruncate(segment.fd, cut.position)
        if self._fsync:
            os.fsync(segment.fd)

    def delete_before(self, offset: int) -> None:
        """Retention: delete whole segments whose every record is below `offset`.

        The active segment stays (as in Kafka), even if all its records are below `offset`.
        `log_start_offset` becomes max(itself, offset).
        """
        self._check_open()
        if offset > self._next_offset:
            raise ValueError(f"log start {offset} would pass the log end {self._next_offset}")
        count = 0
        while count < len(self._segments) - 1 and self._segments[count].next_offset <= offset:
            count += 1
        doomed = self._segments[:count]
        del self._segments[:count]
        self._size_bytes -= sum(s.size for s in doomed)
        self._log_start_offset = max(self._log_start_offset, offset)
        assert self._segments[0].base_offset <= self._log_start_offset
        # Oldest first: a crash in between leaves a log with no gap.
        self._delete_files(doomed, sync=self._fsync)

    def segments_for_retention(
        self, now_ms: int, retention_ms: int | None, retention_bytes: int | None
    ) -> int | None:
        """The offset below which whole segments are out of retention, or None if none are.

        A segment is out when its newest batch is older than `retention_ms`, or when the log
        without it still holds `retention_bytes` (Kafka's rule). Only a prefix of sealed
        segments counts: never the active one. None or a negative value means no limit.
        """
        excess = -1
        if retention_bytes is not None and retention_bytes >= 0:
            excess = self._size_bytes - retention_bytes
        cutoff: int | None = None
        for segment in self._segments[:-1]:  # the sealed ones
            expired = (
                retention_ms is not None
                and retention_ms >= 0
                and now_ms - segment.max_append_time_ms > retention_ms
            )
            if not (expired or excess >= segment.size):
                break
            excess -= segment.size
            cutoff = segment.next_offset
        return cutoff

    def reset(self, offset: int) -> None:
        """Delete everything and start an empty log at `offset` (a follower behind a snapshot)."""
        self._check_open()
        self._reset(offset)

    def _reset(self, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        doomed = self._segments
        self._segments = []
        self._log_start_offset = self._next_offset = offset
        self._size_bytes = 0
        # A crash before the new segment exists leaves an empty directory, which opens as an
        # empty log at 0: the replica then finds itself behind its snapshot and resets again.
        self._delete_files(doomed[::-1], sync=self._fsync)
        self._segments = [self._create_segment(offset)]

    def _delete_files(self, doomed: list[_Segment], *, sync: bool) -> None:
        """Unlink and close files, in the order given."""
        for segment in doomed:
            segment.path.unlink(missing_ok=True)
            segment.close()
        if doomed and sync:
            sync_directory(self.directory)

    # -- durability and closing --------------------------------------------------------------

    def sync(self) -> None:
        """Make every append so far durable: the active segment fsynced (sealed ones were
        synced when rolled), and the directory, which names every segment."""
        self._check_open()
        os.fsync(self._segments[-1].fd)
        sync_directory(self.directory)

    def close(self) -> None:
        """Close every file. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            segment.close()
        self._segments = []

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"store {self.directory} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
