"""The idempotent Producer.

Rules the Producer keeps (docs/semantics.md, "The idempotent client"):
- per partition, sequences are assigned per record when a batch is sealed; at most 5 batches
  are in flight; a batch keeps its producer id, epoch and sequence for every resend;
- after a retriable failure (NOT_LEADER, timeout, disconnect, or OUT_OF_ORDER for a batch whose
  predecessor was still unacknowledged) the window drains, metadata is refreshed, and every
  unacknowledged batch is resent in order; a duplicate answer carries the original offsets;
- OUT_OF_ORDER for the first unacknowledged batch means the broker lost the session: those
  sends fail and the producer starts a new session (a new producer id, or an epoch bump);
- a definite rejection of a batch (e.g. CORRUPT_MESSAGE) fails it; later batches cannot have been
  accepted, so they are renumbered from its sequence; so does a retriable failure once the
  refreshed metadata says the partition does not exist (its topic was deleted):
  UNKNOWN_TOPIC_OR_PARTITION, at once rather than after `delivery_timeout_ms`;
- a record that cannot fit in a batch of its own (`batch_bytes_max`, 1 MiB, a cluster-wide
  limit) is refused by `send` with MESSAGE_TOO_LARGE naming its size and the limit, and a batch
  is sealed before the next record would take it past that limit;
- INVALID_PRODUCER_EPOCH / PRODUCER_FENCED are fatal for the producer and surface to the caller;
- a dead leader, a refused connection or a leader change is retried (the cluster forgets the
  dead address, believes a hint or refreshes metadata: `Client.reroute`) until a batch has
  waited `delivery_timeout_ms` since it was sealed; then the unacknowledged batches fail with a
  CallTimeoutError naming the partition and the last failure, and since they may have been
  appended after all, the producer starts a new session (their sequences are spent).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from cluster import native as p
from cluster.client.batches import (
    BATCH_BODY_BYTES_MAX,
    RECORD_OVERHEAD_BYTES,
    record_bytes,
    stable_partition,
    too_large,
)
from cluster.client.errors import ClientError, ProducerFencedError
from cluster.client.metadata import Client, Started
from cluster.client.retry import CallTimeoutError, Failure
from cluster.clock import wall_ms
from statemachine.errors import ErrorCode
from statemachine.records import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SEQUENCE_MODULUS,
    Record,
    encode_batch,
)

FENCED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})


class RecordMetadata(NamedTuple):
    """Where an acknowledged record is, and the producer identity it was written under.

    A NamedTuple, not a frozen dataclass: one is made per acknowledged record, and a frozen
    dataclass's __init__ (object.__setattr__ per field) cost 10% of a producer's CPU."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool
    producer_id: int
    producer_epoch: int
    sequence: int  # -1 for a producer that is not idempotent


@dataclass(slots=True)
class _Pending:
    record: Record
    future: asyncio.Future[RecordMetadata]


@dataclass(slots=True)
class _Batch:
    pending: list[_Pending]
    base_sequence: int
    encoded: bytes = b""
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    done: bool = False
    retry: bool = False
    failed: ErrorCode | None = None
    out_of_order: bool = False
    sealed_at: float = 0.0  # on the client's clock: the delivery timeout counts from here
    started: Started | None = None  # written by `send` itself, until the sender awaits it


@dataclass(slots=True)
class ProducerConfig:
    idempotent: bool = True
    transactional_id: str = ""
    transaction_timeout_ms: int = 60_000
    linger_ms: float = 2.0
    batch_size_bytes: int = 16_384
    max_in_flight: int = 5
    delivery_timeout_ms: int = 120_000
    retry_backoff_ms: int = 50
    request_timeout_ms: int = 10_000
    # Records queued but not acknowledged. Larger buffers cost more than they give: the
    # garbage collector walks every buffered record (half the client's CPU at 100,000).
    buffer_records_max: int = 10_000


