"""The chaos workload's clients through the Kafka listener (`raftbroker chaos run --client kafka`).

Role: `KafkaClients`, the workload's `Clients` (clients.py) for Kafka's protocol:
- idempotent producers are confluent-kafka's `Producer` (librdkafka: enable.idempotence,
  acks=all), the consumer its `Consumer` with `assign()` from the beginning (a group.id is
  required by its config, but no group API is used);
- what librdkafka cannot be made to do goes through our own Kafka codec at the request level
  (kafka_wire.py): the transactional-id sessions, whose zombie must be fenced (confluent's
  transactional producer needs transaction APIs raftbroker does not serve yet), and the
  resender's very same batch bytes sent twice.

librdkafka is the strict oracle of the run: its error callback and its log lines go into the
history (`client_error`, `client_log`), where the checker counts a fatal error, or a log line
about sequences, epochs or idempotence, as an anomaly. A delivery report with no error is `ok`
with its offset (librdkafka does not tell the producer id, epoch or sequence of a message: -1,
and the checker orders these sends by the process's own order); a fatal error, or a definite
one (clients.DEFINITE, and librdkafka's own errors for messages it never sent), is `fail`;
anything else `info`.

Rules: librdkafka runs threads of its own and calls back only from `poll()` / `consume()`.
Those run in worker threads (`asyncio.to_thread`) from tasks of the workload's task groups, and
every callback hands its result to the event loop (`call_soon_threadsafe`): only the loop's
thread touches futures and the history. This module is the only importer of confluent_kafka,
and is imported only for `--client kafka`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from cluster.chaos.clients import (
    DEFINITE,
    Ack,
    GroupReader,
    Reader,
    Record,
    Refused,
    Sent,
    Session,
    WorkloadSettings,
)
from cluster.chaos.kafka_wire import KafkaWireClient
from cluster.client import ClientError
from cluster.clock import wall_ms
from statemachine.errors import ErrorCode
from statemachine.records import Record as LogRecord
from statemachine.records import RecordBatch

POLL_S = 0.1  # a poll() in a worker thread returns this soon when nothing happens
CONSUME_MAX = 1_000  # messages a consume() hands over at once
REPORT_MARGIN_S = 5.0  # past delivery.timeout.ms, librdkafka's own report is overdue
STATISTICS_INTERVAL_MS = 1_000
TRANSACTION_TIMEOUT_MS = 60_000
PRODUCE_TIMEOUT_MS = 5_000  # the Produce request's own timeout at the broker
REQUEST_TIMEOUT_S = 6.0
RETRY_BACKOFF_S = 0.05
UNKNOWN = -1  # a producer id, epoch or sequence librdkafka does not tell
# librdkafka's own errors for a message it certainly never sent.
NEVER_SENT = frozenset(
    {
        KafkaError._PURGE_QUEUE,
        KafkaError._QUEUE_FULL,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._INVALID_ARG,
        KafkaError._FATAL,
    }
)


def outcome_kind(error: KafkaError) -> str:
    """`fail` for a fatal or definite error, `info` for anything else."""
    code = error.code()
    broker = _known(code)
    definite = (broker is not None and broker in DEFINITE) or code in NEVER_SENT
    return "fail" if error.fatal() or definite else "info"


def _known(code: int) -> ErrorCode | None:
    try:
        return ErrorCode(code)
    except ValueError:
        return None


def _name(code: int) -> str:
    known = _known(code)
    return known.name if known is not None else f"ERROR_{code}"


class Callbacks:
    """One librdkafka client's callbacks (error_cb, logger, stats_cb, delivery reports), run by
    whichever thread polls it, each handed to the event loop to record."""

    def __init__(self, process: str, record: Record) -> None:
        self._loop = asyncio.get_running_loop()
        self._process = process
        self._record = record
        self.fatal: str | None = None
        self.stats: dict[str, int] = {
            "retries": 0,
            "dedup_hits": 0,
            "sessions": 0,
            "implicit_acks": 0,
        }
        # Set when the client is done: a callback handed over after that (a run cut short, its
        # history closed) is dropped.
        self.closed = False

    def config(self, *, statistics: bool = False) -> dict[str, Any]:
        """The client's settings that route its callbacks here (`statistics`: a producer's
        retries and epochs, every STATISTICS_INTERVAL_MS)."""
        config: dict[str, Any] = {
            "client.id": self._process,
            "error_cb": self.error,
            "logger": self,  # confluent-kafka calls log(level, "%s [%s] %s", facility, name, text)
        }
        if statistics:
            config |= {
                "stats_cb": self.statistics,
                "statistics.interval.ms": STATISTICS_INTERVAL_MS,
            }
        return config

    def _hand(self, call: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the run is over
            self._loop.call_soon_threadsafe(call, *args)

    # -- on librdkafka's polling thread ------------------------------------------------------------

    def log(self, level: int, message: str, *args: object) -> None:
        facility, text = (str(args[0]), str(args[2])) if len(args) == 3 else ("", message % args)
        self._hand(self._logged, level, facility, text)

    def error(self, error: KafkaError) -> None:
        self._hand(self._errored, error.name(), error.str(), error.fatal())

    def statistics(self, text: str) -> None:
        document = json.loads(text)
        retries = sum(b.get("txretries", 0) for b in document.get("brokers", {}).values())
        sessions = document.get("eos", {}).get("epoch_cnt", 0)
        self._hand(self.stats.update, {"retries": retries, "sessions": sessions})

    def delivered(
        self, future: asyncio.Future[Sent], error: KafkaError | None, message: Message
    ) -> None:
        if error is not None:
            sent = Sent(outcome_kind(error), {"error": error.name()})
        else:
            offset = message.offset()
            if offset is None:
                # librdkafka's implicit acknowledgement (rd_kafka_dr_implicit_ack): a later
                # batch of the same session succeeded, and sequences have no gaps, so this one
                # was persisted by an attempt whose answer never arrived. Acknowledged without
                # an offset, as the sink's sends are: the checker finds the value in the log.
                self._hand(self._noted_implicit_ack)
            sent = Sent(
                "ok",
                {
                    "offset": UNKNOWN if offset is None else offset,
                    "pid": UNKNOWN,
                    "epoch": UNKNOWN,
                    "sequence": UNKNOWN,
                },
            )
        self._hand(_settle, future, sent)

    # -- on the loop ---------------------------------------------------------------------------

    def _noted_implicit_ack(self) -> None:
        self.stats["implicit_acks"] += 1

    def _logged(self, level: int, facility: str, text: str) -> None:
        if self.closed:
            return
        self._record(
            {
                "type": "info",
                "process": self._process,
                "f": "client_log",
                "level": level,
                "facility": facility,
                "message": text,
            }
        )

    def _errored(self, name: str, reason: str, fatal: bool) -> None:
        if self.closed:
            return
        if fatal and self.fatal is None:
            self.fatal = f"{name}: {reason}"
        self._record(
            {
                "type": "info",
                "process": self._process,
                "f": "client_error",
                "error": name,
                "reason": reason,
                "fatal": fatal,
            }
        )


def _settle(future: asyncio.Future[Sent], sent: Sent) -> None:
    if not future.done():  # the send may have given up waiting (REPORT_MARGIN_S)
        future.set_result(sent)


async def _serve(poll: Callable[[float], object], done: asyncio.Event) -> None:
    """Poll a librdkafka client in a worker thread until `done`, then once more."""
    while not done.is_set():
        await asyncio.to_thread(poll, POLL_S)
    await asyncio.to_thread(poll, 0)


class ConfluentSession:
    """An idempotent confluent-kafka `Producer`, one record per send."""

    def __init__(
        self, producer: KafkaProducer, callbacks: Callbacks, settings: WorkloadSettings
    ) -> None:
        self._producer = producer
        self._callbacks = callbacks
        self._settings = settings

    producer_id = UNKNOWN
    epoch = UNKNOWN

    @property
    def ended(self) -> bool:
        return self._callbacks.fatal is not None

    async def send(self, partition: int, value: bytes) -> Sent:
        s = self._settings
        future: asyncio.Future[Sent] = asyncio.get_running_loop().create_future()
        try:
            self._producer.produce(
                s.topic,
                value,
                partition=partition,
                on_delivery=partial(self._callbacks.delivered, future),
            )
        except BufferError:
            return Sent("fail", {"error": "_QUEUE_FULL"})  # not queued
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            return Sent(outcome_kind(error), {"error": error.name()})
        try:
            return await asyncio.wait_for(future, s.op_timeout_s + REPORT_MARGIN_S)
        except TimeoutError:
            return Sent("info", {"error": "timeout"})

    def stats(self) -> dict[str, int]:
        return dict(self._callbacks.stats)


class RawSession:
    """A session of a transactional id at the request level (our codec): a batch of one record
    per send, one batch in flight per partition. A send whose outcome is unknown leaves its
    sequence unknown: the session ends (a real client would bump its epoch)."""

    def __init__(self, clients: KafkaClients, producer_id: int, epoch: int) -> None:
        self._clients = clients
        self.producer_id = producer_id
        self.epoch = epoch
        partitions = clients.settings.partitions
        self._sequences = [0] * partitions
        self._locks = [asyncio.Lock() for _ in range(partitions)]
        self._lost = False

    @property
    def ended(self) -> bool:
        return self._lost

    async def send(self, partition: int, value: bytes) -> Sent:
        async with self._locks[partition]:
            if self._lost:
                return Sent("info", {"error": "session ended"})
            sequence = self._sequences[partition]
            records = (LogRecord(None, value, wall_ms()),)
            batch = RecordBatch(self.producer_id, self.epoch, sequence, records).encode()
            answer = await self._clients.produce_raw(partition, batch)
            if answer is None:
                self._lost = True
                return Sent("info", {"error": "timeout"})
            if isinstance(answer, Refused):
                return Sent("fail", {"error": answer.error})
            self._sequences[partition] = sequence + 1
            return Sent(
                "ok",
                {
                    "offset": answer.offset,
                    "pid": self.producer_id,
                    "epoch": self.epoch,
                    "sequence": sequence,
                },
            )

    def stats(self) -> dict[str, int]:
        return {"retries": 0, "dedup_hits": 0}


class ConfluentReader:
    """confluent-kafka's `Consumer`, assigned every partition (no group)."""

    def __init__(self, consumer: KafkaConsumer, callbacks: Callbacks) -> None:
        self._consumer = consumer
        self._callbacks = callbacks

    async def poll(self) -> list[tuple[int, list[object]]]:
        # Never cancelled midway (nothing waits on it with a timeout): the messages a consume()
        # took must reach the history, or the checker would see the consumer skip them.
        messages = await asyncio.to_thread(self._consumer.consume, CONSUME_MAX, POLL_S)
        rows: list[tuple[int, list[object]]] = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._callbacks.error(error)
                continue
            partition, offset = message.partition(), message.offset()
            assert partition is not None, "a message without its partition"
            assert offset is not None, "a message without its offset"
            value = message.value()
            text = value.decode() if isinstance(value, bytes) else (value or "")
            rows.append((partition, [offset, text, UNKNOWN, UNKNOWN, UNKNOWN]))
        return rows


