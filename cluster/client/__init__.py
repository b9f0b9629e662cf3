"""The client library: connections, cluster metadata, Admin, the idempotent Producer, Consumer.

Rules the Producer keeps (SEMANTICS.md, "What the idempotent client must do"):
- per partition, sequences are assigned per record when a batch is sealed; at most 5 batches
  are in flight; a batch keeps its producer id, epoch and sequence for every resend;
- after a retriable failure (NOT_LEADER, timeout, disconnect, or OUT_OF_ORDER for a batch whose
  predecessor was still unacknowledged) the window drains, metadata is refreshed, and every
  unacknowledged batch is resent in order; a duplicate answer carries the original offsets;
- OUT_OF_ORDER for the first unacknowledged batch means the broker lost the session: those
  sends fail and the producer starts a new session (a new producer id, or an epoch bump);
- a definite rejection of a batch (e.g. CORRUPT_MESSAGE) fails it; later batches cannot have been
  accepted, so they are renumbered from its sequence;
- INVALID_PRODUCER_EPOCH / PRODUCER_FENCED are fatal for the producer and surface to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, cast

from cluster import protocol as p
from statemachine.errors import ErrorCode
from statemachine.records import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SEQUENCE_MODULUS,
    Record,
    RecordBatch,
)

log = logging.getLogger(__name__)
FENCED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})


OnAnswer = Callable[[p.Response], None]


class _Waiting(NamedTuple):
    """A request sent on a connection, until its answer or its end."""

    request_type: type[p.Request]
    future: asyncio.Future[Any]
    on_answer: OnAnswer | None


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class ClientError(Exception):
    """An error answer from a broker (or a client-side failure with a Kafka code)."""

    def __init__(self, error: ErrorCode, message: str = "", leader: str = "") -> None:
        super().__init__(f"{error.name}: {message}" if message else error.name)
        self.error = error
        self.leader = leader

    @property
    def retriable(self) -> bool:
        return self.error.retriable


class Connection(asyncio.Protocol):
    """One TCP connection to a broker, with pipelined requests matched by correlation id.

    An `asyncio.Protocol`: answers are cut out of `data_received` and handed to their
    requests there, with no reader task between the socket and the caller; a request's
    `on_answer` is even called there, before its awaiter wakes.
    """

    def __init__(self, address: str, frame_bytes_max: int) -> None:
        self.address = address
        self._frame_bytes_max = frame_bytes_max
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        self._transport: asyncio.Transport | None = None
        self._inbuf = bytearray()
        self._drained: asyncio.Future[None] | None = None  # while the broker is not reading
        # Kept: asyncio.get_running_loop() is a getpid() syscall per call in Python 3.11.
        self._loop = asyncio.get_running_loop()
        self._lost = self._loop.create_future()
        self.closed = False

    @classmethod
    async def open(
        cls, address: str, timeout_s: float, frame_bytes_max: int = 8 << 20
    ) -> Connection:
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        connection = cls(address, frame_bytes_max)
        async with asyncio.timeout(timeout_s):
            await loop.create_connection(lambda: connection, host, int(port))
        return connection

    async def request(
        self, request: p.Request, timeout_s: float, on_answer: OnAnswer | None = None
    ) -> p.Response:
        """Send and await the answer; ClientError for an error answer or a broken connection,
        TimeoutError after `timeout_s`. `on_answer` gets a good answer the moment it is
        decoded, a turn of the loop before this returns it."""
        transport = self._transport
        if self.closed or transport is None or transport.is_closing():
            raise ClientError(ErrorCode.NETWORK_EXCEPTION, f"connection to {self.address} closed")
        correlation_id = next(self._ids) & 0x7FFF_FFFF
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()
        # A timer on the future, not asyncio.timeout(): no task cancellation to undo, and a
        # third of the cost on the path of every request.
        timer = loop.call_later(timeout_s, _expire, future)
        self._waiting[correlation_id] = _Waiting(type(request), future, on_answer)
        try:
            transport.write(p.encode_request(correlation_id, request))
            if self._drained is not None:
                await asyncio.wait((self._drained, future), return_when=asyncio.FIRST_COMPLETED)
            response: p.Response = await future
            return response
        except (ConnectionError, OSError, RuntimeError) as exc:
            # RuntimeError: uvloop's answer to a write on a transport the peer just closed,
            # before we noticed (found by the chaos harness).
            await self.close()
            raise ClientError(ErrorCode.NETWORK_EXCEPTION, str(exc)) from exc
        finally:
            timer.cancel()
            self._waiting.pop(correlation_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # failed by close() while we raise our own: retrieved

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: no Transport subclass

    def data_received(self, data: bytes) -> None:
        buf = self._inbuf
        buf += data
        offset = 0
        while True:
            try:
                frame = p.take_frame(buf, offset, self._frame_bytes_max)
            except p.ProtocolError as exc:  # an oversize answer: the stream is lost
                self._fail_all(ClientError(ErrorCode.NETWORK_EXCEPTION, exc.message))
                self._abort()
                return
            if frame is None:
                break
            body, offset = frame
            self._deliver(body)
        del buf[:offset]

    def pause_writing(self) -> None:
        self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        error = ClientError(ErrorCode.NETWORK_EXCEPTION, repr(exc) if exc else "closed")
        self._fail_all(error)
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_exception(ConnectionResetError(str(error)))
            drained.exception()  # nobody may be waiting for it
        if not self._lost.done():
            self._lost.set_result(None)

    # -- answers -----------------------------------------------------------------------------

    def _deliver(self, body: bytes) -> None:
        try:
            correlation_id, error, payload = p.split_response(body)
        except p.ProtocolError as exc:
            if exc.correlation_id is not None:
                self._fail(exc.correlation_id, ClientError(ErrorCode.CORRUPT_MESSAGE, str(exc)))
            return  # else an answer nobody can be matched to
        waiting = self._waiting.get(correlation_id)
        if waiting is None or waiting.future.done():
            return  # the caller gave up on it (timeout)
        try:
            answer = p.load_response(correlation_id, error, payload, waiting.request_type)
        except p.ProtocolError as exc:
            waiting.future.set_exception(ClientError(ErrorCode.CORRUPT_MESSAGE, str(exc)))
            return
        if isinstance(answer, p.ErrorResponse):
            info = answer.info
            waiting.future.set_exception(ClientError(answer.error, info.message, info.leader))
            return
        if waiting.on_answer is not None:
            waiting.on_answer(answer)
        waiting.future.set_result(answer)

    def _fail(self, correlation_id: int, error: ClientError) -> None:
        waiting = self._waiting.get(correlation_id)
        if waiting is not None and not waiting.future.done():
            waiting.future.set_exception(error)

    def _fail_all(self, error: ClientError) -> None:
        for waiting in self._waiting.values():
            if not waiting.future.done():
                waiting.future.set_exception(error)

    def _abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        self.closed = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        if self._transport is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._lost)
        self._fail_all(ClientError(ErrorCode.NETWORK_EXCEPTION, "connection closed"))


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader_id: int
    replicas: tuple[int, ...]


class Cluster:
    """Bootstrap addresses, a connection per broker, and a metadata cache."""

    def __init__(self, bootstrap: Sequence[str], *, request_timeout_s: float = 10.0) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address (host:port) is needed")
        self.bootstrap = list(bootstrap)
        self.request_timeout_s = request_timeout_s
        self._connections: dict[str, Connection] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._brokers: dict[int, str] = {}
        self._partitions: dict[str, tuple[PartitionInfo, ...]] = {}

    def _open_connection(self, address: str) -> Connection | None:
        conn = self._connections.get(address)
        return None if conn is None or conn.closed else conn

    async def connection(self, address: str) -> Connection:
        """The one connection to `address`: requests on it keep their order at the broker."""
        conn = self._open_connection(address)
        if conn is not None:
            return conn
        async with self._opening.setdefault(address, asyncio.Lock()):
            conn = self._open_connection(address)
            if conn is None:
                try:
                    conn = await Connection.open(address, self.request_timeout_s)
                except (OSError, TimeoutError) as exc:
                    raise ClientError(ErrorCode.NETWORK_EXCEPTION, f"{address}: {exc!r}") from exc
                self._connections[address] = conn
            return conn

    async def send(
        self,
        address: str,
        request: p.Request,
        timeout_s: float | None = None,
        on_answer: OnAnswer | None = None,
    ) -> p.Response:
        timeout = timeout_s or self.request_timeout_s
        # An open connection without a coroutine: this is on the path of every produce.
        conn = self._open_connection(address) or await self.connection(address)
        try:
            return await conn.request(request, timeout, on_answer)
        except TimeoutError as exc:
            raise ClientError(ErrorCode.REQUEST_TIMED_OUT, address) from exc

    def addresses(self) -> list[str]:
        known = [a for _, a in sorted(self._brokers.items())]
        return known + [a for a in self.bootstrap if a not in known]

    async def send_any(self, request: p.Request, timeout_s: float | None = None) -> p.Response:
        """Send to the first broker that answers (bootstrap and known brokers)."""
        last: ClientError | None = None
        for address in self.addresses():
            try:
                return await self.send(address, request, timeout_s)
            except ClientError as exc:
                if exc.error not in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT):
                    raise
                last = exc
        raise last or ClientError(ErrorCode.NETWORK_EXCEPTION, "no broker reachable")

    async def refresh(self, topics: Iterable[str] = ()) -> p.MetadataResponse:
        response = await self.send_any(p.Metadata(tuple(topics)))
        assert isinstance(response, p.MetadataResponse)
        self._brokers = {b.node_id: b.address for b in response.brokers}
        for t in response.topics:
            if t.error == ErrorCode.NONE:
                self._partitions[t.name] = tuple(
                    PartitionInfo(t.name, pm.partition, pm.leader_id, pm.replicas)
                    for pm in t.partitions
                )
            else:
                self._partitions.pop(t.name, None)
        return response

    def cached_partitions(self, topic: str) -> tuple[PartitionInfo, ...] | None:
        """The partitions of a topic from the metadata cache, without a round trip."""
        return self._partitions.get(topic)

    async def partitions(self, topic: str) -> tuple[PartitionInfo, ...]:
        if topic not in self._partitions:
            await self.refresh([topic])
        found = self._partitions.get(topic)
        if found is None:
            raise ClientError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, topic)
        return found

    def leader_address(self, topic: str, partition: int) -> str | None:
        """The known leader, else a replica to ask (it answers with a hint)."""
        infos = self._partitions.get(topic, ())
        if partition >= len(infos):
            return None
        info = infos[partition]
        if info.leader_id in self._brokers:
            return self._brokers[info.leader_id]
        replicas = [self._brokers[r] for r in info.replicas if r in self._brokers]
        return replicas[0] if replicas else None

    def note_leader(self, topic: str, partition: int, address: str) -> None:
        """A NOT_LEADER hint: believe it until the next refresh."""
        node_id = next((n for n, a in self._brokers.items() if a == address), None)
        infos = list(self._partitions.get(topic, ()))
        if node_id is not None and partition < len(infos):
            old = infos[partition]
            infos[partition] = PartitionInfo(topic, partition, node_id, old.replicas)
            self._partitions[topic] = tuple(infos)

    async def send_to_leader(
        self,
        topic: str,
        partition: int,
        request: p.Request,
        timeout_s: float | None = None,
        on_answer: OnAnswer | None = None,
    ) -> p.Response:
        if self.leader_address(topic, partition) is None:
            await self.refresh([topic])
        address = self.leader_address(topic, partition)
        if address is None:
            raise ClientError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition}")
        return await self.send(address, request, timeout_s, on_answer)

    async def close(self) -> None:
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()


async def retrying(attempt: Any, deadline_s: float, backoff_s: float = 0.1) -> Any:
    """Call `attempt()` until it returns, retrying retriable ClientErrors until the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await attempt()
        except ClientError as exc:
            if not exc.retriable or time.monotonic() + backoff_s > deadline:
                raise
        await asyncio.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, 1.0)


