"""The per-partition producer table: the rules of docs/semantics.md, "Batch validation", in order.

For each producer id the table keeps its epoch, the time of its last batch (leader-stamped) and
a window with the metadata of its last five appended batches. `check` decides what a batch is
(accept, duplicate of a retained batch, or a rejection); `record` stores an accepted batch once
the partition has given it offsets. Both run inside apply on every replica, in log order, so
every replica, and so every future leader, holds the same windows.

The table is bounded (`producers_per_partition_max`): a new producer that finds it full evicts
the least recently used one, the producer whose last batch has the smallest stamped time, the
smaller producer id first among equal times (docs/semantics.md, "Limits"). That order is a
function of the entries alone, so a restored snapshot evicts exactly as the replay it replaces.
A heap of (last_timestamp_ms, producer id) finds the victim in O(log n): a pair is pushed when
a producer's time changes and left in place when it goes stale (the producer moved on, expired
or was evicted); stale pairs are skipped when popped and dropped by rebuilding the heap once
they outnumber the live ones. Group time never runs backwards, so a pushed pair is seldom smaller
than its parent: a push usually costs one comparison. The heap exists only while it is needed:
it is built (O(n)) when the table first has to evict, and dropped when expiry makes room, so a
table that never fills pays nothing for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import NamedTuple

from statemachine.codec import SnapshotError
from statemachine.errors import ErrorCode
from statemachine.limits import WINDOW_BATCHES
from statemachine.records import SEQUENCE_MODULUS, BatchHeader, next_sequence


class BatchMetadata(NamedTuple):
    """What the window remembers of one appended batch."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass(slots=True)
class ProducerEntry:
    """The state of one producer id in one partition."""

    epoch: int
    last_timestamp_ms: int
    window: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=WINDOW_BATCHES))

    @property
    def last_sequence(self) -> int:
        return self.window[-1].last_seq


_new_meta = tuple.__new__  # BatchMetadata's own __new__ is a Python function: skip its frame

# What `check` decides: None to accept, the retained batch for a duplicate, or a rejection.
Verdict = BatchMetadata | ErrorCode | None

# Stale heap entries tolerated beyond twice the live ones before a rebuild (keeps rebuilds rare
# in a small table; amortised, a rebuild costs O(1) per push).
_STALE_SLACK = 64


