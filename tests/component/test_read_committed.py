"""A partition replica read as read_committed (Kafka's isolation level 1) on a real segment
store: up to the last stable offset, with the aborted transactions the reader must drop from
what it got, as Fetch answers it (cluster/broker/replica.py: `PartitionReplica.read`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.broker.replica import PartitionReplica
from cluster.broker.storage import PartitionStore, StoredBatch
from statemachine.commands import AppendBatch, RegisterTxnPartition, WriteTxnMarker
from statemachine.partition import Appended
from statemachine.partition_txns import AbortedTxn
from statemachine.records import Record, encode_batch

TXN_PID, PLAIN_PID = 40, 41
NOW = 5_000


def open_store(directory: Path) -> PartitionStore:
    return PartitionStore(directory, segment_bytes_max=4_096, index_interval_bytes=256)


class Log:
    """A replica fed as its Raft group would feed it, each entry settled at once."""

    def __init__(self, directory: Path) -> None:
        self.replica = PartitionReplica(open_store, directory, fatal=pytest.fail)
        self.sequences = {TXN_PID: 0, PLAIN_PID: 0}

    def apply(self, entry: bytes) -> object:
        result = self.replica.apply(entry, 1)
        self.replica.settle()
        return result

    def send(self, pid: int, count: int, *, txn: bool) -> None:
        records = tuple(Record(None, b"r%d" % i, NOW) for i in range(count))
        batch = encode_batch(pid, 0, self.sequences[pid], records, transactional=txn)
        self.sequences[pid] += count
        assert isinstance(self.apply(AppendBatch(NOW, batch).encode()), Appended)

    def end(self, sequence: int, *, commit: bool) -> None:
        marker = WriteTxnMarker(NOW, TXN_PID, 0, sequence, int(commit), 0)
        assert isinstance(self.apply(marker.encode()), Appended)

    def offsets(self, start: int, *, read_committed: bool) -> list[int]:
        batches, _ = self.read(start, read_committed=read_committed)
        return [b.base_offset for b in batches]

    def read(
        self, start: int, *, read_committed: bool
    ) -> tuple[tuple[StoredBatch, ...], tuple[AbortedTxn, ...]]:
        return self.replica.read(start, 1 << 20, at_least_one=True, read_committed=read_committed)


def test_a_read_committed_reader_stops_at_the_open_transaction(tmp_path: Path) -> None:
    log = Log(tmp_path)
    log.send(PLAIN_PID, 2, txn=False)  # 0-1
    log.apply(RegisterTxnPartition(NOW, TXN_PID, 0, 0).encode())
    log.send(TXN_PID, 3, txn=True)  # 2-4
    log.send(PLAIN_PID, 1, txn=False)  # 5: committed, but after the open transaction's start
    assert log.replica.last_stable_offset == 2
    assert log.offsets(0, read_committed=True) == [0]
    assert log.offsets(2, read_committed=True) == []
    assert log.offsets(0, read_committed=False) == [0, 2, 5]
    log.end(0, commit=True)  # 6
    assert log.replica.last_stable_offset == log.replica.high_watermark == 7
    batches, aborted = log.read(0, read_committed=True)
    assert [b.base_offset for b in batches] == [0, 2, 5, 6]
    assert aborted == ()


def test_an_aborted_transaction_is_named_to_the_readers_of_its_data(tmp_path: Path) -> None:
    log = Log(tmp_path)
    log.apply(RegisterTxnPartition(NOW, TXN_PID, 0, 0).encode())
    log.send(TXN_PID, 2, txn=True)  # 0-1
    log.send(PLAIN_PID, 1, txn=False)  # 2
    log.end(0, commit=False)  # 3
    log.send(PLAIN_PID, 1, txn=False)  # 4
    batches, aborted = log.read(0, read_committed=True)
    assert [b.base_offset for b in batches] == [0, 2, 3, 4]
    assert aborted == (AbortedTxn(TXN_PID, 0, 3),)
    _, after_the_marker = log.read(4, read_committed=True)
    assert after_the_marker == ()
    _, uncommitted = log.read(0, read_committed=False)
    assert uncommitted == ()  # read_uncommitted readers are told nothing