class KafkaClients:
    """The workload's clients through the Kafka listener of every node (`bootstrap`)."""

    def __init__(self, bootstrap: list[str], settings: WorkloadSettings, record: Record) -> None:
        self.bootstrap = bootstrap
        self.settings = settings
        self._record = record
        self.wire = KafkaWireClient(bootstrap, REQUEST_TIMEOUT_S)

    async def close(self) -> None:
        await self.wire.close()

    @contextlib.asynccontextmanager
    async def producer(self, process: str) -> AsyncIterator[Session]:
        callbacks = Callbacks(process, self._record)
        producer = KafkaProducer(
            {
                "bootstrap.servers": ",".join(self.bootstrap),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "delivery.timeout.ms": int(self.settings.op_timeout_s * 1000),
                # Its idempotence state changes (producer ids, epoch bumps, drains) in the
                # history: a few lines a fault, for whoever audits an anomaly.
                "debug": "eos",
                **callbacks.config(statistics=True),
            }
        )
        done = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(_serve(producer.poll, done))
                try:
                    yield ConfluentSession(producer, callbacks, self.settings)
                finally:
                    done.set()
        finally:
            callbacks.closed = True

    @contextlib.asynccontextmanager
    async def transactional(self, process: str, transactional_id: str) -> AsyncIterator[Session]:  # noqa: ARG002
        pid, epoch = await self._init_producer_id(transactional_id)
        yield RawSession(self, pid, epoch)

    @contextlib.asynccontextmanager
    async def reader(self, process: str) -> AsyncIterator[Reader]:
        callbacks = Callbacks(process, self._record)
        consumer = KafkaConsumer(
            {
                "bootstrap.servers": ",".join(self.bootstrap),
                "group.id": "chaos-unused",  # required by librdkafka; assign() uses no group
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # A reset would show as the consumer going back: the checker's consumer-order.
                "auto.offset.reset": "earliest",
                # In the history: leader changes, migrations and offset resets (one a consumer
                # saw once, with no error behind it, is logged at debug only: "OFFSET").
                "debug": "topic",
                **callbacks.config(),
            }
        )
        s = self.settings
        consumer.assign([TopicPartition(s.topic, n, OFFSET_BEGINNING) for n in range(s.partitions)])
        try:
            yield ConfluentReader(consumer, callbacks)
        finally:
            try:
                await asyncio.to_thread(consumer.close)
            finally:
                callbacks.closed = True

    def group_member(self, process: str, group: str) -> AbstractAsyncContextManager[GroupReader]:
        """Not yet: confluent-kafka does not tell a member's generation, which the checker's
        group rules need; a Kafka-client run has no consumer group (its report says so)."""
        raise NotImplementedError(f"{process}: no Kafka-client group member for {group!r} yet")

    async def init_producer_id(self) -> tuple[int, int]:
        return await self._init_producer_id(None)

    async def _init_producer_id(self, transactional_id: str | None) -> tuple[int, int]:
        """InitProducerId through the Kafka listener, retrying retriable failures until the
        op timeout; ClientError then, or at once for any other error."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.op_timeout_s
        last = ErrorCode.REQUEST_TIMED_OUT
        while loop.time() < deadline:
            try:
                answer = await self.wire.init_producer_id(transactional_id, TRANSACTION_TIMEOUT_MS)
            except ClientError as exc:
                last = exc.error
            else:
                error = _known(answer.error_code)
                if error is None:
                    raise ClientError(ErrorCode.UNKNOWN_SERVER_ERROR, _name(answer.error_code))
                if error == ErrorCode.NONE:
                    return answer.producer_id, answer.producer_epoch
                if not error.retriable:
                    raise ClientError(error, "InitProducerId refused")
                last = error
            await asyncio.sleep(RETRY_BACKOFF_S)
        raise ClientError(last, "no InitProducerId answered in time")

    async def produce_raw(self, partition: int, batch: bytes) -> Ack | Refused | None:
        """Until acknowledged or refused definitely (DEFINITE), retrying everything else, at
        the leader Metadata names; None after the op timeout."""
        topic = self.settings.topic
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.op_timeout_s
        while loop.time() < deadline:
            try:
                result = await self.wire.produce(topic, partition, batch, PRODUCE_TIMEOUT_MS)
            except ClientError:
                pass
            else:
                error = _known(result.error_code)
                if error == ErrorCode.NONE:
                    return Ack(result.base_offset, None)
                if error in DEFINITE:
                    return Refused(_name(result.error_code))
            with contextlib.suppress(ClientError):
                await self.wire.refresh(topic)
            await asyncio.sleep(RETRY_BACKOFF_S)
        return None
