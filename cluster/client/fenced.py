"""Fenced writes: a streaming sink's micro-batch, appended exactly once however often it is run.

Role: `FencedWriter` is what a streaming sink (Spark's, in `pipeline/`) writes one micro-batch
of one writer (one Spark task) with. Spark may run a micro-batch again after a crash; the
records it then writes again must not appear twice. Each partition's records go out as parts,
one entry each, fenced by `(sink, writer, batch_id, part)`; the partition appends a part only
if it is beyond the last one it appended for that `(sink, writer)`
(statemachine/sink_fences.py), and fence and records are one Raft entry.

Rules:
- Parts must be the same on every run of a micro-batch: the same records in the same order go
  to the same partitions and are cut at the same places. Partitions come from the record, or
  from its key (`stable_partition`), or else from its position among the keyless records of its
  topic, never from a clock or a random choice; parts are cut by size alone.
- One part in flight per partition (the next waits for the answer), so parts never overtake
  each other; partitions proceed in parallel.
- A dead leader, a refused connection or a leader change is ridden out by the Client's
  `call_leader` until the part has waited `delivery_timeout_s`; then the write fails with a
  CallTimeoutError naming the partition and the last failure (a rerun completes it).
- Parts also carry a producer session (id, epoch, sequence), so a retry after a lost answer is
  recognised with its offsets; a session the broker no longer knows is simply replaced: the
  fence, not the session, is what makes a rerun safe.
- The session belongs to the transactional id `raftbroker-sink/<sink>/<writer>`: every run of
  a writer bumps the epoch of one producer id, so a partition keeps one producer entry per
  writer however many micro-batches a query runs (a fresh id per run would fill its producer
  table), and a run overtaken by a newer one of the same writer (a zombie Spark task) is
  fenced: it stops with ProducerFencedError instead of writing on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from cluster import native as p
from cluster.client.batches import record_bytes, stable_partition
from cluster.client.errors import ClientError, ProducerFencedError
from cluster.client.metadata import Client
from cluster.clock import wall_ms
from statemachine.errors import ErrorCode
from statemachine.limits import DEFAULT_LIMITS
from statemachine.records import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    SEQUENCE_MODULUS,
    Record,
    RecordBatch,
)

# Answers after which a new producer session is started and the part sent again.
_SESSION_LOST = frozenset({ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID})
# A newer run of this writer took its transactional id: this one must stop.
_OVERTAKEN = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
TRANSACTIONAL_ID_PREFIX = "raftbroker-sink/"
_TRANSACTION_TIMEOUT_MS = 60_000
SINK_BYTES_MAX = 200  # room in a transactional id for the prefix and the writer number


class SinkRecord(NamedTuple):
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None


@dataclass(slots=True)
class FencedWriteReport:
    """What one `write` did: records appended now, and records an earlier run had appended."""

    appended_records: int = 0
    replayed_records: int = 0
    parts: int = 0
    sessions: int = 0


@dataclass(frozen=True, slots=True)
class FencedWriterConfig:
    part_bytes_max: int = 512 * 1024
    part_records_max: int = 10_000
    request_timeout_s: float = 10.0
    delivery_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not 0 < self.part_bytes_max <= DEFAULT_LIMITS.batch_bytes_max // 2:
            raise ValueError("part_bytes_max must be positive and at most half a batch")
        if not 0 < self.part_records_max <= DEFAULT_LIMITS.batch_records_max:
            raise ValueError("part_records_max must be positive and within batch_records_max")


class _Part(NamedTuple):
    topic: str
    partition: int
    batch_id: int
    number: int
    records: tuple[Record, ...]


@dataclass(slots=True)
class _Session:
    producer_id: int = NO_PRODUCER_ID
    epoch: int = NO_PRODUCER_EPOCH
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)


class FencedWriter:
    """Writes micro-batches of one writer of one sink; see the module docstring."""

    def __init__(
        self,
        cluster: Client,
        sink: str,
        writer: int,
        config: FencedWriterConfig | None = None,
    ) -> None:
        if writer < 0:
            raise ValueError("a writer number is not negative")
        self.transactional_id = f"{TRANSACTIONAL_ID_PREFIX}{sink}/{writer}"
        if not sink or len(self.transactional_id.encode()) > DEFAULT_LIMITS.name_length_max:
            raise ValueError(f"a sink id is 1 to {SINK_BYTES_MAX} bytes")
        self.cluster = cluster
        self.sink = sink
        self.writer = writer
        self.config = config or FencedWriterConfig()
        self._session = _Session()
        self._session_lock = asyncio.Lock()
        # Parts answered, over every write: what an observer (a progress bar, a test) watches.
        self.parts_done = 0
        self.part_done = asyncio.Event()  # set at each; the observer clears it

    async def write(self, batch_id: int, records: Iterable[SinkRecord]) -> FencedWriteReport:
        """Append `records` as micro-batch `batch_id`, unless an earlier run already did."""
        if batch_id < 0:
            raise ValueError("a batch id is not negative")
        by_partition = await self._route(records)
        report = FencedWriteReport()
        if not by_partition:
            return report  # an empty task: no session, no metadata write
        if self._session.producer_id < 0:
            await self._new_session(report)
        try:
            async with asyncio.TaskGroup() as tasks:
                for (topic, partition), part_records in by_partition.items():
                    tasks.create_task(
                        self._write_partition(topic, partition, batch_id, part_records, report)
                    )
        except ExceptionGroup as group:  # the first partition's failure, as it was raised
            raise _first_leaf(group) from group
        return report

    async def _route(self, records: Iterable[SinkRecord]) -> dict[tuple[str, int], list[Record]]:
        routed: dict[tuple[str, int], list[Record]] = {}
        keyless: dict[str, int] = {}
        now_ms = wall_ms()
        for r in records:
            infos = await self.cluster.partitions(r.topic, timeout_s=self.config.delivery_timeout_s)
            count = len(infos)
            partition = r.partition
            if partition is None:
                if r.key is not None:
                    partition = stable_partition(r.key, count)
                else:
                    partition = keyless.get(r.topic, 0) % count
                    keyless[r.topic] = keyless.get(r.topic, 0) + 1
            if not 0 <= partition < count:
                raise ClientError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{r.topic}-{partition}")
            stamp = now_ms if r.timestamp_ms is None else r.timestamp_ms
            record = Record(r.key, r.value, stamp, r.headers)
            routed.setdefault((r.topic, partition), []).append(record)
        return routed

    def _parts(self, records: list[Record]) -> list[tuple[Record, ...]]:
        """Cut by size and count alone, so every run cuts the same parts."""
        parts: list[tuple[Record, ...]] = []
        start, size = 0, 0
        for i, r in enumerate(records):
            r_bytes = record_bytes(r)
            full = size + r_bytes > self.config.part_bytes_max
            if i > start and (full or i - start >= self.config.part_records_max):
                parts.append(tuple(records[start:i]))
                start, size = i, 0
            size += r_bytes
        if start < len(records):
            parts.append(tuple(records[start:]))
        return parts

    async def _write_partition(
        self,
        topic: str,
        partition: int,
        batch_id: int,
        records: list[Record],
        report: FencedWriteReport,
    ) -> None:
        for number, records_of_part in enumerate(self._parts(records)):
            part = _Part(topic, partition, batch_id, number, records_of_part)
            appended = await self._send_part(part, report)
            report.parts += 1
            self.parts_done += 1
            self.part_done.set()
            if appended:
                report.appended_records += len(records_of_part)
            else:
                report.replayed_records += len(records_of_part)

    async def _send_part(self, part: _Part, report: FencedWriteReport) -> bool:
        """Until the part is answered: True if appended by this run, False if by an earlier."""
        topic, partition, batch_id, number, records = part
        clock = self.cluster.retry.clock  # the client's: a test drives the deadline
        deadline = clock() + self.config.delivery_timeout_s
        while True:
            session, key = self._session, (topic, partition)
            sequence = session.sequences.get(key, 0)
            batch = RecordBatch(session.producer_id, session.epoch, sequence, records).encode()
            result = await self._request(topic, partition, batch, (batch_id, number), deadline)
            error = ErrorCode(result.error)
            if error == ErrorCode.NONE:
                appended = not result.duplicate or result.base_offset >= 0
                if appended:  # by this run: the session's sequence moved on
                    session.sequences[key] = (sequence + len(records)) % SEQUENCE_MODULUS
                return appended
            if error in _OVERTAKEN:
                raise ProducerFencedError(error, f"{self.transactional_id}: a newer run took over")
            if error not in _SESSION_LOST or clock() > deadline:
                raise ClientError(error, f"{topic}-{partition}: part {number} of batch {batch_id}")
            await self._new_session(report, lost=session)

    async def _request(
        self, topic: str, partition: int, batch: bytes, fence: tuple[int, int], deadline: float
    ) -> p.ProduceResult:
        """The leader's answer to one part, riding out failovers until `deadline`."""
        timeout_ms = int(self.config.request_timeout_s * 1000)
        request = p.FencedProduce(
            timeout_ms, p.ProduceEntry(topic, partition, batch), self.sink, self.writer, *fence
        )
        response = await self.cluster.call_leader(
            topic,
            partition,
            request,
            timeout_s=max(0.0, deadline - self.cluster.retry.clock()),
            request_timeout_s=self.config.request_timeout_s + 1,
        )
        assert isinstance(response, p.ProduceResponse)
        return response.results[0]

    async def _new_session(self, report: FencedWriteReport, lost: _Session | None = None) -> None:
        """The next epoch of this writer's producer id (its first session: whatever came last)."""
        async with self._session_lock:
            if lost is not None and self._session is not lost:
                return  # another partition's task replaced it already
            current = self._session
            request = p.InitProducerId(
                self.transactional_id, _TRANSACTION_TIMEOUT_MS, current.producer_id, current.epoch
            )
            try:
                response = await self.cluster.call_any(
                    request, timeout_s=self.config.delivery_timeout_s
                )
            except ClientError as exc:
                if exc.error in _OVERTAKEN:
                    raise ProducerFencedError(exc.error, str(exc)) from exc
                raise
            assert isinstance(response, p.InitProducerIdResponse)
            self._session = _Session(response.producer_id, response.epoch)
            report.sessions += 1


def _first_leaf(group: BaseExceptionGroup[Exception]) -> Exception:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
