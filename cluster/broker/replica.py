"""Replicas: what a Raft group applies on this node, joining a pure state machine to its effects.

`PartitionReplica` applies an entry to the `PartitionStateMachine` and, in `settle`, once the
run of applies has answered its proposers, carries out the effect it returned (append the batch
to the segment store, move the log start); `MetadataReplica`
applies to the `MetadataStateMachine`, `OffsetsReplica` to an offsets partition's
`OffsetsStateMachine` (consumer groups). Both run only in the Raft driver's ticks, on the loop,
and report every result to `on_applied`, which the node uses to wake long-polls and to start or
stop groups.

A storage failure after the state machine has applied an entry would leave the machine ahead of
its data; the replica then calls `fatal`, which stops the process, rather than go on diverged
(the entry is re-applied from the journal on restart).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypeVar

from cluster.broker.storage import PartitionStore, StoredBatch
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.metadata import MetadataResult, MetadataStateMachine
from statemachine.offsets import OffsetsResult, OffsetsStateMachine
from statemachine.partition import (
    Appended,
    LogStartAdvanced,
    PartitionResult,
    PartitionStateMachine,
)
from statemachine.partition_txns import AbortedTxn
from statemachine.txn_state import TxnStateMachine, TxnStateResult

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
Fatal = Callable[[str], None]


class _Notifying(Generic[R]):
    def __init__(self, on_applied: Callable[[R], None] | None) -> None:
        self.on_applied = on_applied

    def _notify(self, result: R) -> None:
        if self.on_applied is not None:
            self.on_applied(result)


class PartitionReplica(_Notifying[PartitionResult]):
    """One partition's state machine and segment store, applied together.

    When a snapshot from the leader covers records this replica never stored (it was down
    while the leader compacted its Raft log), the local log restarts at the snapshot's end and
    the records below it are restored from its peers in the background, into `backfill_dir`
    (`restoring`, `adopt_backfill`).
    """

    def __init__(
        self,
        open_store: Callable[[Path], PartitionStore],
        directory: Path,
        fatal: Fatal,
        limits: StateLimits = DEFAULT_LIMITS,
        on_applied: Callable[[PartitionResult], None] | None = None,
        *,
        deduplicate: bool = True,
        durable: bool = False,
    ) -> None:
        super().__init__(on_applied)
        self.durable = durable
        self.open_store = open_store
        self.log_dir = directory / "log"
        self.backfill_dir = directory / "backfill"
        self.store = open_store(self.log_dir)
        self.machine = PartitionStateMachine(limits, deduplicate=deduplicate)
        self._limits = limits
        self._deduplicate = deduplicate
        self._fatal = fatal
        self._unsettled: list[PartitionResult] = []  # applied, effects not yet carried out

    def apply(self, command: bytes | memoryview, term: int) -> PartitionResult:
        """Apply to the machine; its effect follows in `settle`, once this run of applies has
        told its proposers: an answer does not wait for a file write it does not need (the
        entry is committed, in the Raft journal, and a restart applies it again from there;
        with `fsync = true` the journal is on disk before the entry is acknowledged)."""
        result = self.machine.apply(command, term)
        self._unsettled.append(result)
        return result

    def settle(self) -> None:
        """Carry out the effects of the entries applied since the last call, in log order."""
        results, self._unsettled = self._unsettled, []
        for result in results:
            try:
                if isinstance(result, Appended):
                    count = result.last_offset - result.base_offset + 1
                    self.store.append(
                        result.base_offset,
                        count,
                        result.append_time_ms,
                        result.batch,
                        result.leader_epoch,
                    )
                elif isinstance(result, LogStartAdvanced):
                    self.store.delete_before(result.log_start_offset)
            except Exception as exc:  # any storage failure: the machine is ahead of its data
                self._fatal(f"storage failed after apply: {exc!r}")
                raise
            self._notify(result)

    def snapshot(self) -> bytes:
        """The machine's snapshot, which the Raft log is then compacted to. Its records leave
        the journal with that compaction, so with `durable` the store is made durable first:
        every record up to the snapshot is on disk before the journal forgets it."""
        self.settle()
        if self.durable:
            self.store.sync()
        return self.machine.snapshot()

    def restore(self, data: bytes) -> None:
        # The injected fault (if any) must survive a snapshot, or this replica alone would
        # deduplicate again and diverge from its peers.
        self.machine = PartitionStateMachine.restore(
            data, self._limits, deduplicate=self._deduplicate
        )
        if self.store.next_offset < self.machine.log_end_offset:
            self._restart_log_at(self.machine.log_end_offset)

    def _restart_log_at(self, offset: int) -> None:
        """The local log starts again at `offset`; what it held is dropped, not kept as the
        restoration's start: its tail may hold records its peers never committed (a chaos run
        found one whose records at some offsets differed from its peers', which a restoration
        then wedged on), and the peers hold every committed record below the snapshot."""
        self.store.close()
        shutil.rmtree(self.log_dir)
        self.store = self.open_store(self.log_dir)
        self.store.reset(offset)

    @property
    def high_watermark(self) -> int:
        return self.machine.log_end_offset

    @property
    def log_start_offset(self) -> int:
        """The first offset of the partition (every replica agrees on it)."""
        return self.machine.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed readers stop (statemachine/partition_txns.py)."""
        return self.machine.last_stable_offset

    def read(
        self, offset: int, max_bytes: int, *, at_least_one: bool, read_committed: bool
    ) -> tuple[tuple[StoredBatch, ...], tuple[AbortedTxn, ...]]:
        """The stored batches from `offset` on, up to the high watermark, or for a
        read_committed reader up to the last stable offset, with the aborted transactions
        whose data that reader must drop from them (Kafka's `aborted_transactions`).
        StorageError if the store fails."""
        upper = self.last_stable_offset if read_committed else self.high_watermark
        if offset >= upper:
            return (), ()
        stored = self.store.read(offset, max_bytes, at_least_one=at_least_one)
        batches = tuple(b for b in stored if b.base_offset < upper)
        if not read_committed or not batches:
            return batches, ()
        aborted = self.machine.txns.aborted_between(offset, batches[-1].next_offset)
        return batches, tuple(aborted)

    def offset_for_time(self, time_ms: int) -> int:
        """The first offset appended at `time_ms` or later (the leader's log append time), for
        a consumer to start at; the high watermark when nothing was appended since."""
        found = self.store.offset_for_time(time_ms)
        if found is None or found >= self.high_watermark:
            return self.high_watermark
        return max(found, self.log_start_offset)

    @property
    def restoring(self) -> bool:
        """Records from log_start_offset up to the local log's start are still being restored."""
        return self.store.log_start_offset > self.machine.log_start_offset

    def adopt_backfill(self, side: PartitionStore) -> None:
        """Between applies: splice restored records in front of the local log."""
        assert side.next_offset == self.store.log_start_offset, "backfill must end at the log"
        side.sync()
        side.close()
        for segment in side.directory.glob("*.log"):
            segment.rename(self.log_dir / segment.name)
        old, self.store = self.store, self.open_store(self.log_dir)
        old.close()
        shutil.rmtree(side.directory, ignore_errors=True)


