"""The store: one partition's log on disk, appended, read, truncated, reset and recovered.

Role: `PartitionStore` keeps the batches a partition's state machine accepted (the `Appended`
effects of apply) and serves them to Fetch, over a directory of segments (segments.py) holding
frames (frames.py). Only the newest (active) segment is written; it is rolled when the next
frame would take it past `segment_bytes_max` (an empty segment takes any frame, so an oversize
batch still fits), and fsynced then. Recovery on open checks every frame of the active segment
and cuts a torn tail; sealed segments are only indexed, and damage there is refused. Which
segments retention deletes is decided in retention.py. The package's docstring gives the rules.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Self

from cluster.broker.storage.errors import (
    StorageCorruptionError,
    StorageError,
    StorageGapError,
)
from cluster.broker.storage.frames import (
    FRAME_BATCH_BYTES_MAX,
    FRAME_HEADER_BYTES,
    StoredBatch,
    frame_parts,
    max_timestamp_of,
    pwrite,
)
from cluster.broker.storage.retention import retention_cutoff, segments_below
from cluster.broker.storage.segments import (
    READ_CHUNK_BYTES_MIN,
    Scanner,
    Segment,
    segment_bases,
    segment_file_name,
)
from cluster.config import Limits
from cluster.files import sync_directory
from statemachine.records import (
    HEADER_BYTES,
    NO_PARTITION_LEADER_EPOCH,
    with_base_offset,
)

_DEFAULTS = Limits()


def _base_offset_of(segment: Segment) -> int:
    return segment.base_offset


class _Span(NamedTuple):
    """Part of a segment a read will scan."""

    segment: Segment
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
        self._segments: list[Segment] = []
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
        bases = segment_bases(self.directory)
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

    def _open_segment(self, base_offset: int) -> Segment:
        path = self.directory / segment_file_name(base_offset)
        return Segment(path, base_offset, os.open(path, os.O_RDWR | os.O_CLOEXEC))

    def _create_segment(self, base_offset: int) -> Segment:
        path = self.directory / segment_file_name(base_offset)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        segment = Segment(path, base_offset, os.open(path, flags, 0o644))
        if self._fsync:
            sync_directory(self.directory)
        return segment

    def _load_sealed(self, segment: Segment, next_base_offset: int) -> None:
        # No CRC here: a rolled segment was fsynced, and each batch keeps its own CRC, which
        # consumers check; reading the bytes is all the index needs.
        scanner = segment.load(self._index_interval_bytes, verify_crc=False)
        if scanner.problem is not None:
            raise StorageCorruptionError(
                f"{segment.path} at byte {scanner.position}: {scanner.problem}"
            )
        if segment.next_offset != next_base_offset:
            raise StorageCorruptionError(
                f"{segment.path} ends at offset {segment.next_offset} but the next segment "
                f"starts at {next_base_offset}"
            )

    def _recover_active(self, segment: Segment) -> None:
        scanner = segment.load(self._index_interval_bytes, verify_crc=True)
        if scanner.problem is None:
            return
        file_size = os.fstat(segment.fd).st_size
        self.recovered_truncated_bytes = file_size - scanner.position
        self.recovery_problem = f"{segment.path} at byte {scanner.position}: {scanner.problem}"
        os.ftruncate(segment.fd, scanner.position)
        os.fsync(segment.fd)

    # -- appending ---------------------------------------------------------------------------

    def append(
        self,
        base_offset: int,
        record_count: int,
        append_time_ms: int,
        batch: bytes,
        leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    ) -> None:
        """Store `batch` so that its first record has `base_offset` and its partition leader
        epoch is `leader_epoch`; a replay is a no-op.

        `batch` was verified whole (`records.verify_batch`, at the edge): recovery relies on its
        CRC-32C for all of it but its head, so a batch whose CRC does not hold would be cut off
        at the next start, with every frame after it.

        Raises StorageGapError if `base_offset` is past `next_offset`.
        """
        if record_count < 1 or not HEADER_BYTES <= len(batch) <= FRAME_BATCH_BYTES_MAX:
            raise ValueError(f"bad batch: {record_count} records, {len(batch)} bytes")
        self._check_open()
        if base_offset != self._next_offset:
            stored = with_base_offset(batch, base_offset, leader_epoch)
            wanted = StoredBatch(base_offset, record_count, append_time_ms, stored)
            if self._already_stored(wanted):
                return
        self._write(base_offset, record_count, append_time_ms, batch, leader_epoch)

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
        found = self._segment_for(wanted.base_offset).locate(wanted.base_offset).stored()
        if found == wanted:
            return True
        # Stored before leader epochs were stamped (epoch -1): the same batch all the same.
        unstamped = with_base_offset(wanted.batch, wanted.base_offset)
        if found == wanted._replace(batch=unstamped):
            return True
        self._truncate(wanted.base_offset)
        if self._next_offset != wanted.base_offset:
            raise StorageGapError(
                f"diverged batch at {wanted.base_offset} sits inside a stored batch; "
                f"the log now ends at {self._next_offset}"
            )
        return False

    def _write(
        self,
        base_offset: int,
        record_count: int,
        append_time_ms: int,
        batch: bytes,
        leader_epoch: int,
    ) -> None:
        """Append a frame of `batch` as stored (`with_base_offset`) at the log end."""
        assert base_offset == self._next_offset, "append must extend the log"
        parts = frame_parts(base_offset, record_count, append_time_ms, batch, leader_epoch)
        frame_size = FRAME_HEADER_BYTES + len(batch)
        segment = self._segments[-1]
        if segment.size and segment.size + frame_size > self._segment_bytes_max:
            segment = self._roll()
        pwrite(segment.fd, parts, segment.size)
        if self._fsync:
            os.fsync(segment.fd)
        segment.add_frame(  # only now: from here on, reads see the frame
            frame_size,
            base_offset,
            record_count,
            append_time_ms,
            self._index_interval_bytes,
            max_timestamp_ms=max_timestamp_of(batch),
        )
        self._next_offset = segment.next_offset
        self._size_bytes += frame_size

    def _roll(self) -> Segment:
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
            scanner = Scanner(
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
        """The base offset of the first stored batch appended at `time_ms` or later.

        The time is the log append time the leader stamped; None when no batch was appended
        that late. The time index narrows the scan to one index interval per segment it reaches.
        """
        self._check_open()
        for segment in self._segments:
            frame = segment.first_appended_at(time_ms)
            if frame is not None:
                return max(frame.base_offset, self._log_start_offset)
        return None

    def max_timestamp(self, log_start_offset: int) -> tuple[int, int]:
        """(the largest producer timestamp of the batches holding `log_start_offset` or later,
        the base offset of the first batch holding it), or (-1, -1) when none is stored
        (ListOffsets' max timestamp, KIP-734). The log start is the caller's (the state
        machine's: a store opens at its first segment's base). Each segment keeps its own;
        only one whose batch holding it is below the log start is scanned."""
        self._check_open()
        start = max(log_start_offset, self._log_start_offset)
        best = (-1, -1)
        for segment in self._segments:
            found = segment.max_timestamp_from(start)
            if found[0] > best[0]:
                best = found
        return best

    def _segment_for(self, offset: int) -> Segment:
        i = bisect.bisect_right(self._segments, offset, key=_base_offset_of) - 1
        assert i >= 0, f"offset {offset} precedes the first segment"
        return self._segments[i]

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
        cut = segment.locate(offset)
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
        count = segments_below(self._segments, offset)
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
        return retention_cutoff(
            self._segments, self._size_bytes, now_ms, retention_ms, retention_bytes
        )

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

    def _delete_files(self, doomed: list[Segment], *, sync: bool) -> None:
        """Unlink and close files, in the order given."""
        for segment in doomed:
            segment.path.unlink(missing_ok=True)
            segment.close()
        if doomed and sync:
            sync_directory(self.directory)

    # -- durability and closing --------------------------------------------------------------

    def sync(self) -> None:
        """Make every append so far durable.

        The active segment is fsynced (sealed ones were synced when rolled), and the
        directory, which names every segment.
        """
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
