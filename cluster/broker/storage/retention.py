"""Retention: which whole segments a partition's log may lose, by Kafka's rules.

Role: pure decisions over a store's segments, no I/O. The leader asks which prefix of sealed
segments is out of retention (`retention_cutoff`, behind `PartitionStore.segments_for_retention`)
and proposes a new log start; each replica's store then deletes the whole segments below it
(`segments_below`, behind `PartitionStore.delete_before`), which unlinks the files.

Rules (as Kafka's): a segment is out when its newest batch is older than `retention_ms`, or
when the log without it still holds `retention_bytes`; only whole segments go, oldest first,
and never the active one, even when all its records are below the new log start.
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.broker.storage.segments import Segment


def retention_cutoff(
    segments: Sequence[Segment],
    size_bytes: int,
    now_ms: int,
    retention_ms: int | None,
    retention_bytes: int | None,
) -> int | None:
    """The offset below which whole segments are out of retention, or None if none are.

    `segments` is the whole log, oldest first, and `size_bytes` their size. Only a prefix of
    the sealed ones counts. None or a negative limit means no limit.
    """
    excess = -1
    if retention_bytes is not None and retention_bytes >= 0:
        excess = size_bytes - retention_bytes
    cutoff: int | None = None
    for segment in segments[:-1]:  # the sealed ones
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


def segments_below(segments: Sequence[Segment], offset: int) -> int:
    """How many segments, oldest first, hold only records below `offset`; never the active one."""
    count = 0
    while count < len(segments) - 1 and segments[count].next_offset <= offset:
        count += 1
    return count