class Admin:
    """Topics, producers and cluster status."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        *,
        retention_ms: int = -1,
        retention_bytes: int = -1,
        wait_s: float = 30.0,
    ) -> int:
        """Create a topic and wait until every partition has a leader; returns its id."""
        request = p.CreateTopic(name, partitions, replication_factor, retention_ms, retention_bytes)
        response = await retrying(lambda: self.cluster.send_any(request), wait_s)
        assert isinstance(response, p.CreateTopicResponse)
        await self.wait_for_leaders(name, wait_s)
        return response.topic_id

    async def wait_for_leaders(self, name: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            meta = await self.cluster.refresh([name])
            topic = next(t for t in meta.topics if t.name == name)
            if topic.error == ErrorCode.NONE and all(pm.leader_id >= 0 for pm in topic.partitions):
                return
            if time.monotonic() > deadline:
                raise ClientError(ErrorCode.LEADER_NOT_AVAILABLE, f"{name}: no leader yet")
            await asyncio.sleep(0.1)

    async def delete_topic(self, name: str) -> None:
        await retrying(lambda: self.cluster.send_any(p.DeleteTopic(name)), 30.0)

    async def describe_topics(self, names: Iterable[str] = ()) -> p.MetadataResponse:
        return await self.cluster.refresh(names)

    async def describe_producers(
        self, topic: str, partitions: Iterable[int] | None = None
    ) -> list[p.PartitionProducers]:
        infos = await self.cluster.partitions(topic)
        wanted = list(partitions) if partitions is not None else [i.partition for i in infos]
        results: list[p.PartitionProducers] = []
        for partition in wanted:
            request = p.DescribeProducers(topic, (partition,))
            response = await retrying(
                lambda r=request, n=partition: self._ask_leader(topic, n, r), 10.0
            )
            assert isinstance(response, p.DescribeProducersResponse)
            results.extend(response.results)
        return results

    async def _ask_leader(self, topic: str, partition: int, request: p.Request) -> p.Response:
        response = await self.cluster.send_to_leader(topic, partition, request)
        errors = _partition_errors(response)
        if errors:
            error, leader = errors[0]
            await self._follow(topic, partition, leader)
            raise ClientError(error, f"{topic}-{partition}", leader)
        return response

    async def _follow(self, topic: str, partition: int, leader: str) -> None:
        if leader:
            self.cluster.note_leader(topic, partition, leader)
        else:
            await self.cluster.refresh([topic])

    async def cluster_status(self, address: str | None = None) -> p.ClusterStatusResponse:
        request = p.ClusterStatus()
        response = await (
            self.cluster.send(address, request) if address else self.cluster.send_any(request)
        )
        assert isinstance(response, p.ClusterStatusResponse)
        return response

    async def list_offsets(self, topic: str, partition: int, spec: int) -> int:
        request = p.ListOffsets((p.OffsetQuery(topic, partition, spec),))
        response = await retrying(lambda: self._ask_leader(topic, partition, request), 10.0)
        assert isinstance(response, p.ListOffsetsResponse)
        return response.results[0].offset


def _partition_errors(response: p.Response) -> list[tuple[ErrorCode, str]]:
    results = getattr(response, "results", ())
    return [
        (ErrorCode(r.error), getattr(r, "leader", ""))
        for r in results
        if getattr(r, "error", 0) != ErrorCode.NONE
    ]


# -- Producer --------------------------------------------------------------------------------------


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


def stable_partition(key: bytes, partitions: int) -> int:
    """Key hashing that every process agrees on (not Python's salted hash())."""
    return zlib.crc32(key) % partitions


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


class ProducerFencedError(ClientError):
    """Another instance with the same transactional id took over: this producer is done."""


class Producer:
    """An idempotent producer; `send` returns a future with the record's offset."""

    def __init__(self, cluster: Cluster, config: ProducerConfig | None = None) -> None:
        self.cluster = cluster
        self.config = config or ProducerConfig()
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
        await self._tasks.__aexit__(exc_type, exc, tb)  # type: ignore[arg-type]

    def _abandon(self, error: ClientError) -> None:
        for sender in self._senders.values():
            sender.fail_all(error)

    async def new_session(self, expected: tuple[int, int] | None = None) -> None:
        """InitProducerId: a fresh producer id, or an epoch bump for a transactional id."""
        pid, epoch = expected or (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        request = p.InitProducerId(
            self.config.transactional_id, self.config.transaction_timeout_ms, pid, epoch
        )
        response = await retrying(
            lambda: self.cluster.send_any(request), self.config.delivery_timeout_ms / 1000
        )
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
        infos = self.cluster.cached_partitions(topic) or await self.cluster.partitions(topic)
        if partition is None:
            partition = (
                stable_partition(key, len(infos))
                if key is not None
                else next(self._round_robin) % len(infos)
            )
        if not 0 <= partition < len(infos):
            raise ClientError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")
        while self._buffered >= self.config.buffer_records_max:
            self._space.clear()
            await self._space.wait()
        stamp = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        assert self._loop is not None, "use `async with Producer(...)`"
        future: asyncio.Future[RecordMetadata] = self._loop.create_future()
        self._sender(topic, partition).add(_Pending(Record(key, value, stamp, headers), future))
        self._buffered += 1
        return future

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
        self.first_added_at = 0.0

    def add(self, pending: _Pending) -> None:
        first = not self.accumulating
        if first:
            self.first_added_at = time.monotonic()
        self.accumulating.append(pending)
        self.accumulated_bytes += len(pending.record.value or b"") + len(pending.record.key or b"")
        self.idle.clear()
        # Wake the sender when a linger starts (it may be idle) and when a batch is full.
        if first or self.accumulated_bytes >= self.producer.config.batch_size_bytes:
            self.wakeup.set()

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
                await self.wakeup.wait()
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
                size += len(record.value or b"") + len(record.key or b"") + 32
                take += 1
            chosen = self.accumulating[:take]
            del self.accumulating[:take]  # in place: no copy of the rest of the buffer
            self.accumulated_bytes = max(0, self.accumulated_bytes - size)
            batch = _Batch(chosen, self.next_sequence)
            self._encode(batch)
            self.next_sequence = (self.next_sequence + len(chosen)) % SEQUENCE_MODULUS
            self.unacked.append(batch)

    def _encode(self, batch: _Batch) -> None:
        producer = self.producer
        records = tuple(pd.record for pd in batch.pending)
        if producer.config.idempotent:
            rb = RecordBatch(producer.producer_id, producer.epoch, batch.base_sequence, records)
        else:
            rb = RecordBatch(NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, records)
        batch.encoded = rb.encode()
        batch.producer_id, batch.producer_epoch = rb.producer_id, rb.producer_epoch

    async def _send_window(self) -> None:
        """Send every unacknowledged batch (at most max_in_flight), then settle the outcome."""
        window = [b for b in self.unacked if not b.done][: self.producer.config.max_in_flight]
        if not window:
            return
        for batch in window:
            batch.retry = batch.out_of_order = False
            batch.failed = None
        if len(window) == 1:
            await self._send(window[0])  # the common case: no task to create and wait for
        else:
            await asyncio.gather(*(self._send(batch) for batch in window))
        # OUT_OF_ORDER is only final for the batch that was the first unacknowledged one when
        # the window went out; for a later one its predecessor was still in flight: retry it.
        await self._settle(session_lost=window[0].out_of_order)

    async def _send(self, batch: _Batch) -> None:
        config = self.producer.config
        request = p.Produce(
            config.request_timeout_ms, (p.ProduceEntry(self.topic, self.partition, batch.encoded),)
        )
        cluster = self.producer.cluster
        try:
            response = await cluster.send_to_leader(
                self.topic,
                self.partition,
                request,
                config.request_timeout_ms / 1000 + 1,
                partial(self._acknowledged, batch),
            )
        except ClientError as exc:
            batch.retry = True
            if exc.error == ErrorCode.NETWORK_EXCEPTION:
                await cluster.refresh([self.topic])
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
            if result.leader:
                cluster.note_leader(self.topic, self.partition, result.leader)
            else:
                await cluster.refresh([self.topic])
        else:
            batch.failed = error

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
        while self.unacked and self.unacked[0].done:
            producer._released(len(self.unacked.popleft().pending))
        if not self.unacked:
            return
        first = self.unacked[0]
        if first.failed in FENCED:
            self._fail_producer(ProducerFencedError(first.failed, "fenced by a newer instance"))
        elif first.failed is not None:
            self._fail_batch(self.unacked.popleft(), first.failed)
            self._renumber(first.base_sequence)
        elif session_lost:
            await self._restart_session()
        else:
            producer.stats["retries"] += 1
            await asyncio.sleep(producer.config.retry_backoff_ms / 1000)

    def _fail_batch(self, batch: _Batch, error: ErrorCode) -> None:
        for pending in batch.pending:
            if not pending.future.done():
                pending.future.set_exception(ClientError(error, f"{self.topic}-{self.partition}"))
        self.producer._released(len(batch.pending))

    def _renumber(self, base_sequence: int) -> None:
        """Later batches cannot have been accepted past a rejected one: re-stamp them."""
        sequence = base_sequence
        for batch in self.unacked:
            batch.base_sequence = sequence
            self._encode(batch)
            sequence = (sequence + len(batch.pending)) % SEQUENCE_MODULUS
        self.next_sequence = sequence

    async def _restart_session(self) -> None:
        """The broker lost this session's state: fail the unacknowledged sends, start anew."""
        while self.unacked:
            self._fail_batch(self.unacked.popleft(), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        producer = self.producer
        async with producer._session_lock:
            expected = None
            if producer.config.transactional_id:
                expected = (producer.producer_id, producer.epoch)
            await producer.new_session(expected)

    def _fail_producer(self, error: ClientError) -> None:
        self.producer.fatal = error
        self.producer._abandon(error)

    def fail_all(self, error: ClientError) -> None:
        """Fail every record not yet acknowledged, and stop."""
        pending = [p for b in self.unacked for p in b.pending] + self.accumulating
        for item in pending:
            if not item.future.done():
                item.future.set_exception(error)
        self.producer._released(len(pending))
        self.unacked.clear()
        self.accumulating = []
        self.idle.set()
        self.stop()


# -- Consumer --------------------------------------------------------------------------------------


class ConsumedRecord(NamedTuple):
    """One record as a consumer sees it (a named tuple: a consumer makes one per record)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    append_time_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    producer_id: int
    producer_epoch: int
    sequence: int


@dataclass(slots=True)
class _Position:
    offset: int
    high_watermark: int = -1


@dataclass(slots=True)
class ConsumerConfig:
    max_wait_ms: int = 500
    max_bytes: int = 4 << 20
    partition_max_bytes: int = 1 << 20


class Consumer:
    """Reads assigned partitions in order from their leaders."""

    EARLIEST, LATEST = -2, -1

    def __init__(self, cluster: Cluster, config: ConsumerConfig | None = None) -> None:
        self.cluster = cluster
        self.config = config or ConsumerConfig()
        self.positions: dict[tuple[str, int], _Position] = {}
        self._admin = Admin(cluster)

    async def assign(
        self, topic: str, partitions: Iterable[int] | None = None, start: int = EARLIEST
    ) -> None:
        """Assign partitions (all by default) at EARLIEST, LATEST or an absolute offset."""
        infos = await self.cluster.partitions(topic)
        for partition in partitions if partitions is not None else [i.partition for i in infos]:
            await self.seek(topic, partition, start)

    async def seek(self, topic: str, partition: int, offset: int) -> None:
        if offset in (self.EARLIEST, self.LATEST):
            offset = await self._admin.list_offsets(topic, partition, offset)
        self.positions[(topic, partition)] = _Position(offset)

    async def poll(self, max_wait_ms: int | None = None) -> list[ConsumedRecord]:
        """The next records of every assigned partition, in offset order per partition."""
        by_leader: dict[str, list[tuple[str, int]]] = {}
        for topic, partition in self.positions:
            if self.cluster.leader_address(topic, partition) is None:
                await self.cluster.refresh([topic])
            address = self.cluster.leader_address(topic, partition)
            if address is not None:
                by_leader.setdefault(address, []).append((topic, partition))
        wait = self.config.max_wait_ms if max_wait_ms is None else max_wait_ms
        results = await asyncio.gather(
            *(self._fetch(address, keys, wait) for address, keys in by_leader.items())
        )
        return [record for batch in results for record in batch]

    async def _fetch(
        self, address: str, keys: list[tuple[str, int]], wait_ms: int
    ) -> list[ConsumedRecord]:
        request = p.Fetch(
            wait_ms,
            self.config.max_bytes,
            tuple(
                p.FetchPartition(
                    t, n, self.positions[(t, n)].offset, self.config.partition_max_bytes
                )
                for t, n in keys
            ),
            False,
        )
        try:
            response = await self.cluster.send(address, request, wait_ms / 1000 + 10)
        except ClientError as exc:
            if not exc.retriable:
                raise
            await self.cluster.refresh({t for t, _ in keys})
            return []
        assert isinstance(response, p.FetchResponse)
        records: list[ConsumedRecord] = []
        for result in response.results:
            records.extend(await self._take(result))
        return records

    async def _take(self, result: p.FetchResult) -> list[ConsumedRecord]:
        key = (result.topic, result.partition)
        position = self.positions[key]
        error = ErrorCode(result.error)
        if error != ErrorCode.NONE:
            if error == ErrorCode.OFFSET_OUT_OF_RANGE:
                raise ClientError(error, f"{result.topic}-{result.partition}@{position.offset}")
            if result.leader:
                self.cluster.note_leader(result.topic, result.partition, result.leader)
            else:
                await self.cluster.refresh([result.topic])
            return []
        position.high_watermark = result.high_watermark
        records = []
        for fetched in result.batches:
            records.extend(self._records(result.topic, result.partition, fetched, position))
        return records

    @staticmethod
    def _records(
        topic: str, partition: int, fetched: p.FetchedBatch, position: _Position
    ) -> list[ConsumedRecord]:
        batch = RecordBatch.decode(fetched.batch)  # verifies the CRC end to end
        records, base = batch.records, fetched.base_offset
        first = max(0, position.offset - base)  # the batch may start before our position
        if first >= len(records):
            return []
        position.offset = base + len(records)
        pid, epoch, sequence = batch.producer_id, batch.producer_epoch, batch.base_sequence
        append_time_ms = fetched.append_time_ms
        return [
            ConsumedRecord(
                topic,
                partition,
                base + i,
                records[i].timestamp_ms,
                append_time_ms,
                records[i].key,
                records[i].value,
                records[i].headers,
                pid,
                epoch,
                (sequence + i) % SEQUENCE_MODULUS if sequence >= 0 else -1,
            )
            for i in range(first, len(records))
        ]

    def lag(self) -> int:
        return sum(max(0, pos.high_watermark - pos.offset) for pos in self.positions.values())
