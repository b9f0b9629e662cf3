"""Segment files and their sparse index: one file of frames, what is known of it, its scans.

Role: a partition's log is a run of segment files, each named by the offset of its first
record, zero-padded to 20 digits (`00000000000000000000.log`). A `Segment` holds one file's
descriptor, the end of its whole frames and its index; a `Scanner` walks its frames from a
position, reading in chunks. Which segment is written, rolled or deleted is the store's
business (store.py).

The sparse index (see the package's rules) is a segment's `index_offsets` and
`index_positions`, an entry per `index_interval_bytes` of log, and beside them, per entry, the
latest log append time so far (Kafka's time index). `Segment.load` rebuilds it on open; a read
finds the last indexed frame at or before an offset (`lookup`) and scans from there.
"""

from __future__ import annotations

import bisect
import os
import re
from array import array
from collections.abc import Iterator
from pathlib import Path

from cluster.broker.storage.errors import StorageCorruptionError
from cluster.broker.storage.frames import (
    FRAME_BATCH_BYTES_MAX,
    FRAME_HEAD,
    FRAME_HEADER_BYTES,
    FRAME_TAIL,
    HEAD_CHECKED,
    Frame,
    intact,
    max_timestamp_of,
    pread,
)
from statemachine.limits import KIB, MIB
from statemachine.records import HEADER_BYTES

# Recovery reads whole chunks: sequential I/O, never a seek per frame.
SCAN_CHUNK_BYTES = 1 * MIB
READ_CHUNK_BYTES_MIN = 64 * KIB
SEGMENT_SUFFIX = ".log"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def segment_bases(directory: Path) -> list[int]:
    """The base offsets of the segment files in `directory`, in order."""
    return sorted(
        int(match.group(1))
        for name in os.listdir(directory)
        if (match := _SEGMENT_NAME.match(name))
    )


class Scanner:
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

    def __iter__(self) -> Iterator[Frame]:
        while self.position < self._end:
            frame = self._next()
            if frame is None:
                return
            self.position += frame.size
            self.expected_offset = frame.next_offset
            yield frame

    def _next(self) -> Frame | None:
        parsed = self._parse()
        if isinstance(parsed, str):
            self.problem = parsed
            return None
        return parsed

    def _parse(self) -> Frame | str:
        """The frame at `position`, or what is wrong with it."""
        head = self._view(self.position, FRAME_HEADER_BYTES)
        if head is None:
            return "torn frame header"
        length, crc = FRAME_HEAD.unpack_from(head)
        kind, length = length & HEAD_CHECKED, length & ~HEAD_CHECKED
        base_offset, record_count, append_time_ms = FRAME_TAIL.unpack_from(head, FRAME_HEAD.size)
        length_min = HEADER_BYTES if kind else 1
        if not length_min <= length <= FRAME_BATCH_BYTES_MAX or record_count < 1:
            return f"implausible frame header (length {length}, count {record_count})"
        frame = self._view(self.position, FRAME_HEADER_BYTES + length)
        if frame is None:
            return "torn frame"
        if self._verify_crc and not intact(frame, crc, kind):
            return "frame CRC mismatch"
        if base_offset != self.expected_offset:
            return f"frame at offset {base_offset}, expected {self.expected_offset}"
        batch = frame[FRAME_HEADER_BYTES:]
        return Frame(self.position, base_offset, record_count, append_time_ms, batch)

    def _view(self, position: int, size: int) -> memoryview | None:
        """`size` bytes of the file at `position`, or None if fewer lie before `end`."""
        if position + size > self._end:
            return None
        start = position - self._buffer_start
        if start + size > len(self._buffer):
            want = min(max(size, self._chunk_bytes), self._end - position)
            self._buffer = pread(self._fd, want, position)
            self._buffer_start, start = position, 0
            if len(self._buffer) < size:
                return None
        return memoryview(self._buffer)[start : start + size]


