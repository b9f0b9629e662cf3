"""transactional.id -> (producer id, epoch): InitProducerId with fencing, and expiry.

Follows Kafka's TransactionCoordinator (KIP-98, KIP-360): a new transactional id gets a fresh
producer id at epoch 0; each later InitProducerId bumps the epoch, which fences the previous
instance; a caller that passes its expected (pid, epoch) gets a bump when that is the current
pair, the current pair unchanged when it is the previous one (a retry of a call that
succeeded), and PRODUCER_FENCED otherwise. At epoch 32766 the id rotates to a new producer id
at epoch 0. Mappings not updated within the expiration interval are removed, measured in
leader-stamped time. raftbroker has no open transactions, so no mapping is ever pinned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from statemachine.codec import SnapshotError
from statemachine.commands import InitTransactionalProducer
from statemachine.errors import ErrorCode
from statemachine.pid_allocator import PidAllocator
from statemachine.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID

# Kafka's TransactionMetadata.isEpochExhausted: rotate before the 16-bit epoch runs out.
EPOCH_ROTATION_THRESHOLD = 32_766


class ProducerIdAndEpoch(NamedTuple):
    producer_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class TxnEntry:
    """One transactional id's producer; `last_epoch` and `previous_producer_id` detect retries."""

    producer_id: int
    epoch: int
    last_epoch: int
    previous_producer_id: int
    transaction_timeout_ms: int
    last_update_ms: int

    @property
    def current(self) -> ProducerIdAndEpoch:
        return ProducerIdAndEpoch(self.producer_id, self.epoch)


class TxnRegistry:
    """The transactional ids of the cluster, bounded in number."""

    __slots__ = ("_capacity", "_entries")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: dict[str, TxnEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, transactional_id: str) -> TxnEntry | None:
        return self._entries.get(transactional_id)

    def init_producer(
        self, cmd: InitTransactionalProducer, now_ms: int, allocator: PidAllocator
    ) -> ProducerIdAndEpoch | ErrorCode:
        """Validated InitProducerId (the caller checked id and timeout); returns the pair."""
        expected = ProducerIdAndEpoch(cmd.expected_producer_id, cmd.expected_epoch)
        if (expected.producer_id == NO_PRODUCER_ID) != (expected.epoch == NO_PRODUCER_EPOCH):
            return ErrorCode.INVALID_REQUEST
        has_expected = expected.producer_id != NO_PRODUCER_ID
        entry = self._entries.get(cmd.transactional_id)
        if entry is None:
            if len(self._entries) >= self._capacity:
                return ErrorCode.THROTTLING_QUOTA_EXCEEDED
            return self._fresh(cmd, now_ms, allocator, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        touched = replace(
            entry, transaction_timeout_ms=cmd.transaction_timeout_ms, last_update_ms=now_ms
        )
        if has_expected and _is_retry(entry, expected):
            self._entries[cmd.transactional_id] = touched
            return entry.current
        if has_expected and expected != entry.current:
            return ErrorCode.PRODUCER_FENCED
        if entry.epoch >= EPOCH_ROTATION_THRESHOLD:
            return self._fresh(cmd, now_ms, allocator, entry.producer_id, entry.epoch)
        bumped = replace(touched, epoch=entry.epoch + 1, last_epoch=entry.epoch)
        self._entries[cmd.transactional_id] = bumped
        return bumped.current

    def _fresh(
        self,
        cmd: InitTransactionalProducer,
        now_ms: int,
        allocator: PidAllocator,
        previous_producer_id: int,
        last_epoch: int,
    ) -> ProducerIdAndEpoch | ErrorCode:
        producer_id = allocator.allocate_one()
        if isinstance(producer_id, ErrorCode):
            return producer_id
        entry = TxnEntry(
            producer_id, 0, last_epoch, previous_producer_id, cmd.transaction_timeout_ms, now_ms
        )
        self._entries[cmd.transactional_id] = entry
        return entry.current

    def _idle(self, now_ms: int, expiration_ms: int) -> Iterator[str]:
        for txn_id, entry in self._entries.items():
            if now_ms - entry.last_update_ms >= expiration_ms:
                yield txn_id

    def expiry_due(self, now_ms: int, expiration_ms: int) -> bool:
        """Whether `expire` would remove anything (lets a leader skip a no-op entry)."""
        return next(self._idle(now_ms, expiration_ms), None) is not None

    def expire(self, now_ms: int, expiration_ms: int) -> tuple[str, ...]:
        """Remove ids not updated for `expiration_ms` or longer; returns them, sorted."""
        expired = sorted(self._idle(now_ms, expiration_ms))
        for txn_id in expired:
            del self._entries[txn_id]
        return tuple(expired)

    def to_data(self) -> list[list[object]]:
        return [
            [
                txn_id,
                e.producer_id,
                e.epoch,
                e.last_epoch,
                e.previous_producer_id,
                e.transaction_timeout_ms,
                e.last_update_ms,
            ]
            for txn_id, e in sorted(self._entries.items())
        ]

    @classmethod
    def from_data(cls, data: object, capacity: int) -> TxnRegistry:
        registry = cls(capacity)
        if not isinstance(data, tuple) or len(data) > capacity:
            raise SnapshotError("transactional ids: expected at most `capacity` entries")
        try:
            for txn_id, *fields in data:
                registry._entries[txn_id] = TxnEntry(*fields)
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"transactional ids: {exc}") from exc
        return registry


def _is_retry(entry: TxnEntry, expected: ProducerIdAndEpoch) -> bool:
    """The caller holds the pair this entry had before its last InitProducerId."""
    if entry.last_epoch == NO_PRODUCER_EPOCH or expected.epoch != entry.last_epoch:
        return False
    if entry.epoch == 0 and entry.previous_producer_id != NO_PRODUCER_ID:  # just rotated
        return expected.producer_id == entry.previous_producer_id
    return expected.producer_id == entry.producer_id
