"""Sink fences: what stops a replayed micro-batch of a streaming sink from writing twice.

A streaming sink (Spark's, in `pipeline/`) writes micro-batch `batch_id` from each of its
writers (a Spark task, numbered) in parts: part 0, 1, ... of that writer's records for this
partition, one entry each, in order, each awaited before the next. Every part carries its fence
`(sink, writer, batch_id, part)`. A partition remembers, per `(sink, writer)`, the last
`(batch_id, part)` it appended; a part at or below it is a replay (Spark re-runs a batch after a
crash, or the sink retries a part whose answer was lost) and is a committed no-op. Because a
part's fence and its records are one Raft entry, no crash can separate "appended" from
"remembered".

Rules:
- Order is lexicographic on `(batch_id, part)`; a writer's parts for one partition arrive in
  that order (the sink awaits each), so a later one never overtakes an earlier one.
- The table is bounded (`StateLimits.sink_writers_per_partition_max`): a new writer of a full
  table is refused with THROTTLING_QUOTA_EXCEEDED (unlike the producer table, which evicts: a
  forgotten fence would let a replayed part in again).
  A writer idle for the producer-expiration interval is forgotten with the producers.
- Pure and deterministic, like every module of `statemachine/`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from statemachine.codec import SnapshotError
from statemachine.errors import ErrorCode


class SinkFence(NamedTuple):
    """Where a writer of a sink got to in one partition."""

    batch_id: int
    part: int
    last_update_ms: int


class SinkFenceTable:
    """(sink, writer) -> SinkFence for one partition."""

    __slots__ = ("_capacity", "_fences")

    def __init__(self, capacity: int) -> None:
        assert capacity > 0
        self._capacity = capacity
        self._fences: dict[tuple[str, int], SinkFence] = {}

    def __len__(self) -> int:
        return len(self._fences)

    def __iter__(self) -> Iterator[tuple[tuple[str, int], SinkFence]]:
        """((sink, writer), fence) in ascending key order: the canonical order."""
        for key in sorted(self._fences):
            yield key, self._fences[key]

    def get(self, sink: str, writer: int) -> SinkFence | None:
        return self._fences.get((sink, writer))

    def check(self, sink: str, writer: int, batch_id: int, part: int) -> ErrorCode | bool:
        """True: a replay, already appended. False: new. An ErrorCode: refused."""
        fence = self._fences.get((sink, writer))
        if fence is None:
            full = len(self._fences) >= self._capacity
            return ErrorCode.THROTTLING_QUOTA_EXCEEDED if full else False
        return (batch_id, part) <= (fence.batch_id, fence.part)

    def record(self, sink: str, writer: int, batch_id: int, part: int, now_ms: int) -> None:
        """Remember a part that `check` called new and that is now appended."""
        key = (sink, writer)
        old = self._fences.get(key)
        assert old is None or (batch_id, part) > (old.batch_id, old.part), "fence moved back"
        assert old is not None or len(self._fences) < self._capacity, "fence table overfull"
        self._fences[key] = SinkFence(batch_id, part, now_ms)

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget writers idle for `expiration_ms` or longer; how many were forgotten."""
        idle = [k for k, f in self._fences.items() if now_ms - f.last_update_ms >= expiration_ms]
        for key in idle:
            del self._fences[key]
        return len(idle)

    def expiry_due(self, now_ms: int, expiration_ms: int) -> bool:
        return any(now_ms - f.last_update_ms >= expiration_ms for f in self._fences.values())

    # -- snapshots: plain, canonical data ---------------------------------------------------------

    def to_data(self) -> list[list[object]]:
        return [[sink, writer, *fence] for (sink, writer), fence in self]

    @classmethod
    def from_data(cls, data: object, capacity: int) -> SinkFenceTable:
        table = cls(capacity)
        if not isinstance(data, tuple) or len(data) > capacity:
            raise SnapshotError("sink fences: expected at most `capacity` entries")
        for item in data:
            if not (
                isinstance(item, tuple)
                and len(item) == 5
                and isinstance(item[0], str)
                and all(type(v) is int and v >= 0 for v in item[1:])
            ):
                raise SnapshotError(f"sink fences: malformed entry {item!r}")
            sink, writer, batch_id, part, last_update_ms = item
            table._fences[(sink, writer)] = SinkFence(batch_id, part, last_update_ms)
        return table
