"""A partition's transactions (statemachine/partition_txns.py through PartitionStateMachine):
registration before data, the markers as Kafka's control batches, the last stable offset and
the aborted index, and the refusals of stale, replayed and fenced entries. Kafka's
ProducerStateManagerTest cases on transactions, as far as they translate, are named in the
docstrings (the others, and why: tests/unit/test_txn_state.py's module docstring)."""

from __future__ import annotations

from typing import cast

import pytest
from hypothesis import given, settings
from kafka.record.default_records import ControlRecord, DefaultRecordBatch

from cluster.client.consumer import Consumer, _Position
from cluster.native.messages.records import FetchedBatch
from statemachine.codec import pack, unpack
from statemachine.commands import (
    AdvanceLogStart,
    AppendBatch,
    AppendFencedBatch,
    ExpireProducers,
    RegisterTxnPartition,
    WriteTxnMarker,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import StateLimits
from statemachine.partition import (
    Appended,
    Duplicate,
    PartitionStateMachine,
    TxnEnded,
    TxnRegistered,
)
from statemachine.partition_txns import AbortedTxn, OpenTxn, marker_batch
from statemachine.records import (
    BatchFormatError,
    Record,
    UnsupportedBatchError,
    encode_batch,
    verify_batch,
    with_base_offset,
)
from tests.property.replica_logs import PARTITION_LOGS

PID, OTHER = 7, 8
NOW = 1_000


class Partition:
    """A partition and the producers' sequences, to write the tests as a story."""

    def __init__(self, limits: StateLimits | None = None) -> None:
        self.machine = PartitionStateMachine() if limits is None else PartitionStateMachine(limits)
        self.sequences: dict[int, int] = {}
        self.term = 1

    def apply(self, entry: bytes) -> object:
        return self.machine.apply(entry, self.term)

    def batch(self, pid: int, count: int = 1, *, epoch: int = 0, txn: bool = True) -> bytes:
        sequence = self.sequences.get(pid, 0)
        self.sequences[pid] = sequence + count
        records = tuple(Record(None, b"v%d" % i, NOW) for i in range(count))
        return encode_batch(pid, epoch, sequence, records, transactional=txn)

    def send(self, pid: int, count: int = 1, *, epoch: int = 0, txn: bool = True) -> object:
        return self.apply(AppendBatch(NOW, self.batch(pid, count, epoch=epoch, txn=txn)).encode())

    def register(self, pid: int, sequence: int, *, epoch: int = 0) -> object:
        return self.apply(RegisterTxnPartition(NOW, pid, epoch, sequence).encode())

    def end(
        self, pid: int, sequence: int, *, commit: bool, epoch: int = 0, coordinator: int = 0
    ) -> object:
        marker = WriteTxnMarker(NOW, pid, epoch, sequence, int(commit), coordinator)
        return self.apply(marker.encode())

    @property
    def lso(self) -> int:
        return self.machine.last_stable_offset

    @property
    def end_offset(self) -> int:
        return self.machine.log_end_offset


def control_record(result: object) -> tuple[DefaultRecordBatch, ControlRecord]:
    """The marker a result appended, read by kafka-python's own reader of record batches."""
    assert isinstance(result, Appended)
    stored = with_base_offset(result.batch, result.base_offset, result.leader_epoch)
    batch = DefaultRecordBatch(stored)
    assert batch.validate_crc()
    (record,) = list(batch)
    assert isinstance(record, ControlRecord)
    return batch, record


def test_data_is_refused_until_the_coordinator_registered_the_partition() -> None:
    p = Partition()
    assert p.send(PID) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert p.end_offset == 0
    p.sequences[PID] = 0  # the client retries the same batch once registered
    assert p.register(PID, 0) == TxnRegistered(PID, 0)
    assert p.register(PID, 0) == TxnRegistered(PID, 0)  # a retried AddPartitionsToTxn
    # A newer epoch than the registration's: that session registered nothing here yet.
    assert p.send(PID, 1, epoch=1) == Rejected(ErrorCode.INVALID_TXN_STATE)
    p.sequences[PID] = 0
    assert isinstance(p.send(PID, 3), Appended)
    assert p.end_offset == 3


def test_the_last_stable_offset_holds_at_the_oldest_open_transaction() -> None:
    """Kafka: ProducerStateManagerTest.testFirstUnstableOffset. Kafka's first unstable offset
    also waits for the high watermark; here only committed entries apply, so the first
    undecided offset and the first unstable one are the same."""
    p = Partition()
    p.register(PID, 0)
    assert p.lso == 0  # open without data: holds nothing yet
    p.send(OTHER, 2, txn=False)  # plain data before the transaction's first batch
    assert p.lso == 2
    p.send(PID, 3)  # offsets 2-4
    p.send(OTHER, 1, txn=False)  # 5: another producer's plain record, past the open data
    assert (p.lso, p.end_offset) == (2, 6)
    p.register(OTHER + 1, 0)
    p.send(OTHER + 1, 1)  # 6: a second open transaction, younger
    assert p.lso == 2
    commit = p.end(PID, 0, commit=True)  # 7: the oldest ends
    assert isinstance(commit, Appended)
    assert (commit.base_offset, p.lso) == (7, 6)
    p.end(OTHER + 1, 0, commit=False)  # 8
    assert p.lso == p.end_offset == 9


def test_a_marker_is_kafkas_control_batch_at_one_offset() -> None:
    p = Partition()
    p.register(PID, 0, epoch=4)
    p.send(PID, 2, epoch=4)
    marker = p.end(PID, 0, commit=True, epoch=4, coordinator=3)
    batch, record = control_record(marker)
    assert batch.is_control_batch
    assert batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (PID, 4, -1)
    assert (batch.base_offset, batch.next_offset) == (2, 3)
    assert (record.version, record.commit) == (0, True)
    assert record.value == (0).to_bytes(2, "big") + (3).to_bytes(4, "big")  # coordinator epoch
    p.register(PID, 1, epoch=4)
    p.send(PID, 1, epoch=4)
    _, abort = control_record(p.end(PID, 1, commit=False, epoch=4, coordinator=3))
    assert abort.abort


def test_an_abort_is_listed_for_the_readers_of_its_data_only() -> None:
    """Kafka: ProducerStateManagerTest.testSkipEmptyTransactions: a transaction without data
    here completes nothing (and here writes no marker either: docs, "Differences from
    Kafka")."""
    p = Partition()
    p.send(OTHER, 2, txn=False)  # 0-1
    p.register(PID, 0)
    p.send(PID, 2)  # 2-3
    p.send(OTHER, 1, txn=False)  # 4
    p.end(PID, 0, commit=False)  # 5
    aborted = AbortedTxn(PID, 2, 5)
    assert p.machine.txns.aborted_between(0, 2) == []  # ends before the data
    assert p.machine.txns.aborted_between(0, 3) == [aborted]
    assert p.machine.txns.aborted_between(4, 6) == [aborted]  # the marker is in the range
    assert p.machine.txns.aborted_between(6, 10) == []  # after the marker
    p.register(PID, 1)
    assert isinstance(p.end(PID, 1, commit=False), TxnEnded)  # no data here: nothing listed
    assert p.machine.txns.aborted_between(0, p.end_offset) == [aborted]
    p.apply(AdvanceLogStart(6).encode())
    assert p.machine.txns.aborted_between(0, p.end_offset) == []


def test_a_replayed_marker_is_harmless_and_a_stale_one_is_refused() -> None:
    """Kafka: ProducerStateManagerTest.testCoordinatorFencing (the same coordinator epoch again,
    a higher one, then a lower one)"""
    p = Partition()
    p.register(PID, 0)
    p.send(PID, 1)
    assert isinstance(p.end(PID, 0, commit=True, coordinator=2), Appended)
    assert p.end(PID, 0, commit=True, coordinator=2) == TxnEnded(PID, 0)  # a replay
    assert p.end(PID, 0, commit=False, coordinator=2) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert p.end_offset == 2  # one marker, however often it came
    p.register(PID, 1)
    p.send(PID, 1)
    # The coordinator of before its failover, and a marker of a transaction not open here.
    assert p.end(PID, 1, commit=True, coordinator=1) == Rejected(
        ErrorCode.TRANSACTION_COORDINATOR_FENCED
    )
    assert p.end(PID, 2, commit=True, coordinator=2) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert p.lso == 2  # still open
    assert p.register(PID, 0) == Rejected(ErrorCode.INVALID_TXN_STATE)  # another one is open
    p.end(PID, 1, commit=True, coordinator=2)
    assert p.register(PID, 1) == Rejected(ErrorCode.INVALID_TXN_STATE)  # ended here already
    assert p.register(PID, 0) == Rejected(ErrorCode.INVALID_TXN_STATE)


def test_a_marker_for_a_transaction_never_registered_here_ends_it_for_good() -> None:
    """The coordinator gave up on a registration that commits only after the marker: the
    marker ended nothing, but the late registration is refused as stale, so no transaction
    is left open that no coordinator will ever end (and an unknown producer alike)."""
    p = Partition()
    assert p.end(PID, 0, commit=False, coordinator=1) == TxnEnded(PID, 0)
    assert p.register(PID, 0) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert p.send(PID, 1) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert p.end_offset == 0
    assert p.register(PID, 1) == TxnRegistered(PID, 1)  # the next transaction opens
    assert p.end(PID, 0, commit=False, coordinator=0) == Rejected(
        ErrorCode.TRANSACTION_COORDINATOR_FENCED
    )
    assert p.end(PID, 1, commit=True, epoch=0, coordinator=1) == TxnEnded(PID, 1)


def test_an_abort_by_a_bumped_epoch_fences_the_old_producer() -> None:
    """Kafka: ProducerStateManagerTest.testProducerStateAfterFencingAbortMarker. InitProducerId
    of a successor: the coordinator aborts the open transaction with the next epoch; the
    zombie's batches of the old epoch are refused from then on."""
    p = Partition()
    p.register(PID, 0, epoch=0)
    p.send(PID, 1, epoch=0)
    zombie = p.batch(PID, 1, epoch=0)
    p.apply(AppendBatch(NOW, zombie).encode())
    assert isinstance(p.end(PID, 0, commit=False, epoch=1), Appended)
    # The zombie's retry of its aborted batch is no duplicate, its plain batch no append.
    assert p.apply(AppendBatch(NOW, zombie).encode()) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert p.send(PID, 1, epoch=0, txn=False) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert p.end(PID, 0, commit=True, epoch=0) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert p.send(PID, 1, epoch=0) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert p.register(PID, 1, epoch=0) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert p.register(PID, 1, epoch=1) == TxnRegistered(PID, 1)
    p.sequences[PID] = 0
    assert isinstance(p.send(PID, 1, epoch=1), Appended)
    assert p.send(PID, 1, epoch=0) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)


