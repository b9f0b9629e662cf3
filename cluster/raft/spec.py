"""What a Raft group is to the rest of the node: its machine, its spec, its status, its errors.

Role: the types other packages name (the broker's replicas, metrics, request frontend) and the
Raft modules share, kept apart from the code that implements them so that the adapter (which
needs the machine and the spec) and the group (which needs the adapter) import no cycle.

Rules: plain types only; no pysyncobj, no I/O. A proposal that does not produce a result is a
`ProposalError` carrying a retriable Kafka code and, where one is known, the leader to try.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cluster.errors import RaftbrokerError
from statemachine.errors import ErrorCode


class ReplicatedMachine(Protocol):
    """What a Raft group applies: deterministic, called only by the driver, on its loop."""

    def apply(self, command: bytes | memoryview, term: int) -> object:
        """`command` may be a view into the log's entry (no copy of a large batch): read it
        within the call, never keep it. `term` is the entry's: the term of the leader that
        appended it, the same on every replica (a partition's leader epoch)."""

    def settle(self) -> None:
        """After a run of applies, once their proposers heard: carry out what they left."""

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class ProposalError(RaftbrokerError):
    """A proposal that did not produce a result; `error` is retriable (NOT_LEADER_OR_FOLLOWER,
    or REQUEST_TIMED_OUT when the outcome is unknown), `leader` a hint."""


class ProposalQueueFullError(ProposalError):
    """The group holds as many proposals in flight as it may: refused before the log, so the
    command is known not to be in it. THROTTLING_QUOTA_EXCEEDED, the code the state machine
    gives a full table: retriable, and a Kafka client backs off before it retries (a timeout
    would say the outcome is unknown; NOT_ENOUGH_REPLICAS would blame replicas that are fine).
    """

    def __init__(self, pending_max: int) -> None:
        super().__init__(
            ErrorCode.THROTTLING_QUOTA_EXCEEDED, f"{pending_max} proposals in flight already"
        )


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One replica of a group: its name, its Raft address and its peers' Raft addresses.

    `route` names the group on the wire and must never name another group, even a deleted one
    of the same name: a replica left behind would otherwise talk to its successor.
    """

    name: str
    self_address: str
    peer_addresses: tuple[str, ...]
    directory: Path
    route: str
    # What status details call a replica (`node 2`), by Raft address; others show the address.
    labels: tuple[tuple[str, str], ...] = ()
    # The Raft address of the replica that stands for election first when the group is new
    # (a partition's first assigned replica, so that a new topic's leaders spread over the
    # nodes); the others wait longer at first. None: every replica draws its timeout alike.
    preferred_leader: str | None = None

    def label(self, address: str) -> str:
        return next((name for a, name in self.labels if a == address), address)


@dataclass(frozen=True, slots=True)
class GroupStatus:
    name: str
    is_leader: bool
    serving: bool
    leader_address: str | None
    term: int
    commit_index: int
    last_applied: int
    healthy: bool
    detail: str
    # On a leader, the Raft addresses of the replicas in sync (its own first), as Kafka's ISR:
    # see `RaftGroup`. Empty on a follower, which cannot tell.
    in_sync: tuple[str, ...] = ()
    # The bytes of its Raft log not yet compacted (its journal file; pysyncobj holds as many
    # in memory), bounded by `Limits.raft_log_bytes_max` and one tick's appends.
    log_bytes: int = 0