class Producer:
    """An idempotent producer; `send` returns a future with the record's offset."""

    def __init__(
        self, cluster: Client, config: ProducerConfig | None = None, *, transactional: bool = False
    ) -> None:
        self.cluster = cluster
        self.config = config or ProducerConfig()
        # Batches marked transactional: a TransactionalProducer's
        # (cluster/client/transactions.py).
        # Without it, a transactional id only names the producer, fencing its predecessors.
        self.transactional = transactional
        self.producer_id = NO_PRODUCER_ID
        self.epoch = NO_PRODUCER_EPOCH
        self.fatal: ClientError | None = None
        self._senders: dict[tuple[str, int], _PartitionSender] = {}
        self._tasks: asyncio.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # kept: see Connection
        self._round_robin = itertools.count()
        self._buffered = 0
        self._space = asyncio.Event()
        self._space.set()
        self._session_lock = asyncio.Lock()
        self.stats = {"retries": 0, "duplicates": 0, "sessions": 0}

    async def __aenter__(self) -> Producer:
        self._loop = asyncio.get_running_loop()
        self._tasks = asyncio.TaskGroup()
        await self._tasks.__aenter__()
        if self.config.idempotent:
            await self.new_session()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        """Flush and stop; after an error in the block, stop without waiting for deliveries."""
        assert self._tasks is not None
        if exc is None:
            with contextlib.suppress(ClientError):
                await self.flush()
        else:
            self._abandon(ClientError(ErrorCode.UNKNOWN_SERVER_ERROR, "producer closed"))
        for sender in self._senders.values():
            sender.stop()
        if exc is None:
            await self._tasks.__aexit__(None, None, None)
            return
        # The block's own error propagates as it was raised, not wrapped in the senders'
        # ExceptionGroup (a caller's `except ValueError` must see its ValueError); what the
        # senders failed with, if anything, rides along as a note.
        try:
            await self._tasks.__aexit__(None, None, None)
        except BaseExceptionGroup as group:
            exc.add_note(f"the producer's senders failed too: {group!r}")

    def _abandon(self, error: ClientError) -> None:
        for sender in self._senders.values():
            sender.fail_all(error)

    async def new_session(self, expected: tuple[int, int] | None = None) -> None:
        """InitProducerId: a fresh producer id, or an epoch bump for a transactional id."""
        pid, epoch = expected or (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        request = p.InitProducerId(
            self.config.transactional_id, self.config.transaction_timeout_ms, pid, epoch
        )
        timeout_s = self.config.delivery_timeout_ms / 1000
        if self.config.transactional_id:
            response = await self.cluster.call_coordinator(
                self.config.transactional_id, request, timeout_s=timeout_s, key_type=p.TXN_KEY
            )
        else:
            response = await self.cluster.call_any(request, timeout_s=timeout_s)
        assert isinstance(response, p.InitProducerIdResponse)
        self.producer_id, self.epoch = response.producer_id, response.epoch
        self.stats["sessions"] += 1
        for sender in self._senders.values():
            sender.reset_sequences()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        headers: tuple[tuple[str, bytes], ...] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; the future resolves when it is acknowledged (acks=all)."""
        if self.fatal is not None:
            raise self.fatal
        partition = await self.partition_for(topic, key, partition)
        while self._buffered >= self.config.buffer_records_max:
            self._space.clear()
            await self._space.wait()
        stamp = wall_ms() if timestamp_ms is None else timestamp_ms
        record = Record(key, value, stamp, headers)
        if headers or len(value or b"") + len(key or b"") > BATCH_BODY_BYTES_MAX // 2:
            refused = too_large(record)  # rare: off the common path's cost
            if refused is not None:
                raise refused
        assert self._loop is not None, "use `async with Producer(...)`"
        future: asyncio.Future[RecordMetadata] = self._loop.create_future()
        self._sender(topic, partition).add(_Pending(record, future))
        self._buffered += 1
        return future

    async def partition_for(self, topic: str, key: bytes | None, partition: int | None) -> int:
        """Where `send` puts a record: `partition` if it exists, else by the key's hash, or
        round robin without a key."""
        infos = self.cluster.cached_partitions(topic) or await self.cluster.partitions(topic)
        if partition is None:
            partition = (
                stable_partition(key, len(infos))
                if key is not None
                else next(self._round_robin) % len(infos)
            )
        if not 0 <= partition < len(infos):
            raise ClientError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")
        return partition

    def _sender(self, topic: str, partition: int) -> _PartitionSender:
        sender = self._senders.get((topic, partition))
        if sender is None:
            assert self._tasks is not None, "use `async with Producer(...)`"
            sender = _PartitionSender(self, topic, partition)
            self._senders[(topic, partition)] = sender
            self._tasks.create_task(sender.run())
        return sender

    def _released(self, count: int) -> None:
        self._buffered -= count
        self._space.set()

    async def flush(self) -> None:
        """Until every record sent so far is acknowledged or failed."""
        for sender in list(self._senders.values()):
            await sender.flush()
        if self.fatal is not None:
            raise self.fatal


class _PartitionSender:
    """Batches, sequences and (re)sends one partition's records, in order."""

    def __init__(self, producer: Producer, topic: str, partition: int) -> None:
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.accumulating: list[_Pending] = []
        self.accumulated_bytes = 0
        self.unacked: deque[_Batch] = deque()
        self.next_sequence = 0
        self.wakeup = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.stopping = False
        self.flushing = False
        # The task is waiting, for a record or for answers: `add` may write a batch itself.
        self.parked = False
        self.first_added_at = 0.0
        self.last_failure: Failure | None = None  # for the message when delivery times out

    def add(self, pending: _Pending) -> None:
        first = not self.accumulating
        if first:
            self.first_added_at = time.monotonic()
        self.accumulating.append(pending)
        self.accumulated_bytes += len(pending.record.value or b"") + len(pending.record.key or b"")
        self.idle.clear()
        if first and self._may_write_now():
            self._write_now()
        # Wake the sender when a linger starts (it may be idle) and when a batch is full.
        if first or self.accumulated_bytes >= self.producer.config.batch_size_bytes:
            self.wakeup.set()

    def _may_write_now(self) -> bool:
        """Whether `add` may seal and write a batch of the one record it added, in the
        caller's turn of the loop: with linger 0, while the task waits and every batch
        before it is acknowledged (so it goes out as the first unacknowledged one, as the
        task would send it), but a turn sooner: the task's wakeup is off the path."""
        config = self.producer.config
        return (
            self.parked
            and config.linger_ms <= 0
            and len(self.unacked) < config.max_in_flight
            and all(batch.done for batch in self.unacked)
            and not self.stopping
        )

    def _write_now(self) -> None:
        chosen, self.accumulating = self.accumulating, []
        batch = self._seal(chosen, self.accumulated_bytes)  # its one record: a batch of its own
        address = self.producer.cluster.leader_address(self.topic, self.partition)
        if address is not None:  # else the task finds the leader, as for any batch
            on_answer = partial(self._acknowledged, batch)
            request = self._request(batch)
            batch.started = self.producer.cluster.start(
                address, request, self._answer_timeout_s(), on_answer
            )

    def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()

    async def flush(self) -> None:
        self.flushing = True
        self.wakeup.set()
        try:
            await self.idle.wait()
        finally:
            self.flushing = False

    def reset_sequences(self) -> None:
        self.next_sequence = 0

    async def run(self) -> None:
        while True:
            if not self.accumulating and not self.unacked:
                self.idle.set()
                if self.stopping:
                    return
                self.wakeup.clear()
                self.parked = True
                try:
                    await self.wakeup.wait()
                finally:
                    self.parked = False
                continue
            if self.accumulating and not self.unacked and self.producer.config.linger_ms > 0:
                await self._linger()
            self._seal_batches()
            await self._send_window()

    async def _linger(self) -> None:
        """Give a batch that is not full a moment (linger_ms) to fill."""
        config = self.producer.config
        remaining_s = config.linger_ms / 1000 - (time.monotonic() - self.first_added_at)
        full = self.accumulated_bytes >= config.batch_size_bytes
        if remaining_s > 0 and not full and not self.stopping and not self.flushing:
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), remaining_s)

    def _seal_batches(self) -> None:
        config = self.producer.config
        while self.accumulating and len(self.unacked) < config.max_in_flight:
            take, size = 0, 0
            while take < len(self.accumulating) and (size < config.batch_size_bytes or take == 0):
                record = self.accumulating[take].record
                added = len(record.value or b"") + len(record.key or b"") + RECORD_OVERHEAD_BYTES
                if record.headers:
                    added = record_bytes(record)
                if take and size + added > BATCH_BODY_BYTES_MAX:
                    break  # the next batch takes it: this one would pass batch_bytes_max
                size += added
                take += 1
            chosen = self.accumulating[:take]
            del self.accumulating[:take]  # in place: no copy of the rest of the buffer
            self._seal(chosen, size)

    def _seal(self, chosen: list[_Pending], size: int) -> _Batch:
        """`chosen` (taken from `accumulating`, `size` bytes by `record_bytes`) as the next
        batch: numbered, encoded, unacknowledged."""
        self.accumulated_bytes = max(0, self.accumulated_bytes - size)
        batch = _Batch(chosen, self.next_sequence, sealed_at=self.producer.cluster.retry.clock())
        self._encode(batch)
        self.next_sequence = (self.next_sequence + len(chosen)) % SEQUENCE_MODULUS
        self.unacked.append(batch)
        return batch

    def _encode(self, batch: _Batch) -> None:
        producer = self.producer
        records = tuple([pd.record for pd in batch.pending])
        if producer.config.idempotent:
            identity = producer.producer_id, producer.epoch, batch.base_sequence
        else:
            identity = NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE
        batch.encoded = encode_batch(*identity, records, transactional=producer.transactional)
        batch.producer_id, batch.producer_epoch = identity[0], identity[1]

    async def _send_window(self) -> None:
        """Send every unacknowledged batch (at most max_in_flight), then settle the outcome.
        A batch `add` wrote is awaited here, not sent again (its answer may be in already)."""
        window = [b for b in self.unacked if not b.done or b.started is not None]
        del window[self.producer.config.max_in_flight :]
        if not window:
            return
        first = next((b for b in window if not b.done), window[0])
        for batch in window:
            batch.retry = batch.out_of_order = False
            batch.failed = None
        self.parked = True
        try:
            if len(window) == 1:
                await self._send(window[0])  # the common case: no task to create and wait for
            else:
                await asyncio.gather(*(self._send(batch) for batch in window))
        finally:
            self.parked = False
        # OUT_OF_ORDER is only final for the batch that was the first unacknowledged one when
        # the window went out; for a later one its predecessor was still in flight: retry it.
        await self._settle(session_lost=first.out_of_order)

    def _answer_timeout_s(self) -> float:
        # The broker's own timeout, and a second for the answer to come back.
        return self.producer.config.request_timeout_ms / 1000 + 1

    def _request(self, batch: _Batch) -> p.Produce:
        entry = p.ProduceEntry(self.topic, self.partition, batch.encoded)
        return p.Produce(self.producer.config.request_timeout_ms, (entry,))

    async def _send(self, batch: _Batch) -> None:
        cluster = self.producer.cluster
        started, batch.started = batch.started, None
        try:
            if started is not None:
                response = await cluster.finish(started)
            else:
                response = await cluster.send_to_leader(
                    self.topic,
                    self.partition,
                    self._request(batch),
                    self._answer_timeout_s(),
                    partial(self._acknowledged, batch),
                )
        except ClientError as exc:
            batch.retry = True
            self.last_failure = Failure.of(exc)
            await cluster.reroute(self.topic, self.partition, exc)
            self._unless_gone(batch)
            return
        assert isinstance(response, p.ProduceResponse)
        result = response.results[0]
        error = ErrorCode(result.error)
        if error == ErrorCode.NONE:
            self._acknowledged(batch, response)  # done already, unless the answer came late
        elif error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
            batch.out_of_order = True
        elif error.retriable:
            batch.retry = True
            answered_by = cluster.leader_address(self.topic, self.partition) or ""
            self.last_failure = Failure(error, answered_by)
            await cluster.reroute(self.topic, self.partition, hint=result.leader)
            self._unless_gone(batch)
        else:
            batch.failed = error

    def _unless_gone(self, batch: _Batch) -> None:
        """A batch to retry fails instead once metadata (refreshed by the reroute) says its
        partition does not exist: its topic was deleted, and no retry can succeed."""
        if self.producer.cluster.rules_out(self.topic, self.partition):
            batch.retry = False
            batch.failed = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def _acknowledged(self, batch: _Batch, response: p.Response) -> None:
        """From the connection, the moment the answer is decoded: an acknowledged batch's
        records resolve now, so their awaiters run before this sender's task does (which
        then sends what they queued meanwhile, in the same turn of the loop)."""
        if not isinstance(response, p.ProduceResponse) or not response.results:
            return  # `_send` sees it
        result = response.results[0]
        if result.error == ErrorCode.NONE and not batch.done:
            batch.done = True
            self.producer.stats["duplicates"] += result.duplicate
            self._resolve(batch, result)

    def _resolve(self, batch: _Batch, result: p.ProduceResult) -> None:
        idempotent = batch.base_sequence >= 0 and self.producer.config.idempotent
        for i, pending in enumerate(batch.pending):
            if not pending.future.done():
                pending.future.set_result(
                    RecordMetadata(
                        self.topic,
                        self.partition,
                        result.base_offset + i,
                        result.append_time_ms,
                        result.duplicate,
                        batch.producer_id,
                        batch.producer_epoch,
                        (batch.base_sequence + i) % SEQUENCE_MODULUS if idempotent else -1,
                    )
                )

    async def _settle(self, *, session_lost: bool) -> None:
        """After a window: release acked batches; decide retries, renumbering, new sessions."""
        producer = self.producer
        clock = producer.cluster.retry.clock  # delivery timeouts: the client's clock
        while self.unacked and self.unacked[0].done and self.unacked[0].started is None:
            producer._released(len(self.unacked.popleft().pending))
        if not self.unacked or self.unacked[0].started is not None:
            return  # what is left went out since the window did: the next window awaits it
        first = self.unacked[0]
        if first.failed in FENCED:
            self._fail_producer(ProducerFencedError(first.failed, "fenced by a newer instance"))
        elif first.failed is not None:
            error = ClientError(first.failed, f"{self.topic}-{self.partition}")
            self._fail_batch(self.unacked.popleft(), error)
            self._renumber(first.base_sequence)
        elif session_lost:
            lost = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
            await self._restart_session(ClientError(lost, f"{self.topic}-{self.partition}"))
        elif clock() - first.sealed_at >= producer.config.delivery_timeout_ms / 1000:
            await self._restart_session(self._delivery_timed_out())
        else:
            producer.stats["retries"] += 1
            await asyncio.sleep(producer.config.retry_backoff_ms / 1000)

    def _delivery_timed_out(self) -> CallTimeoutError:
        waited_for = f"no leader for {self.topic}-{self.partition} answered"
        timeout_s = self.producer.config.delivery_timeout_ms / 1000
        return CallTimeoutError(waited_for, timeout_s, self.last_failure)

    def _fail_batch(self, batch: _Batch, error: ClientError) -> None:
        self._forget(batch)
        for pending in batch.pending:
            if not pending.future.done():
                pending.future.set_exception(error)
        self.producer._released(len(batch.pending))

    def _renumber(self, base_sequence: int) -> None:
        """Later batches cannot have been accepted past a rejected one: re-stamp them."""
        sequence = base_sequence
        for batch in self.unacked:
            batch.base_sequence = sequence
            self._encode(batch)
            sequence = (sequence + len(batch.pending)) % SEQUENCE_MODULUS
        self.next_sequence = sequence

    async def _restart_session(self, error: ClientError) -> None:
        """The broker lost this session's state, or the unacknowledged sends may or may not
        have been appended: fail them with `error`, and start anew (their sequences are spent)."""
        while self.unacked:
            self._fail_batch(self.unacked.popleft(), error)
        producer = self.producer
        async with producer._session_lock:
            expected = None
            if producer.config.transactional_id:
                expected = (producer.producer_id, producer.epoch)
            try:
                await producer.new_session(expected)
            except ClientError as exc:  # no new session within the delivery timeout: done
                self._fail_producer(exc)

    def _forget(self, batch: _Batch) -> None:
        if batch.started is not None:
            self.producer.cluster.forget(batch.started)
            batch.started = None

    def _fail_producer(self, error: ClientError) -> None:
        self.producer.fatal = error
        self.producer._abandon(error)

    def fail_all(self, error: ClientError) -> None:
        """Fail every record not yet acknowledged, and stop."""
        for batch in self.unacked:
            self._forget(batch)
        pending = [p for b in self.unacked for p in b.pending] + self.accumulating
        for item in pending:
            if not item.future.done():
                item.future.set_exception(error)
        self.producer._released(len(pending))
        self.unacked.clear()
        self.accumulating = []
        self.idle.set()
        self.stop()
