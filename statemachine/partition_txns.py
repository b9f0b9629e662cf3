"""PartitionTxns: the transactions of one partition, as every replica applies them.

A transaction reaches a partition in three kinds of entry, all in the partition's own Raft log:

- `RegisterTxnPartition(producer id, epoch, txn sequence)`: the coordinator registers the
  partition in the transaction before it answers AddPartitionsToTxn (Redpanda's fence batch,
  Kafka's KIP-890 verification), so a transactional batch can never land outside a transaction
  the coordinator knows of: a transactional batch is accepted only while its producer has an
  open registration here in the batch's epoch;
- the transaction's data: transactional batches, checked against the producer table as any
  idempotent batch, then against the registration;
- `WriteTxnMarker(producer id, epoch, txn sequence, commit or abort, coordinator epoch)`: ends
  the registration; where the transaction wrote data here, a Kafka control batch (the marker)
  goes into the log at one offset, and an abort is listed in the aborted index.

The txn sequence numbers a producer id's transactions (the coordinator's count, never reused),
so every registration and marker names one transaction: a stale or delayed one, from an earlier
transaction, is refused, and a replay of the last marker is harmless (Jepsen's Bufstream
anomalies come from markers that named only a producer).

The last stable offset is the first offset of the oldest open transaction with data, else the
log end: from applied state only, so it never moves backwards (a new transaction's data starts
at the log end, at or past it). The aborted index lists only aborts of transactions that wrote
data here, ordered by their marker's offset, cut at the log start.

Bounds: `txn_producers_per_partition_max` producers with transactional state, and
`aborted_txns_per_partition_max` aborted transactions kept. A full table refuses a new
registration (THROTTLING_QUOTA_EXCEEDED: retriable, as the transactional-id registry's) rather
than forget an open transaction or an abort a read_committed reader needs.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from statemachine.codec import SnapshotError
from statemachine.errors import ErrorCode
from statemachine.limits import StateLimits
from statemachine.records import (
    CONTROL_BIT,
    CRC_COVERED_FROM,
    NO_SEQUENCE,
    TRANSACTIONAL_BIT,
    TXN_HEAD,
    Record,
    encode_records,
    seal_batch,
)

NO_OFFSET = -1
MARKER_ABORT, MARKER_COMMIT = 0, 1  # Kafka's ControlRecordType
_MARKER_KEY = struct.Struct(">hh")  # version 0, type
_MARKER_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch


def marker_batch(
    producer_id: int, epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytes:
    """Kafka's end-transaction marker: a control batch of one record (attributes transactional
    and control, base sequence -1), its key the version and type, its value the version and
    the coordinator epoch (Kafka's EndTransactionMarker)."""
    key = _MARKER_KEY.pack(0, MARKER_COMMIT if commit else MARKER_ABORT)
    record = Record(key, _MARKER_VALUE.pack(0, coordinator_epoch), timestamp_ms)
    fields = (TRANSACTIONAL_BIT | CONTROL_BIT, producer_id, epoch, NO_SEQUENCE, 1, timestamp_ms)
    return seal_batch(fields, timestamp_ms, b"".join(encode_records((record,), timestamp_ms)))


@dataclass(slots=True)
class OpenTxn:
    """A registered transaction of one producer; its data's offsets once it wrote any."""

    epoch: int
    txn_sequence: int
    first_offset: int = NO_OFFSET
    last_offset: int = NO_OFFSET


@dataclass(slots=True)
class TxnProducer:
    """One producer's transactional state here: its open transaction, if any, and the last
    transaction it registered or ended (what a later registration or marker must follow)."""

    last_epoch: int
    last_txn_sequence: int
    last_update_ms: int
    open: OpenTxn | None = None
    coordinator_epoch: int = -1  # of the last marker: an older coordinator's is fenced
    committed: bool | None = None  # how the last transaction ended (None: it is open)


class AbortedTxn(NamedTuple):
    """An aborted transaction's data here: Fetch's `aborted_transactions` entry."""

    producer_id: int
    first_offset: int
    last_offset: int  # its abort marker's offset


def aborted_by(data: bytes | memoryview, base_offset: int, aborted: Iterable[AbortedTxn]) -> bool:
    """Whether a read_committed reader drops the stored batch `data` at `base_offset`: a
    marker, or a transactional batch of a producer whose aborted transaction spans it (Kafka's
    consumers decide so from Fetch's `aborted_transactions`; the native listener, for its
    clients)."""
    attributes, producer_id = TXN_HEAD.unpack_from(data, CRC_COVERED_FROM)
    if attributes & CONTROL_BIT:
        return True
    if not attributes & TRANSACTIONAL_BIT:
        return False
    return any(
        a.producer_id == producer_id and a.first_offset <= base_offset <= a.last_offset
        for a in aborted
    )


class PartitionTxns:
    """Producer id -> TxnProducer, the aborted index and the last stable offset's hold."""

    __slots__ = (
        "_aborted",
        "_aborted_max",
        "_hold",
        "_producers_max",
        "producers",
    )

    @classmethod
    def bounded_by(cls, limits: StateLimits) -> PartitionTxns:
        """An empty table with the bounds `limits` sets (every partition's, offsets' too)."""
        return cls(limits.txn_producers_per_partition_max, limits.aborted_txns_per_partition_max)

    def __init__(self, producers_max: int, aborted_max: int) -> None:
        assert producers_max > 0
        assert aborted_max > 0
        self._producers_max = producers_max
        self._aborted_max = aborted_max
        self.producers: dict[int, TxnProducer] = {}
        self._aborted: list[AbortedTxn] = []  # in marker order: ascending last_offset
        self._hold: int | None = None  # the oldest open transaction's first offset

    def __bool__(self) -> bool:
        return bool(self.producers)

    # -- the rules ---------------------------------------------------------------------------

    def register(self, producer_id: int, epoch: int, txn_sequence: int, now_ms: int) -> ErrorCode:
        """Open `txn_sequence` here (NONE), or say why not; a replay of the open one is NONE."""
        entry = self.producers.get(producer_id)
        if entry is not None:
            if epoch < entry.last_epoch:
                return ErrorCode.INVALID_PRODUCER_EPOCH
            txn = entry.open
            if txn is not None:
                if (txn.epoch, txn.txn_sequence) != (epoch, txn_sequence):
                    return ErrorCode.INVALID_TXN_STATE  # another one is open: end it first
                entry.last_update_ms = now_ms
                return ErrorCode.NONE
            if txn_sequence <= entry.last_txn_sequence:
                return ErrorCode.INVALID_TXN_STATE  # a transaction that ended here already
        elif len(self.producers) >= self._producers_max:
            return ErrorCode.THROTTLING_QUOTA_EXCEEDED
        if len(self._aborted) + self._open_count() >= self._aborted_max:
            # Every open transaction may yet abort: the index stays within its bound (and a
            # snapshot within what restore accepts) whatever they do. Until retention cuts it.
            return ErrorCode.THROTTLING_QUOTA_EXCEEDED
        if entry is None:
            entry = self.producers[producer_id] = TxnProducer(epoch, txn_sequence, now_ms)
        entry.last_epoch, entry.last_txn_sequence, entry.last_update_ms = (
            epoch,
            txn_sequence,
            now_ms,
        )
        entry.open, entry.committed = OpenTxn(epoch, txn_sequence), None
        return ErrorCode.NONE

    def check_data(self, producer_id: int, epoch: int) -> ErrorCode:
        """Whether a transactional batch of this producer and epoch may be appended."""
        entry = self.producers.get(producer_id)
        txn = None if entry is None else entry.open
        if txn is None:
            stale = entry is not None and epoch < entry.last_epoch
            return ErrorCode.INVALID_PRODUCER_EPOCH if stale else ErrorCode.INVALID_TXN_STATE
        if epoch < txn.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return ErrorCode.NONE if epoch == txn.epoch else ErrorCode.INVALID_TXN_STATE

    def in_transaction(self, producer_id: int) -> bool:
        """Whether this producer has a transaction open here (its plain batches are refused)."""
        entry = self.producers.get(producer_id)
        return entry is not None and entry.open is not None

    def appended(self, producer_id: int, base_offset: int, last_offset: int, now_ms: int) -> None:
        """A batch `check_data` accepted now holds these offsets."""
        entry = self.producers[producer_id]
        txn = entry.open
        assert txn is not None, "appended() of a batch outside a transaction"
        if txn.first_offset == NO_OFFSET:
            txn.first_offset = base_offset
            if self._hold is None:
                self._hold = base_offset
        txn.last_offset = last_offset
        entry.last_update_ms = now_ms

    def check_end(
        self, producer_id: int, epoch: int, txn_sequence: int, commit: bool, coordinator_epoch: int
    ) -> bool | ErrorCode:
        """Whether a marker for this transaction writes a control batch here (True: the
        transaction wrote data here; False: it ends a registration without data, a
        transaction never registered here, or nothing, as a replay), or why it is refused."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return False  # never registered here: nothing to end
        if coordinator_epoch < entry.coordinator_epoch:
            return ErrorCode.TRANSACTION_COORDINATOR_FENCED
        if epoch < entry.last_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        txn = entry.open
        if txn is not None and txn.txn_sequence == txn_sequence:
            return txn.first_offset != NO_OFFSET
        if txn is None and txn_sequence > entry.last_txn_sequence:
            # Its registration never applied here (yet): nothing to end, but it is recorded,
            # so that a registration arriving late is refused as stale.
            return False
        if txn is None and txn_sequence == entry.last_txn_sequence and entry.committed is commit:
            return False  # a replay
        return ErrorCode.INVALID_TXN_STATE

    def end(
        self,
        producer_id: int,
        txn_sequence: int,
        marker: tuple[int, bool, int],
        marker_offset: int,
        now_ms: int,
    ) -> None:
        """Carry out what `check_end` allowed: `marker` is (epoch, commit, coordinator epoch),
        `marker_offset` the control batch's offset (NO_OFFSET: none written)."""
        epoch, commit, coordinator_epoch = marker
        entry = self.producers.get(producer_id)
        if entry is None:
            if len(self.producers) >= self._producers_max:
                return  # nothing to end, nor room to remember it
            entry = self.producers[producer_id] = TxnProducer(epoch, txn_sequence, now_ms)
        txn = entry.open
        entry.last_update_ms = now_ms
        entry.last_epoch = max(entry.last_epoch, epoch)
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        if txn is None:
            if txn_sequence > entry.last_txn_sequence or entry.committed is None:
                entry.last_txn_sequence, entry.committed = txn_sequence, commit
            return  # a replay, or a transaction that never opened here
        entry.open, entry.committed = None, commit
        if txn.first_offset == NO_OFFSET:
            return
        assert marker_offset > txn.last_offset, "a marker before its transaction's data"
        if not commit:
            self._aborted.append(AbortedTxn(producer_id, txn.first_offset, marker_offset))
        if self._hold == txn.first_offset:
            self._hold = self._oldest_open()

    def _open_count(self) -> int:
        return sum(1 for e in self.producers.values() if e.open is not None)

    def fenced_epoch(self, producer_id: int) -> int:
        """The epoch below which this producer's batches are fenced here (-1: none known): its
        last registration's or marker's, as a marker raises a Kafka producer's epoch."""
        entry = self.producers.get(producer_id)
        return -1 if entry is None else entry.last_epoch

    def _oldest_open(self) -> int | None:
        firsts = [
            e.open.first_offset
            for e in self.producers.values()
            if e.open is not None and e.open.first_offset != NO_OFFSET
        ]
        return min(firsts, default=None)

    # -- what readers see --------------------------------------------------------------------

    def last_stable_offset(self, log_end_offset: int) -> int:
        """Where read_committed readers stop: the oldest open transaction's first offset."""
        return log_end_offset if self._hold is None else self._hold

    def aborted_between(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The aborted transactions with data in [start_offset, end_offset): those a reader of
        that range must drop, in marker order (Kafka's `collectAbortedTransactions`)."""
        first = bisect_left(self._aborted, start_offset, key=_marker_offset)
        return [a for a in self._aborted[first:] if a.first_offset < end_offset]

    def open_txns(self) -> list[tuple[int, OpenTxn]]:
        """(producer id, open transaction), ascending producer id (DescribeProducers)."""
        return [(pid, e.open) for pid, e in sorted(self.producers.items()) if e.open is not None]

    # -- housekeeping ------------------------------------------------------------------------

    def start_moved(self, log_start_offset: int) -> None:
        """Aborts wholly below the new log start are no reader's business any more."""
        cut = bisect_left(self._aborted, log_start_offset, key=_marker_offset)
        del self._aborted[:cut]

    def expiry_due(self, now_ms: int, expiration_ms: int) -> bool:
        return any(self._idle(now_ms, expiration_ms))

    def expire(self, now_ms: int, expiration_ms: int) -> None:
        """Forget producers idle that long with no transaction open (an open one is ended by
        its coordinator, at its timeout, never forgotten here)."""
        for pid in list(self._idle(now_ms, expiration_ms)):
            del self.producers[pid]

    def _idle(self, now_ms: int, expiration_ms: int) -> list[int]:
        return [
            pid
            for pid, e in self.producers.items()
            if e.open is None and now_ms - e.last_update_ms >= expiration_ms
        ]

    # -- snapshots: plain, canonical data --------------------------------------------------

    def to_data(self) -> list[object]:
        producers = [
            [
                pid,
                e.last_epoch,
                e.last_txn_sequence,
                e.last_update_ms,
                e.coordinator_epoch,
                -1 if e.committed is None else int(e.committed),
                [] if e.open is None else [e.open.epoch, e.open.txn_sequence,
                                           e.open.first_offset, e.open.last_offset],
            ]
            for pid, e in sorted(self.producers.items())
        ]  # fmt: skip
        return [producers, [list(a) for a in self._aborted]]

    @classmethod
    def from_data(cls, data: object, limits: StateLimits) -> PartitionTxns:
        txns = cls.bounded_by(limits)
        producers_max, aborted_max = txns._producers_max, txns._aborted_max
        if not (isinstance(data, tuple) and len(data) == 2):
            raise SnapshotError("partition transactions: expected [producers, aborted]")
        producers: Any = data[0]
        aborted: Any = data[1]
        try:
            if len(producers) > producers_max or len(aborted) > aborted_max:
                raise SnapshotError("partition transactions: more than the limits allow")
            for pid, epoch, sequence, update_ms, coordinator_epoch, committed, txn in producers:
                entry = TxnProducer(epoch, sequence, update_ms, None, coordinator_epoch)
                entry.committed = None if committed < 0 else bool(committed)
                if txn:
                    entry.open = OpenTxn(*txn)
                txns.producers[int(pid)] = entry
            for pid, first, last in aborted:
                txns._aborted.append(AbortedTxn(int(pid), int(first), int(last)))
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"partition transactions: {exc}") from exc
        if txns._aborted != sorted(txns._aborted, key=_marker_offset):
            raise SnapshotError("partition transactions: aborts out of marker order")
        txns._hold = txns._oldest_open()
        return txns


def _marker_offset(aborted: AbortedTxn) -> int:
    return aborted.last_offset
