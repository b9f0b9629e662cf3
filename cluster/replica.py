"""Replicas: what a Raft group applies on this node, joining a pure state machine to its effects.

`PartitionReplica` applies an entry to the `PartitionStateMachine` and carries out the effect
it returns (append the batch to the segment store, move the log start); `MetadataReplica`
applies to the `MetadataStateMachine`. Both run only on the Raft driver thread and report every
result to `on_applied`, which the node uses to wake long-polls and to start or stop groups.

A storage failure after the state machine has applied an entry would leave the machine ahead of
its data; the replica then calls `fatal`, which stops the process, rather than go on diverged
(the entry is re-applied from the journal on restart).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from cluster.storage import PartitionStore
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.metadata import MetadataResult, MetadataStateMachine
from statemachine.partition import (
    Appended,
    LogStartAdvanced,
    PartitionResult,
    PartitionStateMachine,
)

R = TypeVar("R")
Fatal = Callable[[str], None]


class _Notifying(Generic[R]):
    def __init__(self, on_applied: Callable[[R], None] | None) -> None:
        self.on_applied = on_applied

    def _notify(self, result: R) -> None:
        if self.on_applied is not None:
            self.on_applied(result)


class PartitionReplica(_Notifying[PartitionResult]):
    """One partition's state machine and segment store, applied together."""

    def __init__(
        self,
        store: PartitionStore,
        fatal: Fatal,
        limits: StateLimits = DEFAULT_LIMITS,
        on_applied: Callable[[PartitionResult], None] | None = None,
    ) -> None:
        super().__init__(on_applied)
        self.store = store
        self.machine = PartitionStateMachine(limits)
        self._limits = limits
        self._fatal = fatal

    def apply(self, command: bytes) -> PartitionResult:
        result = self.machine.apply(command)
        try:
            if isinstance(result, Appended):
                count = result.last_offset - result.base_offset + 1
                self.store.append(result.base_offset, count, result.append_time_ms, result.batch)
            elif isinstance(result, LogStartAdvanced):
                self.store.delete_before(result.log_start_offset)
        except Exception as exc:  # any storage failure: the machine is now ahead of its data
            self._fatal(f"storage failed after apply: {exc!r}")
            raise
        self._notify(result)
        return result

    def snapshot(self) -> bytes:
        return self.machine.snapshot()

    def restore(self, data: bytes) -> None:
        self.machine = PartitionStateMachine.restore(data, self._limits)
        behind = self.store.next_offset < self.machine.log_end_offset
        if behind:
            # A snapshot from the leader covers records this replica never stored: start the
            # local log where the snapshot ends (as a Kafka follower does when the leader's log
            # start is past its end); older records are served by the replicas that have them.
            self.store.reset(self.machine.log_end_offset)

    @property
    def high_watermark(self) -> int:
        return self.machine.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return max(self.machine.log_start_offset, self.store.log_start_offset)


class MetadataReplica(_Notifying[MetadataResult]):
    """The controller's state machine on this node."""

    def __init__(
        self,
        limits: StateLimits = DEFAULT_LIMITS,
        on_applied: Callable[[MetadataResult], None] | None = None,
    ) -> None:
        super().__init__(on_applied)
        self.machine = MetadataStateMachine(limits)
        self._limits = limits

    def apply(self, command: bytes) -> MetadataResult:
        result = self.machine.apply(command)
        self._notify(result)
        return result

    def snapshot(self) -> bytes:
        return self.machine.snapshot()

    def restore(self, data: bytes) -> None:
        self.machine = MetadataStateMachine.restore(data, self._limits)