def test_a_plain_batch_inside_a_transaction_is_refused_and_a_retry_is_a_duplicate() -> None:
    """Kafka: ProducerStateManagerTest.testNonTransactionalAppendWithOngoingTransaction"""
    p = Partition()
    p.register(PID, 0)
    first = p.batch(PID, 2)
    appended = p.apply(AppendBatch(NOW, first).encode())
    assert isinstance(appended, Appended)
    assert p.send(PID, 1, txn=False) == Rejected(ErrorCode.INVALID_TXN_STATE)
    p.end(PID, 0, commit=True)
    # The answer to the first batch was lost: its retry after the commit is a duplicate, with
    # its offsets (Kafka checks duplicates before the transaction).
    assert p.apply(AppendBatch(NOW, first).encode()) == Duplicate(0, 1, NOW)
    assert p.end_offset == 3


def test_open_transactions_survive_snapshots_and_restore_from_older_ones() -> None:
    """Kafka: ProducerStateManagerTest.testRecoverFromSnapshotFinishedTransaction (the aborted
    one), and one open with and one without data"""
    p = Partition()
    p.register(PID, 0)  # open, no data yet
    p.register(OTHER, 0)
    p.send(OTHER, 2)
    p.register(OTHER + 1, 0)
    p.send(OTHER + 1, 1)
    p.end(OTHER + 1, 0, commit=False)
    restored = PartitionStateMachine.restore(p.machine.snapshot())
    assert restored.snapshot() == p.machine.snapshot()
    assert restored.last_stable_offset == 0
    assert restored.txns.aborted_between(0, 10) == [AbortedTxn(OTHER + 1, 2, 3)]
    assert restored.txns.check_data(PID, 0) == ErrorCode.NONE  # the open registration


