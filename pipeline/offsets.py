"""Offsets as Spark checkpoints them, offset ranges, admission control and range splitting.

Role: the pure arithmetic of the reader (no PySpark, no network), so it is tested on its own.

Rules:
- A streaming offset is a plain JSON dict `{"topic": {"0": 23, "1": 7}}`: the next offset to
  read per partition. Topics and partitions are written in sorted order, so the same positions
  always serialise to the same string (Spark compares offsets as JSON).
- An `OffsetRange` is half-open, `[start, end)`. `start == EARLIEST` means "from the log start"
  (a partition discovered after the query started, as in the Kafka connector).
- Admission control never admits more than `maxOffsetsPerTrigger` records: the budget is shared
  in proportion to each partition's backlog, and the remainder goes to the largest fractions,
  so a micro-batch's size is exactly `min(max, backlog)`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.options import EARLIEST, TopicPartition

Offsets = dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # EARLIEST: from the log start of a newly discovered partition
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - max(self.start, 0))


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Spark's checkpoint form, in a canonical order."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = offset
    return result


def from_json(value: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {
        (topic, int(partition)): int(offset)
        for topic, per_partition in value.items()
        for partition, offset in per_partition.items()
    }


def backlog(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]) -> int:
    return sum(max(0, end - start.get(tp, end)) for tp, end in latest.items())


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_records: int
) -> Offsets:
    """End offsets admitting at most `max_records` records in total beyond `start`."""
    sizes = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(sizes.values())
    if total <= max_records:
        return dict(latest)
    shares = {tp: max_records * size / total for tp, size in sizes.items()}
    grant = {tp: math.floor(share) for tp, share in shares.items()}
    spare = max_records - sum(grant.values())
    # Largest remainder first, ties in partition order: deterministic for a replayed batch.
    by_fraction = sorted(shares, key=lambda tp: (grant[tp] - shares[tp], tp))
    for tp in by_fraction[:spare]:
        grant[tp] += 1
    return {tp: start.get(tp, end) + min(grant[tp], sizes[tp]) for tp, end in latest.items()}


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Non-empty ranges; with `min_partitions`, big ranges are cut so there are at least that
    many Spark partitions (as the Kafka connector's minPartitions), in proportion to size."""
    kept = [r for r in ranges if r.start == EARLIEST or r.size > 0]
    if not min_partitions or len(kept) >= min_partitions:
        return kept
    total = sum(r.size for r in kept)
    if total == 0:
        return kept
    result: list[OffsetRange] = []
    for r in kept:
        pieces = min(r.size, math.ceil(r.size * min_partitions / total))
        result.extend(_cut(r, pieces) if r.start != EARLIEST else [r])
    return result


def _cut(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    if pieces <= 1:
        return [r]
    bounds = [r.start + r.size * i // pieces for i in range(pieces + 1)]
    return [OffsetRange(r.topic, r.partition, lo, hi) for lo, hi in itertools.pairwise(bounds)]