class Segment:
    """One segment file and what is known of it."""

    __slots__ = (
        "base_offset",
        "fd",
        "index_append_times_ms",
        "index_offsets",
        "index_positions",
        "max_append_time_ms",
        "max_timestamp_ms",
        "max_timestamp_offset",
        "max_timestamp_scanned",
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
        # The largest producer timestamp of its batches and the base offset of the first batch
        # holding it (ListOffsets' max timestamp, KIP-734); after a truncation, the batch may
        # be gone: `MaxTimestamp` scans the segment again then.
        self.max_timestamp_ms = -1
        self.max_timestamp_offset = -1
        # The last scan's start and answer: asked again from there, no file is read again.
        self.max_timestamp_scanned: tuple[int, tuple[int, int]] | None = None
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
        *,
        max_timestamp_ms: int = -1,
    ) -> None:
        if max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms, self.max_timestamp_offset = max_timestamp_ms, base_offset
        self.max_timestamp_scanned = None
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

    def load(self, index_interval_bytes: int, *, verify_crc: bool) -> Scanner:
        """Walk the whole file, indexing every whole frame; the scanner tells where it stopped."""
        end = os.fstat(self.fd).st_size
        scanner = Scanner(
            self.fd,
            0,
            end,
            self.base_offset,
            chunk_bytes=SCAN_CHUNK_BYTES,
            verify_crc=verify_crc,
        )
        for frame in scanner:
            self.add_frame(
                frame.size,
                frame.base_offset,
                frame.record_count,
                frame.append_time_ms,
                index_interval_bytes,
                max_timestamp_ms=max_timestamp_of(frame.batch),
            )
        return scanner

    def max_timestamp_from(self, offset: int) -> tuple[int, int]:
        """(the largest producer timestamp of the batches holding `offset` or later, the base
        offset of the first batch holding it), or (-1, -1) when there are none: from what
        `add_frame` kept where it still holds, else from a scan of the file."""
        if self.max_timestamp_offset >= self.next_offset:  # its batch was cut off
            self.max_timestamp_ms, self.max_timestamp_offset = self._scan_max(self.base_offset)
        if self.max_timestamp_offset >= offset or self.size == 0:
            return self.max_timestamp_ms, self.max_timestamp_offset
        # The log start moved past the batch that holds it: scan once from there.
        if self.max_timestamp_scanned is None or self.max_timestamp_scanned[0] != offset:
            self.max_timestamp_scanned = (offset, self._scan_max(offset))
        return self.max_timestamp_scanned[1]

    def _scan_max(self, offset: int) -> tuple[int, int]:
        if self.size == 0:  # truncated to nothing
            return -1, -1
        position, first = self.lookup(max(offset, self.base_offset))
        scanner = Scanner(self.fd, position, self.size, first,
                          chunk_bytes=SCAN_CHUNK_BYTES, verify_crc=False)  # fmt: skip
        best = (-1, -1)
        for frame in scanner:
            timestamp = max_timestamp_of(frame.batch)
            if frame.next_offset > offset and timestamp > best[0]:
                best = (timestamp, frame.base_offset)
        return best

    def lookup(self, offset: int) -> tuple[int, int]:
        """Position and base offset of the last indexed frame starting at or before `offset`."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        assert i >= 0, f"offset {offset} precedes segment {self.path.name}"
        return self.index_positions[i], self.index_offsets[i]

    def locate(self, offset: int) -> Frame:
        """The frame of this segment holding `offset`."""
        position, indexed_offset = self.lookup(offset)
        scanner = Scanner(
            self.fd,
            position,
            self.size,
            indexed_offset,
            chunk_bytes=READ_CHUNK_BYTES_MIN,
            verify_crc=False,
        )
        for frame in scanner:
            if frame.next_offset > offset:
                return frame
        raise StorageCorruptionError(
            f"offset {offset} not found in {self.path}: {scanner.problem or 'past its end'}"
        )

    def first_appended_at(self, time_ms: int) -> Frame | None:
        """The first frame appended at `time_ms` or later, or None if none was.

        The time index narrows the scan to one index interval (a few KiB).
        """
        if self.max_append_time_ms < time_ms:
            return None  # all of it earlier (after a truncation this may be an upper bound)
        i = bisect.bisect_left(self.index_append_times_ms, time_ms)
        if i == len(self.index_append_times_ms):
            return None
        scanner = Scanner(
            self.fd,
            self.index_positions[i],
            self.size,
            self.index_offsets[i],
            chunk_bytes=READ_CHUNK_BYTES_MIN,
            verify_crc=False,
        )
        for frame in scanner:
            if frame.append_time_ms >= time_ms:
                return frame
        return None

    def cut(self, frame: Frame) -> None:
        """Forget `frame` and everything after it."""
        keep = bisect.bisect_left(self.index_positions, frame.position)
        del self.index_offsets[keep:]
        del self.index_positions[keep:]
        del self.index_append_times_ms[keep:]
        self.max_timestamp_scanned = None
        self.size = frame.position
        self.next_offset = frame.base_offset

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