def test_idle_producers_expire_but_not_while_a_transaction_is_open() -> None:
    """Kafka: ProducerStateManagerTest.testProducersWithOngoingTransactionsDontExpire"""
    p = Partition()
    p.register(PID, 0)
    p.send(PID, 1)
    p.send(OTHER, 1, txn=False)
    expired = p.apply(ExpireProducers(NOW + 10_000, 1_000).encode())
    assert expired.producer_ids == (OTHER,)  # type: ignore[attr-defined]
    assert p.machine.producers.get(PID) is not None
    p.end(PID, 0, commit=True)
    assert p.machine.expiry_due(NOW + 10_000, 1_000) is False  # the marker is recent
    p.apply(ExpireProducers(NOW + 20_000, 1_000).encode())
    assert p.machine.producers.get(PID) is None
    assert not p.machine.txns


def test_the_aborted_index_holds_its_bound_whatever_open_transactions_do() -> None:
    """Open transactions count against the index: each may yet abort, and a snapshot past
    the bound would not restore."""
    limits = StateLimits(txn_producers_per_partition_max=4, aborted_txns_per_partition_max=2)
    p = Partition(limits)
    p.register(PID, 0)
    p.register(OTHER, 0)
    assert p.register(OTHER + 1, 0) == Rejected(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
    for pid in (PID, OTHER):
        p.send(pid, 1)
        p.end(pid, 0, commit=False)
    restored = PartitionStateMachine.restore(p.machine.snapshot(), limits)
    assert len(restored.txns.aborted_between(0, p.end_offset)) == 2


def test_the_last_stable_offset_never_falls_below_the_log_start() -> None:
    p = Partition()
    p.register(PID, 0)
    p.send(PID, 2)
    p.send(OTHER, 2, txn=False)
    p.apply(AdvanceLogStart(3).encode())  # retention or DeleteRecords past the open data
    assert p.lso == 3


def test_a_sink_part_of_a_producer_inside_a_transaction_is_refused() -> None:
    p = Partition()
    p.register(PID, 0)
    part = AppendFencedBatch(NOW, p.batch(PID, 1, txn=False), "sink", 0, 0, 0)
    assert p.apply(part.encode()) == Rejected(ErrorCode.INVALID_TXN_STATE)


def test_a_version_3_snapshot_restores_with_no_transactions() -> None:
    p = Partition()
    p.send(OTHER, 1, txn=False)
    fields = cast(tuple[object, ...], unpack(p.machine.snapshot(), size_max=1 << 20))
    older = pack([3, *fields[1:7]])
    restored = PartitionStateMachine.restore(older)
    assert not restored.txns
    assert restored.log_end_offset == 1


def test_full_tables_refuse_new_transactions_rather_than_forget() -> None:
    limits = StateLimits(txn_producers_per_partition_max=1, aborted_txns_per_partition_max=1)
    p = Partition(limits)
    p.register(PID, 0)
    assert p.register(OTHER, 0) == Rejected(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
    p.send(PID, 1)
    p.end(PID, 0, commit=False)
    assert p.register(PID, 1) == Rejected(ErrorCode.THROTTLING_QUOTA_EXCEEDED)  # index full
    p.apply(AdvanceLogStart(p.end_offset).encode())  # retention cuts the abort away
    assert p.register(PID, 1) == TxnRegistered(PID, 1)


def test_the_edge_takes_transactional_data_but_never_a_clients_control_batch() -> None:
    data = encode_batch(PID, 0, 0, (Record(None, b"v", NOW),), transactional=True)
    assert verify_batch(data).attributes == 0x10
    p = Partition()
    p.register(PID, 4)
    p.send(PID, 1)
    marker = p.end(PID, 4, commit=True)
    assert isinstance(marker, Appended)
    with pytest.raises(UnsupportedBatchError, match="control"):
        verify_batch(marker.batch)
    with pytest.raises(BatchFormatError, match="producer id"):
        encode_batch(-1, -1, -1, (Record(None, b"v", NOW),), transactional=True)


@settings(max_examples=150, deadline=None)
@given(PARTITION_LOGS)
def test_the_last_stable_offset_never_moves_back(entries: list[bytes]) -> None:
    """Over generated logs (transactions among every other kind of entry): the LSO only grows,
    stays within the log, and every listed abort has data below its marker."""
    machine = PartitionStateMachine()
    last = 0
    for entry in entries:
        machine.apply(entry, 1)
        lso = machine.last_stable_offset
        assert last <= lso <= machine.log_end_offset
        last = lso
        for aborted in machine.txns.aborted_between(0, machine.log_end_offset):
            assert aborted.first_offset < aborted.last_offset < machine.log_end_offset


def test_the_native_consumer_skips_a_marker_and_reads_past_it() -> None:
    """A control batch is no record of the application's: the consumer's position moves past
    its offset and the records after it are read as usual."""
    p = Partition()
    p.register(PID, 0)
    data = p.send(PID, 2)
    marker = p.end(PID, 0, commit=True)
    assert isinstance(data, Appended)
    assert isinstance(marker, Appended)
    position = _Position(0)
    read = []
    for result in (data, marker):
        stored = with_base_offset(result.batch, result.base_offset, result.leader_epoch)
        fetched = FetchedBatch(result.base_offset, result.append_time_ms, stored)
        read += Consumer._records("t", 0, fetched, position)
    assert [r.offset for r in read] == [0, 1]
    assert position.offset == 3


def test_a_full_producer_table_keeps_the_producers_inside_a_transaction() -> None:
    """A new producer evicts the least recently used one outside a transaction: the one inside
    keeps its window, so its retry is still a duplicate, not a second append."""
    p = Partition(StateLimits(producers_per_partition_max=2))
    p.register(PID, 0)
    first = p.batch(PID, 1)
    p.apply(AppendBatch(NOW, first).encode())  # the least recently used from here on
    p.send(OTHER, 1, txn=False)
    p.send(OTHER + 1, 1, txn=False)  # the table is full: OTHER goes, not PID
    assert p.machine.producers.get(OTHER) is None
    assert p.apply(AppendBatch(NOW, first).encode()) == Duplicate(0, 0, NOW)


# -- Kafka's ProducerStateManagerTest cases on transactions -------------------------------------


def test_a_marker_for_a_producer_unknown_here_still_fences_its_older_epochs() -> None:
    """Kafka: ProducerStateManagerTest.testAppendTxnMarkerWithNoProducerState. Kafka writes the
    marker, then wants sequence 0 at its epoch; here a marker of a transaction with no data
    here writes nothing (docs: "Markers"), and the producer table holds no window for the
    PID, so its first batch at the marker's epoch is an unknown producer's (rule 1)."""
    p = Partition()
    assert p.end(PID, 0, commit=True, epoch=2) == TxnEnded(PID, 0)
    assert p.end_offset == 0
    assert p.send(PID, 1, epoch=0, txn=False) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    p.sequences[PID] = 17
    assert isinstance(p.send(PID, 1, epoch=2, txn=False), Appended)


def test_a_marker_of_a_bumped_epoch_starts_that_epoch_at_sequence_0() -> None:
    """Kafka: ProducerStateManagerTest.testControlRecordBumpsProducerEpoch: the coordinator's
    abort under the next epoch (a successor's InitProducerId) fences the old epoch here, and
    the new one starts its sequences at 0."""
    p = Partition()
    p.send(PID, 1, txn=False)  # epoch 0, sequence 0
    assert p.end(PID, 0, commit=False, epoch=1) == TxnEnded(PID, 0)  # none open here
    assert p.send(PID, 1, epoch=0, txn=False) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    p.sequences[PID] = 3
    out_of_order = Rejected(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert p.send(PID, 1, epoch=1, txn=False) == out_of_order
    p.sequences[PID] = 0
    assert isinstance(p.send(PID, 1, epoch=1, txn=False), Appended)


def test_a_commit_marker_ends_the_transaction_and_keeps_the_batches_it_wrote() -> None:
    """Kafka: ProducerStateManagerTest.updateProducerTransactionState: the transaction spans its
    first batch to the marker, which changes no batch's metadata, so a retry of its data after
    the commit is still a duplicate."""
    p = Partition()
    p.send(OTHER, 1, txn=False)  # offset 0: the transaction's data starts past the log start
    p.register(PID, 0)
    first, second = p.batch(PID, 2), p.batch(PID, 3)
    p.apply(AppendBatch(NOW, first).encode())  # 1-2
    p.apply(AppendBatch(NOW, second).encode())  # 3-5
    assert p.machine.txns.open_txns() == [(PID, OpenTxn(0, 0, 1, 5))]
    commit = p.end(PID, 0, commit=True)
    assert isinstance(commit, Appended)
    assert commit.base_offset == 6
    producer = p.machine.producers.get(PID)
    assert producer is not None
    window = [(m.first_seq, m.last_seq, m.base_offset, m.last_offset) for m in producer.window]
    assert window == [(0, 1, 1, 2), (2, 4, 3, 5)]
    assert p.machine.txns.open_txns() == []
    assert p.machine.txns.aborted_between(0, p.end_offset) == []
    assert p.lso == p.end_offset == 7
    assert p.apply(AppendBatch(NOW, second).encode()) == Duplicate(3, 5, NOW)


def test_after_an_abort_under_a_bumped_epoch_the_new_epoch_starts_at_sequence_0() -> None:
    """Kafka: ProducerStateManagerTest.testOutOfSequenceAfterControlRecordEpochBump. An epoch
    above the registered one, which Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER, is
    INVALID_TXN_STATE here: the registration is checked before the sequence (docs: "A
    transactional batch")."""
    p = Partition()
    p.register(PID, 0)
    p.send(PID, 1)
    p.send(PID, 1)  # sequences 0 and 1
    p.end(PID, 0, commit=False, epoch=1)
    p.register(PID, 1, epoch=1)
    p.sequences[PID] = 2
    assert p.send(PID, 1, epoch=1) == Rejected(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    p.sequences[PID] = 2
    assert p.send(PID, 1, epoch=2) == Rejected(ErrorCode.INVALID_TXN_STATE)
    p.sequences[PID] = 0
    assert isinstance(p.send(PID, 1, epoch=1), Appended)


def test_a_transaction_open_at_a_snapshot_goes_on_after_restore() -> None:
    """Kafka: ProducerStateManagerTest.testRecoverFromSnapshotUnfinishedTransaction. Kafka's
    snapshot keeps a producer's last batch only; here all five (docs: "Differences from
    Kafka"), so a retry of the first batch is still its duplicate."""
    p = Partition()
    p.register(PID, 0)
    first = p.batch(PID, 1)
    p.apply(AppendBatch(NOW, first).encode())
    p.send(PID, 1)
    p.machine = PartitionStateMachine.restore(p.machine.snapshot())
    assert p.lso == 0  # held at the transaction's first offset
    assert p.apply(AppendBatch(NOW, first).encode()) == Duplicate(0, 0, NOW)
    assert isinstance(p.send(PID, 1), Appended)  # sequence 2 follows on
    p.end(PID, 0, commit=True)
    assert p.lso == p.end_offset == 4


def test_a_marker_that_ended_nothing_here_survives_a_snapshot() -> None:
    """Kafka: ProducerStateManagerTest.testRecoverFromSnapshotEmptyTransaction: a producer known
    here only by a marker is restored with its time, its epoch and its transaction, so the
    late registration stays refused and the older epoch fenced."""
    p = Partition()
    p.apply(WriteTxnMarker(NOW + 5, PID, 1, 0, 0, 1).encode())
    p.machine = PartitionStateMachine.restore(p.machine.snapshot())
    entry = p.machine.txns.producers[PID]
    assert (entry.last_epoch, entry.last_txn_sequence, entry.last_update_ms) == (1, 0, NOW + 5)
    assert p.register(PID, 0, epoch=1) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert p.send(PID, 1, epoch=0, txn=False) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)


def test_a_marker_of_an_older_epoch_than_the_open_transaction_is_refused() -> None:
    """Kafka: ProducerStateManagerTest.testOldEpochForControlRecord: the transaction stays open
    for its own epoch's marker."""
    p = Partition()
    p.register(PID, 0, epoch=5)
    p.send(PID, 1, epoch=5)
    assert p.end(PID, 0, commit=True, epoch=3) == Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
    assert (p.lso, p.end_offset) == (0, 1)
    assert isinstance(p.end(PID, 0, commit=True, epoch=5), Appended)


def test_the_coordinator_epoch_survives_a_snapshot() -> None:
    """Kafka: ProducerStateManagerTest.testCoordinatorFencedAfterReload: the coordinator before
    a failover stays fenced on a replica restored from a snapshot."""
    p = Partition()
    p.register(PID, 0)
    p.send(PID, 1)
    p.end(PID, 0, commit=True, coordinator=1)
    p.register(PID, 1)
    p.send(PID, 1)
    p.machine = PartitionStateMachine.restore(p.machine.snapshot())
    fenced = Rejected(ErrorCode.TRANSACTION_COORDINATOR_FENCED)
    assert p.end(PID, 1, commit=True, coordinator=0) == fenced
    assert isinstance(p.end(PID, 1, commit=True, coordinator=1), Appended)


def test_a_control_batch_sent_as_data_opens_no_transaction() -> None:
    """Kafka: ProducerStateManagerTest.testAppendEmptyControlBatch: a control batch starts no
    transaction. Markers come only as WriteTxnMarker entries here: a control batch in an
    AppendBatch entry is refused in apply too (CORRUPT_MESSAGE, a committed no-op)."""
    p = Partition()
    control = marker_batch(PID, 0, True, 0, NOW)
    assert p.apply(AppendBatch(NOW, control).encode()) == Rejected(ErrorCode.CORRUPT_MESSAGE)
    assert (p.end_offset, p.lso) == (0, 0)
    assert not p.machine.txns
    assert p.machine.producers.get(PID) is None


def test_the_last_stable_offset_waits_for_the_oldest_of_three_transactions() -> None:
    """Kafka: ProducerStateManagerTest.testLastStableOffsetCompletedTxn: transactions that end
    out of order; the LSO moves only when the oldest one still open ends."""
    p = Partition()
    for pid in (PID, OTHER, OTHER + 1):  # data at 0-1, 2-3 and 4-5
        p.register(pid, 0)
        p.send(pid, 2)
    p.end(PID, 0, commit=False)  # 6
    assert p.lso == 2
    p.end(OTHER + 1, 0, commit=True)  # 7: a younger one ends first
    assert p.lso == 2
    p.end(OTHER, 0, commit=False)  # 8
    assert p.lso == p.end_offset == 9
