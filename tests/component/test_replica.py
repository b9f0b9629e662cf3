"""PartitionReplica on a real segment store: an apply returns its result (the proposer's answer)
before the store is written; `settle` then carries out every effect in log order and tells
`on_applied` of each once its batch is readable. A store that fails stops the node (`fatal`)
rather than let the machine run ahead of its data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.broker.replica import PartitionReplica
from cluster.broker.storage import PartitionStore, StorageError
from cluster.chaos import power
from statemachine.commands import AppendBatch
from statemachine.partition import Appended, PartitionResult
from statemachine.records import Record, RecordBatch, with_base_offset


def open_store(directory: Path, *, fsync: bool = False) -> PartitionStore:
    return PartitionStore(directory, segment_bytes_max=1_024, index_interval_bytes=256, fsync=fsync)


def batch(index: int) -> bytes:
    records = (Record(None, bytes([index]) * 30, 1_000 + index),) * 2
    return RecordBatch(-1, -1, -1, records).encode()


def append(index: int) -> bytes:
    return AppendBatch(5_000 + index, batch(index)).encode()


def test_settle_stores_what_was_applied_in_log_order_then_notifies(tmp_path: Path) -> None:
    seen: list[tuple[PartitionResult, int]] = []
    replica = PartitionReplica(open_store, tmp_path, fatal=pytest.fail)
    replica.on_applied = lambda result: seen.append((result, replica.store.next_offset))

    results = [replica.apply(append(i), 1) for i in range(6)]  # crosses segments; term 1

    assert [r.base_offset for r in results if isinstance(r, Appended)] == [0, 2, 4, 6, 8, 10]
    assert replica.store.next_offset == 0 and seen == [], "nothing written before settle"
    replica.settle()
    stored = replica.store.read(0, 1 << 20)
    assert [(s.base_offset, s.append_time_ms, s.batch) for s in stored] == [
        (2 * i, 5_000 + i, with_base_offset(batch(i), 2 * i, 1)) for i in range(6)
    ]
    assert [result for result, _ in seen] == results
    assert all(
        isinstance(result, Appended) and next_offset == result.last_offset + 1
        for result, next_offset in seen
    ), "each told once its batch is stored"

    replica.settle()  # nothing left to carry out: no second copy
    assert replica.store.next_offset == 12 and len(seen) == 6


def stored_after_a_power_cut(directory: Path, *, durable: bool) -> int:
    """Records a replica's store still holds after a simulated power cut (power.py) that
    came right after it took a snapshot (what its Raft log is then compacted to)."""
    data = directory / "data"
    recorder = power.SyncRecorder(directory / "ledger")
    recorder.install()
    try:
        replica = PartitionReplica(open_store, data, fatal=pytest.fail, durable=durable)
        for i in range(6):  # crosses segment boundaries
            replica.apply(append(i), 1)
        replica.snapshot()  # settles what was applied first
        replica.store.close()
    finally:
        recorder.uninstall()
    power.cut_power(data, directory / "ledger", random.Random(1))
    with open_store(data / "log") as store:
        return store.next_offset


def test_with_fsync_a_snapshot_leaves_every_record_before_it_on_disk(tmp_path: Path) -> None:
    """With `fsync = true` a record is durable in the Raft journal when it is acknowledged, and
    the store is not fsynced per append; the journal forgets it once a snapshot is taken, so
    the replica syncs its store before it hands the snapshot over. Without that (the control,
    `fsync = false`) a power cut takes the records the snapshot already counts."""
    assert stored_after_a_power_cut(tmp_path / "durable", durable=True) == 12
    assert stored_after_a_power_cut(tmp_path / "relaxed", durable=False) < 12


def test_a_store_that_fails_while_settling_stops_the_node(tmp_path: Path) -> None:
    reasons: list[str] = []
    replica = PartitionReplica(open_store, tmp_path, fatal=reasons.append)
    replica.apply(append(0), 1)
    replica.store.close()

    with pytest.raises(StorageError):
        replica.settle()

    assert len(reasons) == 1 and reasons[0].startswith("storage failed after apply")
