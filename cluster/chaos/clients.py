"""What a chaos workload process needs of a client, one implementation per protocol
(`--client`): a producer session, a reader, a group member, and the settings both sides read.
`NativeClients` (native_clients.py) and `KafkaClients` (kafka_clients.py) implement it; the
processes (workload.py) are written against it alone, so their events are the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from statemachine.errors import ErrorCode

Record = Callable[[dict[str, object]], None]
# Errors after which the record is certainly not in the log.
DEFINITE = frozenset(
    {
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
)


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    topic: str
    partitions: int
    producers: int = 3
    send_interval_s: float = 0.004  # per producer
    outstanding_max: int = 200  # per producer: sends awaiting their outcome
    op_timeout_s: float = 20.0  # then the send is `info` (indeterminate)
    txn_restart_s: float = 8.0  # the transactional producer is replaced this often
    consumers: int = 1
    sink_batch_records: int = 60  # a streaming sink's micro-batch, over every partition
    sink_interval_s: float = 0.2
    sink_rerun_ratio: float = 0.3  # micro-batches run again by a new writer (Spark's replay)
    sink_cut_ratio: float = 0.2  # runs cut off mid-way first (a task killed mid-batch)
    group_members: int = 2  # the consumer group's members (native client runs only)
    group_session_timeout_ms: int = 6_000  # the broker's least
    group_heartbeat_interval_ms: int = 1_000
    group_member_restart_s: float = 5.0  # one member leaves and joins again this often
    committed_watch_interval_s: float = 0.2


class Sent(NamedTuple):
    """What came of one send: its outcome event's type (ok, fail, info) and fields (ok: offset,
    pid, epoch, sequence, and whatever else the client tells; fail and info: error)."""

    kind: str
    fields: dict[str, object]


class Ack(NamedTuple):
    """A raw batch acknowledged at `offset`; `duplicate`: the broker said it had it already
    (None: the protocol does not say, as Kafka's Produce does not)."""

    offset: int
    duplicate: bool | None


class Refused(NamedTuple):
    """A raw batch the broker refused definitely (an error of DEFINITE): not in the log."""

    error: str


class Session(Protocol):
    """One producer session (a producer id and epoch, which a client may not expose: -1)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def ended(self) -> bool:
        """True once the session can send no more (a fatal error, or a lost sequence)."""
        ...

    async def send(self, partition: int, value: bytes) -> Sent:
        """One record to `partition`, its outcome within the workload's op timeout."""
        ...

    def stats(self) -> dict[str, int]:
        """`retries` and `dedup_hits`, as the client counted them."""
        ...


class Reader(Protocol):
    async def poll(self) -> list[tuple[int, list[object]]]:
        """The next records of every partition, each `(partition, [offset, value, pid, epoch,
        sequence])` in the order read; ClientError or TimeoutError when a poll fails."""
        ...


class GroupPoll(NamedTuple):
    """What one poll of a group member brought: the generation and partitions it held, and
    its records (as `Reader.poll`'s)."""

    generation: int
    member_id: str
    owned: tuple[int, ...]
    rows: list[tuple[int, list[object]]]


class GroupReader(Protocol):
    async def poll(self) -> GroupPoll:
        """ClientError or TimeoutError when a poll fails."""
        ...

    async def commit(self, offsets: dict[int, int]) -> tuple[str, str]:
        """Commit the next offset of each partition: the outcome's type (ok; fail: the group
        moved on, nothing committed; info: unknown) and error name ("" for ok)."""
        ...


class Clients(Protocol):
    """How the processes reach the cluster: one implementation per client protocol."""

    def producer(self, process: str) -> AbstractAsyncContextManager[Session]:
        """An idempotent producer's session."""
        ...

    def transactional(
        self, process: str, transactional_id: str
    ) -> AbstractAsyncContextManager[Session]:
        """A new session of `transactional_id` (an epoch bump: older sessions are fenced);
        ClientError if none could be had."""
        ...

    def reader(self, process: str) -> AbstractAsyncContextManager[Reader]:
        """A consumer assigned every partition from the earliest offset (0: no retention)."""
        ...

    async def init_producer_id(self) -> tuple[int, int]:
        """A fresh idempotent producer id and epoch, for batches built by hand."""
        ...

    def group_member(self, process: str, group: str) -> AbstractAsyncContextManager[GroupReader]:
        """A member of consumer group `group`, subscribed to the topic (from the earliest
        offset where the group has no commit)."""
        ...

    async def produce_raw(self, partition: int, batch: bytes) -> Ack | Refused | None:
        """A record batch's bytes, as they are, until acknowledged or refused definitely,
        retrying everything else; None after the op timeout (the outcome is unknown)."""
        ...