class _PlainMachine(Protocol[R_co]):
    """A state machine whose applies have no effect outside it."""

    def __init__(self, limits: StateLimits) -> None: ...

    def apply(self, entry: bytes | memoryview) -> R_co: ...

    def snapshot(self) -> bytes: ...

    @classmethod
    def restore(cls, data: bytes, limits: StateLimits) -> Self: ...


M = TypeVar("M", bound=_PlainMachine[Any])


class _PlainReplica(_Notifying[R], Generic[M, R]):
    """A `_PlainMachine` on this node: applied, snapshotted and restored, nothing more."""

    def __init__(
        self,
        machine_type: type[M],
        limits: StateLimits,
        on_applied: Callable[[R], None] | None,
    ) -> None:
        super().__init__(on_applied)
        self._machine_type = machine_type
        self.machine = machine_type(limits)
        self._limits = limits

    def apply(self, command: bytes | memoryview, term: int) -> R:  # noqa: ARG002
        result: R = self.machine.apply(command)  # (terms matter to partitions only)
        self._notify(result)
        return result

    def settle(self) -> None:
        pass  # its applies have no effects outside the machine

    def snapshot(self) -> bytes:
        return self.machine.snapshot()

    def restore(self, data: bytes) -> None:
        self.machine = self._machine_type.restore(data, self._limits)


class MetadataReplica(_PlainReplica[MetadataStateMachine, MetadataResult]):
    """The controller's state machine on this node."""

    def __init__(
        self,
        limits: StateLimits = DEFAULT_LIMITS,
        on_applied: Callable[[MetadataResult], None] | None = None,
    ) -> None:
        super().__init__(MetadataStateMachine, limits, on_applied)


class OffsetsReplica(_PlainReplica[OffsetsStateMachine, OffsetsResult]):
    """An offsets partition's state machine on this node: its groups' offsets and records."""

    def __init__(
        self,
        limits: StateLimits = DEFAULT_LIMITS,
        on_applied: Callable[[OffsetsResult], None] | None = None,
    ) -> None:
        super().__init__(OffsetsStateMachine, limits, on_applied)


class TxnStateReplica(_PlainReplica[TxnStateMachine, TxnStateResult]):
    """A transaction state partition's machine on this node: its transactional ids."""

    def __init__(
        self,
        limits: StateLimits = DEFAULT_LIMITS,
        on_applied: Callable[[TxnStateResult], None] | None = None,
    ) -> None:
        super().__init__(TxnStateMachine, limits, on_applied)