class ProducerTable:
    """Producer id -> ProducerEntry, with the validation of docs/semantics.md."""

    __slots__ = ("_capacity", "_entries", "_recency")

    def __init__(self, capacity: int) -> None:
        assert capacity > 0
        self._capacity = capacity
        self._entries: dict[int, ProducerEntry] = {}
        # A min-heap of (last_timestamp_ms, producer id), or None until the table must evict:
        # every entry's current pair is in it, and so are stale pairs (see the module docstring).
        self._recency: list[tuple[int, int]] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple[int, ProducerEntry]]:
        """(producer id, entry) in ascending producer id order."""
        for pid in sorted(self._entries):
            yield pid, self._entries[pid]

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def check(self, batch: BatchHeader) -> Verdict:
        """Classify an idempotent batch against the stored state, changing nothing."""
        entry = self._entries.get(batch.producer_id)
        if entry is None:  # rule 1: unknown (new, expired or evicted) producer, any sequence
            return None
        first, last = batch.base_sequence, batch.last_sequence
        if batch.producer_epoch == entry.epoch:  # rule 2: an exact retained batch
            for retained in entry.window:
                if retained.first_seq == first and retained.last_seq == last:
                    return retained
        if batch.producer_epoch < entry.epoch:  # rule 3: fenced
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if batch.producer_epoch > entry.epoch:  # rule 4: a new epoch starts at 0
            return None if first == 0 else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        if first != next_sequence(entry.last_sequence):  # rule 5: contiguous, with the wrap
            return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        return None

    def record(
        self, batch: BatchHeader, base_offset: int, timestamp_ms: int, keep: Container[int] = ()
    ) -> None:
        """Store a batch that `check` accepted and that now holds the given offsets.

        A new producer that finds the table full first evicts the least recently used one that
        is not in `keep` (producers with a transaction open: their retries must stay
        deduplicated inside it).
        """
        producer_id = batch.producer_id
        entry = self._entries.get(producer_id)
        previous_ms = None if entry is None else entry.last_timestamp_ms
        if entry is None and len(self._entries) >= self._capacity:
            self._evict_least_recently_used(keep)
        if entry is None or batch.producer_epoch > entry.epoch:
            entry = ProducerEntry(batch.producer_epoch, timestamp_ms)
            self._entries[producer_id] = entry
        assert batch.producer_epoch == entry.epoch, "record() of a batch check() rejected"
        last_offset = base_offset + batch.record_count - 1
        meta = BatchMetadata(
            batch.base_sequence, batch.last_sequence, base_offset, last_offset, timestamp_ms
        )
        entry.window.append(meta)
        entry.last_timestamp_ms = timestamp_ms
        if timestamp_ms != previous_ms and self._recency is not None:
            self._touched(producer_id, timestamp_ms)

    def admit(
        self, batch: BatchHeader, base_offset: int, timestamp_ms: int, keep: Container[int] = ()
    ) -> Verdict:
        """`check`, then `record` if it accepts: one lookup, one pass over the header.

        The common case first: the next batch of a known producer in its epoch. It cannot also
        be a retained batch, as a window is a contiguous run of at most WINDOW_BATCHES batches of
        at most `batch_records_max` records, far short of wrapping the 2^31 sequence space.
        """
        producer_id, epoch, first, count = batch[1], batch[2], batch[3], batch[4]
        last = (first + count - 1) % SEQUENCE_MODULUS
        entry = self._entries.get(producer_id)
        if entry is not None and epoch == entry.epoch:
            window = entry.window
            if first == (window[-1].last_seq + 1) % SEQUENCE_MODULUS:
                window.append(
                    _new_meta(
                        BatchMetadata,
                        (first, last, base_offset, base_offset + count - 1, timestamp_ms),
                    )
                )
                if entry.last_timestamp_ms != timestamp_ms:
                    entry.last_timestamp_ms = timestamp_ms
                    if self._recency is not None:
                        self._touched(producer_id, timestamp_ms)
                return None
        verdict = self.check(batch)
        if verdict is None:
            self.record(batch, base_offset, timestamp_ms, keep)
        return verdict

    def _touched(self, producer_id: int, timestamp_ms: int) -> None:
        """Record a producer's new last time; rebuild the heap once stale pairs dominate."""
        recency = self._recency
        assert recency is not None
        heappush(recency, (timestamp_ms, producer_id))
        if len(recency) > 2 * len(self._entries) + _STALE_SLACK:
            self._rebuild_recency()

    def _stale(self, pair: tuple[int, int]) -> bool:
        entry = self._entries.get(pair[1])
        return entry is None or entry.last_timestamp_ms != pair[0]

    def _evict_least_recently_used(self, keep: Container[int]) -> None:
        if self._recency is None:
            self._rebuild_recency()
        recency = self._recency
        assert recency is not None
        kept: list[tuple[int, int]] = []
        while recency and (self._stale(recency[0]) or recency[0][1] in keep):
            pair = heappop(recency)
            if not self._stale(pair):
                kept.append(pair)
        # Every live producer kept (a table smaller than the transaction table, which the
        # defaults rule out): the least recently used of them goes after all.
        _, victim = heappop(recency) if recency else kept.pop(0)
        del self._entries[victim]
        for pair in kept:
            heappush(recency, pair)

    def _rebuild_recency(self) -> None:
        self._recency = [(e.last_timestamp_ms, pid) for pid, e in self._entries.items()]
        heapify(self._recency)

    def _idle(self, now_ms: int, expiration_ms: int, keep: Container[int]) -> Iterator[int]:
        for pid, entry in self._entries.items():
            if now_ms - entry.last_timestamp_ms >= expiration_ms and pid not in keep:
                yield pid

    def expiry_due(self, now_ms: int, expiration_ms: int, keep: Container[int] = ()) -> bool:
        """Whether `expire` would remove anyone (lets a leader skip a no-op entry)."""
        return next(self._idle(now_ms, expiration_ms, keep), None) is not None

    def expire(self, now_ms: int, expiration_ms: int, keep: Container[int] = ()) -> tuple[int, ...]:
        """Remove producers idle for `expiration_ms` or longer, but those in `keep` (producers
        with a transaction open, as Kafka keeps them); returns their ids, ascending."""
        expired = sorted(self._idle(now_ms, expiration_ms, keep))
        for pid in expired:
            del self._entries[pid]
        if expired:
            self._recency = None  # there is room now: no heap until the table is full again
        return tuple(expired)

    # -- snapshots: plain, canonical data (ascending producer id) ---------------------------------

    def to_data(self) -> list[list[object]]:
        return [[pid, e.epoch, e.last_timestamp_ms, [list(m) for m in e.window]] for pid, e in self]

    @classmethod
    def from_data(cls, data: object, capacity: int) -> ProducerTable:
        table = cls(capacity)
        if not isinstance(data, tuple) or len(data) > capacity:
            raise SnapshotError("producer table: expected at most `capacity` entries")
        try:
            for pid, epoch, last_timestamp_ms, window in data:
                if not 1 <= len(window) <= WINDOW_BATCHES:
                    raise SnapshotError(f"producer {pid}: a window holds 1 to 5 batches")
                entry = ProducerEntry(epoch, last_timestamp_ms)
                entry.window.extend(BatchMetadata(*m) for m in window)
                table._entries[pid] = entry
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"producer table: {exc}") from exc
        return table
