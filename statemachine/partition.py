"""PartitionStateMachine: what every replica of one topic-partition applies, entry by entry.

`apply(entry) -> result` is deterministic and does no I/O. An accepted batch comes back as an
`Appended` effect (the exact bytes to append and the base offset they get), which the storage
layer carries out; duplicates and rejections are committed no-ops whose result goes back to the
client. The state is small: offsets, the logical clock, the producer table, the sink fences
(statemachine/sink_fences.py), the leader epochs and the transactions
(statemachine/partition_txns.py: registrations, markers, the last stable offset and the
aborted index); records live in storage, never here.

A malformed entry is answered with a rejection rather than a crash: every replica sees the same
bytes and rejects them alike, whereas an assert would turn one bad entry into a crash loop of
the whole group. Broken invariants of our own state remain asserts.
"""

from __future__ import annotations

from typing import NamedTuple

from statemachine.codec import (
    SnapshotError,
    expect_int,
    pack,
    unpack_versioned_snapshot,
)
from statemachine.commands import (
    AdvanceLogStart,
    AppendBatch,
    AppendFencedBatch,
    CommandDecodeError,
    ExpireProducers,
    Noop,
    RegisterTxnPartition,
    WriteTxnMarker,
    decode_fields,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.leader_epochs import LeaderEpochs
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.partition_txns import NO_OFFSET, PartitionTxns, marker_batch
from statemachine.producer_state import BatchMetadata, ProducerTable, Verdict
from statemachine.records import (
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    TRANSACTIONAL_BIT,
    BatchFormatError,
    BatchHeader,
    read_header,
)
from statemachine.sink_fences import SinkFenceTable

SNAPSHOT_VERSION = 4  # 2 added the sink fences, 3 the leader epochs, 4 the transactions
_new_result = tuple.__new__  # a NamedTuple's own __new__ is a Python function: skip its frame


class Appended(NamedTuple):
    """A new batch: storage must append `batch` so that its first record has `base_offset`."""

    base_offset: int
    last_offset: int
    append_time_ms: int
    batch: bytes
    leader_epoch: int = -1  # the term of its entry, which storage writes into the batch


class Duplicate(NamedTuple):
    """A retry of a retained batch: nothing appended; these are the original offsets.

    A sink part its fence turned away was appended by an earlier run whose offsets the fence
    does not keep: offsets -1, and the time of that earlier append.
    """

    base_offset: int
    last_offset: int
    append_time_ms: int


class ProducersExpired(NamedTuple):
    producer_ids: tuple[int, ...]


class LogStartAdvanced(NamedTuple):
    log_start_offset: int


class NoopApplied(NamedTuple):
    marker: int


class TxnRegistered(NamedTuple):
    """The partition takes this transaction's data now (or already did: a replay)."""

    producer_id: int
    txn_sequence: int


class TxnEnded(NamedTuple):
    """A marker that wrote nothing: the transaction wrote no data here, or it ended already."""

    producer_id: int
    txn_sequence: int


PartitionResult = (
    Appended
    | Duplicate
    | ProducersExpired
    | LogStartAdvanced
    | NoopApplied
    | TxnRegistered
    | TxnEnded
    | Rejected
)


class PartitionStateMachine:
    """Offsets, the leader-stamped clock and the producer table of one partition."""

    __slots__ = (
        "_clock_ms",
        "_deduplicate",
        "_limits",
        "_log_end_offset",
        "_log_start_offset",
        "epochs",
        "producers",
        "sinks",
        "txns",
    )

    def __init__(self, limits: StateLimits = DEFAULT_LIMITS, *, deduplicate: bool = True) -> None:
        """`deduplicate=False` is a deliberate fault for the chaos suite's negative control: a
        retried batch is appended again. Never in production."""
        self._limits = limits
        self._deduplicate = deduplicate
        self._log_start_offset = 0
        self._log_end_offset = 0
        # The largest leader-stamped time seen: it never runs backwards, even when a new
        # leader's clock is behind the old one's.
        self._clock_ms = 0
        self.producers = ProducerTable(limits.producers_per_partition_max)
        self.sinks = SinkFenceTable(limits.sink_writers_per_partition_max)
        self.epochs = LeaderEpochs(limits.leader_epochs_per_partition_max)
        self.txns = PartitionTxns.bounded_by(limits)

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed readers stop: the first offset of the oldest transaction still
        open with data here, else the log end (statemachine/partition_txns.py)."""
        return max(self.txns.last_stable_offset(self._log_end_offset), self._log_start_offset)

    @property
    def clock_ms(self) -> int:
        return self._clock_ms

    def expiry_due(self, now_ms: int, expiration_ms: int) -> bool:
        """Whether ExpireProducers stamped `now_ms` would remove a producer, a sink writer or a
        producer's finished transactions."""
        now_ms = max(self._clock_ms, now_ms)
        return (
            self.producers.expiry_due(now_ms, expiration_ms, self.txns.producers)
            or self.sinks.expiry_due(now_ms, expiration_ms)
            or self.txns.expiry_due(now_ms, expiration_ms)
        )

    def apply(
        self, entry: bytes | memoryview, term: int = NO_PARTITION_LEADER_EPOCH
    ) -> PartitionResult:
        """Apply one entry; `term` is its Raft term, the leader epoch of what it appends (by
        default unknown: nothing is recorded in the leader epochs)."""
        try:
            cls, values = decode_fields(entry, self._limits)
        except CommandDecodeError:
            return Rejected(ErrorCode.INVALID_REQUEST)
        if cls is AppendBatch:  # the hot path: no command object
            now_ms, batch = values
            return self._append(now_ms, batch, term)
        match cls(*values):
            case AppendFencedBatch(now_ms, batch, sink, writer, batch_id, part):
                return self._append_fenced(now_ms, batch, (sink, writer, batch_id, part), term)
            case ExpireProducers(now_ms=now_ms, producer_id_expiration_ms=expiration_ms):
                return self._expire(now_ms, expiration_ms)
            case AdvanceLogStart(log_start_offset=offset):
                target = min(max(self._log_start_offset, offset), self._log_end_offset)
                self._log_start_offset = target
                self.epochs.start_moved(target)
                self.txns.start_moved(target)
                return LogStartAdvanced(target)
            case RegisterTxnPartition(now_ms, producer_id, epoch, txn_sequence):
                self._advance_clock(now_ms)
                error = self.txns.register(producer_id, epoch, txn_sequence, self._clock_ms)
                if error != ErrorCode.NONE:
                    return Rejected(error)
                return TxnRegistered(producer_id, txn_sequence)
            case WriteTxnMarker(now_ms, producer_id, epoch, txn_sequence, commit, coordinator):
                self._advance_clock(now_ms)
                marker = (epoch, bool(commit), coordinator)
                return self._end_txn(producer_id, txn_sequence, marker, term)
            case Noop(marker=marker):
                return NoopApplied(marker)
        return Rejected(ErrorCode.INVALID_REQUEST)  # a metadata command sent to a partition

    def _advance_clock(self, now_ms: int) -> None:
        self._clock_ms = max(self._clock_ms, now_ms)

    def _expire(self, now_ms: int, expiration_ms: int) -> ProducersExpired:
        """Idle producers go, but not one with a transaction open (as Kafka keeps them)."""
        self._advance_clock(now_ms)
        self.sinks.expire(self._clock_ms, expiration_ms)
        self.txns.expire(self._clock_ms, expiration_ms)
        keep = self.txns.producers  # what remains there is open or recent
        return ProducersExpired(self.producers.expire(self._clock_ms, expiration_ms, keep))

    def _append(self, now_ms: int, batch: bytes, term: int) -> PartitionResult:
        try:
            header = read_header(batch, self._limits)
        except BatchFormatError:
            return Rejected(ErrorCode.CORRUPT_MESSAGE)
        clock_ms = self._clock_ms = max(self._clock_ms, now_ms)
        if header.attributes & TRANSACTIONAL_BIT or (
            self.txns.producers and header.producer_id in self.txns.producers
        ):
            return self._append_to_txn(header, batch, term)
        if header.producer_id != NO_PRODUCER_ID:
            base_offset = self._log_end_offset
            verdict = self.producers.admit(header, base_offset, clock_ms, self.txns.producers)
            if verdict is None:
                self._log_end_offset = end = base_offset + header.record_count
                if term > self.epochs.latest:
                    self.epochs.appended(term, base_offset)
                return _new_result(Appended, (base_offset, end - 1, clock_ms, batch, term))
            if isinstance(verdict, ErrorCode):
                return Rejected(verdict)
            if not self._deduplicate:  # the injected fault: a duplicate goes into the log
                self._log_end_offset = end = base_offset + header.record_count
                self.epochs.appended(term, base_offset)
                return Appended(base_offset, end - 1, clock_ms, batch, term)
            return Duplicate(verdict.base_offset, verdict.last_offset, verdict.timestamp_ms)
        return self._assign_offsets(header, batch, term)

    def _append_to_txn(self, header: BatchHeader, batch: bytes, term: int) -> PartitionResult:
        """A batch of a producer with a transaction open here, or a transactional one: a retry
        of a retained batch is its duplicate first (Kafka's order), then the batch must be
        transactional, of the registered transaction's epoch, and next in its sequence."""
        error, verdict = self._txn_check(header)
        if isinstance(verdict, BatchMetadata):
            return Duplicate(verdict.base_offset, verdict.last_offset, verdict.timestamp_ms)
        if error != ErrorCode.NONE:
            return Rejected(error)
        if verdict is not None:
            return Rejected(verdict)
        appended = self._assign_offsets(header, batch, term)
        if header.attributes & TRANSACTIONAL_BIT:
            self.txns.appended(
                header.producer_id, appended.base_offset, appended.last_offset, self._clock_ms
            )
        return appended

    def txn_refusal(self, header: BatchHeader) -> ErrorCode:
        """Why apply would refuse this batch for its producer's transaction state (NONE: it
        would not, or it is a retry of a retained batch): the leader's check at the edge, so
        that data outside a registered transaction never reaches the log."""
        transactional = header.attributes & TRANSACTIONAL_BIT
        if not transactional and header.producer_id not in self.txns.producers:
            return ErrorCode.NONE
        return self._txn_check(header)[0]

    def _txn_check(self, header: BatchHeader) -> tuple[ErrorCode, Verdict]:
        """A batch of a producer with transactional state, in Kafka's order: below the epoch
        a marker raised, fenced; a retry of a retained batch, its duplicate (the window's
        metadata as verdict, NONE as error); else the transaction's refusal, if any, and the
        producer table's verdict on the sequence."""
        if header.producer_epoch < self.txns.fenced_epoch(header.producer_id):
            return ErrorCode.INVALID_PRODUCER_EPOCH, None
        verdict = self.producers.check(header)
        if isinstance(verdict, BatchMetadata):
            return ErrorCode.NONE, verdict
        return self._txn_refusal(header), verdict

    def _txn_refusal(self, header: BatchHeader) -> ErrorCode:
        """A plain batch is refused inside an open transaction, a transactional one outside
        its producer's open transaction (the producer table judges the rest)."""
        if not header.attributes & TRANSACTIONAL_BIT:
            in_txn = self.txns.in_transaction(header.producer_id)
            return ErrorCode.INVALID_TXN_STATE if in_txn else ErrorCode.NONE
        return self.txns.check_data(header.producer_id, header.producer_epoch)

    def _end_txn(
        self, producer_id: int, txn_sequence: int, marker: tuple[int, bool, int], term: int
    ) -> PartitionResult:
        """A WriteTxnMarker: the control batch where the transaction wrote data here."""
        epoch, commit, coordinator_epoch = marker
        verdict = self.txns.check_end(producer_id, epoch, txn_sequence, commit, coordinator_epoch)
        if isinstance(verdict, ErrorCode):  # (True: a control batch is written)
            return Rejected(verdict)
        offset = self._log_end_offset if verdict else NO_OFFSET
        self.txns.end(producer_id, txn_sequence, marker, offset, self._clock_ms)
        if not verdict:
            return TxnEnded(producer_id, txn_sequence)
        batch = marker_batch(producer_id, epoch, commit, coordinator_epoch, self._clock_ms)
        self._log_end_offset = offset + 1
        self.epochs.appended(term, offset)
        return Appended(offset, offset, self._clock_ms, batch, term)

    def _append_fenced(
        self, now_ms: int, batch: bytes, fence: tuple[str, int, int, int], term: int
    ) -> PartitionResult:
        """The producer table first (a retry of an appended part is its duplicate, with offsets),
        then the fence (a replay by a later run: a duplicate without offsets), then append."""
        sink, writer, batch_id, part = fence
        if not 0 < len(sink.encode()) <= self._limits.name_length_max:
            return Rejected(ErrorCode.INVALID_REQUEST)
        try:
            header = read_header(batch, self._limits)
        except BatchFormatError:
            return Rejected(ErrorCode.CORRUPT_MESSAGE)
        if header.attributes & TRANSACTIONAL_BIT:
            return Rejected(ErrorCode.INVALID_RECORD)  # a sink's parts are fenced, never in one
        if self.txns.producers and self.txns.in_transaction(header.producer_id):
            return Rejected(ErrorCode.INVALID_TXN_STATE)  # a plain batch inside a transaction
        self._clock_ms = max(self._clock_ms, now_ms)
        if header.producer_id != NO_PRODUCER_ID:
            verdict = self.producers.check(header)
            if isinstance(verdict, ErrorCode):
                return Rejected(verdict)
            if verdict is not None:
                return Duplicate(verdict.base_offset, verdict.last_offset, verdict.timestamp_ms)
        seen = self.sinks.check(sink, writer, batch_id, part)
        if isinstance(seen, ErrorCode):
            return Rejected(seen)
        if seen and self._deduplicate:  # (the injected fault lets a replayed part in again)
            stored = self.sinks.get(sink, writer)
            assert stored is not None
            return Duplicate(-1, -1, stored.last_update_ms)
        if not seen:
            self.sinks.record(sink, writer, batch_id, part, self._clock_ms)
        return self._assign_offsets(header, batch, term)

    def _assign_offsets(self, header: BatchHeader, batch: bytes, term: int) -> Appended:
        base_offset = self._log_end_offset
        self._log_end_offset = base_offset + header.record_count
        if header.idempotent:
            self.producers.record(header, base_offset, self._clock_ms, self.txns.producers)
        self.epochs.appended(term, base_offset)
        return Appended(base_offset, self._log_end_offset - 1, self._clock_ms, batch, term)

    # -- snapshots -------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Canonical bytes of the whole state: equal on replicas that applied equal entries."""
        return pack(
            [
                SNAPSHOT_VERSION,
                self._log_start_offset,
                self._log_end_offset,
                self._clock_ms,
                self.producers.to_data(),
                self.sinks.to_data(),
                self.epochs.to_data(),
                self.txns.to_data(),
            ]
        )

    @classmethod
    def restore(
        cls, data: bytes, limits: StateLimits = DEFAULT_LIMITS, *, deduplicate: bool = True
    ) -> PartitionStateMachine:
        fields = _snapshot_fields(data)
        log_start, log_end, clock_ms = (expect_int(v, "partition snapshot") for v in fields[:3])
        machine = cls(limits, deduplicate=deduplicate)
        machine._log_start_offset = log_start
        machine._log_end_offset = log_end
        machine._clock_ms = clock_ms
        machine.producers = ProducerTable.from_data(fields[3], limits.producers_per_partition_max)
        machine.sinks = SinkFenceTable.from_data(fields[4], limits.sink_writers_per_partition_max)
        try:
            epochs_max = limits.leader_epochs_per_partition_max
            machine.epochs = LeaderEpochs.from_data(fields[5], epochs_max)
        except ValueError as exc:
            raise SnapshotError(f"partition snapshot: {exc}") from exc
        if fields[6] is not None:
            machine.txns = PartitionTxns.from_data(fields[6], limits)
        return machine


def _snapshot_fields(data: bytes) -> tuple[object, ...]:
    """A version-4 snapshot's seven fields; an older one's, with None for no transactions (3),
    no leader epochs either (2: a reader's question about an epoch before the first one kept
    is answered with that one's start, after everything it holds), no sink fences either (1)."""
    version, fields = unpack_versioned_snapshot(data, {1: 4, 2: 5, 3: 6, 4: 7}, "partition")
    return (*fields, *((), (), None)[version - 1 :]) if version < SNAPSHOT_VERSION else fields
