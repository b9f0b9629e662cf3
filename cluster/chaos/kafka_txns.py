"""The chaos workload's transactions, through Kafka's clients (`raftbroker chaos run --client
kafka`), and what the checker needs to judge them (txn_checker.py); native_txns.py runs the
same with the client library, and txn_workload.py holds what the two share.

Role: three processes beside the rest of the workload, on topics of their own:
- the writer (`x0`): confluent-kafka's transactional producer, each transaction a few values
  over several partitions of `chaos-txn`, every ABORT_EVERY-th aborted on purpose;
- the processor (`y0`): consume-transform-produce exactly once, librdkafka's pattern: a
  read_committed member of group `chaos-ctp` reads `chaos-txn`, writes an output of each value
  (naming it and the transaction: `txn_checker.output_of`) to the same partition of
  `chaos-txn-out` and sends its offsets to the transaction, every
  CTP_ABORT_EVERY-th aborted on purpose and the consumer rewound to the committed offsets;
- the watcher (`l0`): every partition's last stable offset and high watermark, from its
  leader (ListOffsets, read_committed and read_uncommitted).
After the run the processor drains the input to its end, the watcher waits for no transaction
to be left open, and the final reads of both topics, both isolation levels, are recorded, with
the processor's committed offsets.

Events (history.py): `txn` (invoke: `txn`, `topic`, `values` `[partition, value]`, `intent`,
and for the processor `inputs` `[partition, offset, value]` with `read_ms`, when they were
read; ok: the intent happened; fail: certainly not committed; info: unknown; each outcome
`ending_ms`, when the commit or abort was asked), `lso` (`topic`, `partition`, `lso`, `hw`,
`final`), `txn_read` (`topic`, `partition`, `isolation`, `records`, `complete`),
`ctp_committed`
(`offsets`), `ctp_drain` (ok or info, `ends`).

Rules: librdkafka's calls block; each runs in a daemon thread of its own, awaited at most its
own timeout and HANG_MARGIN_S more (`_call`): `send_offsets_to_transaction` can block past its
timeout, for good, while the group's coordinator is down (librdkafka #5456, #5511, open), and
a thread of the loop's executor would then hold the run's exit. Callbacks (errors, logs) are
handed to the loop as kafka_clients.py does (`Callbacks`). A fatal error, or a call that hung,
ends a producer: a new one takes the transactional id (fencing the old and aborting its open
transaction, as an application restarts); a hang is recorded (`client_hang`) beside the
outcome, unknown, of its transaction. This module and kafka_clients.py are the only importers of
confluent_kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, TypeVar, cast

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from cluster.chaos.clients import Record
from cluster.chaos.kafka_clients import Callbacks
from cluster.chaos.kafka_wire import KafkaWireClient
from cluster.chaos.txn_checker import output_of
from cluster.chaos.txn_workload import (
    ABORT_EVERY,
    CALL_TIMEOUT_S,
    CTP_ABORT_EVERY,
    CTP_BATCH_MAX,
    CTP_GROUP,
    CTP_ID,
    HUNG,
    OUT_TOPIC,
    POLL_S,
    READ_TIMEOUT_S,
    TXN_TIMEOUT_MS,
    TXN_TOPIC,
    WRITER_ID,
    WRITER_INTERVAL_S,
    Rows,
    TxnWorkloadBase,
)
from cluster.client import ClientError
from statemachine.errors import ErrorCode

T = TypeVar("T")
RETRIES_MAX = 4  # a transactional call is made again after a retriable error at most this often
HANG_MARGIN_S = 10.0  # a call not back this long after its own timeout hung (`_call`)


class TxnWorkload(TxnWorkloadBase):
    """The writer, the processor, the watcher and the final reads, with Kafka's clients."""

    def __init__(
        self,
        bootstrap: list[str],
        partitions: int,
        record: Record,
        wire: KafkaWireClient,
        clock_ms: Callable[[], float],
    ) -> None:
        super().__init__(partitions, record, clock_ms)
        self.bootstrap = ",".join(bootstrap)
        self._wire = wire

    # -- a transactional producer ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _producer(self, process: str, txn_id: str) -> AsyncIterator[KafkaProducer]:
        callbacks = Callbacks(process, self._record)
        producer = KafkaProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": txn_id,
                "transaction.timeout.ms": TXN_TIMEOUT_MS,
                "linger.ms": 1,
                **callbacks.config(),
            }
        )
        try:
            await _until_done(lambda: producer.init_transactions(CALL_TIMEOUT_S))
            yield producer
        finally:
            callbacks.closed = True  # (its messages are flushed by commit or abort, or by none)

    async def _end(self, producer: KafkaProducer, commit: bool) -> tuple[str, str, float]:
        """Commit or abort the open transaction: (outcome, error, when it was asked)."""
        ending_ms = self._clock_ms()
        end = producer.commit_transaction if commit else producer.abort_transaction
        try:
            await _until_done(lambda: end(CALL_TIMEOUT_S))
        except TimeoutError:
            return "info", HUNG, ending_ms
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not error.txn_requires_abort():
                return "info", error.name(), ending_ms  # fatal, or out of time: unknown
            try:
                await _until_done(lambda: producer.abort_transaction(CALL_TIMEOUT_S))
            except (KafkaException, TimeoutError):
                return "info", error.name(), ending_ms
            return "fail", error.name(), ending_ms
        return "ok", "", ending_ms

    # -- the writer ------------------------------------------------------------------------------

    async def run_writer(self, process: str) -> None:
        numbers = itertools.count()
        while not self.stopping.is_set():
            try:
                async with self._producer(process, WRITER_ID) as producer:
                    while not self.stopping.is_set():
                        if not await self._write(process, producer, next(numbers)):
                            break  # its state is unknown: a new producer takes the id
                        await asyncio.sleep(WRITER_INTERVAL_S)
            except (KafkaException, TimeoutError) as exc:
                self.event("info", process, "txn_producer", error=_error_name(exc))

    async def _write(self, process: str, producer: KafkaProducer, n: int) -> bool:
        values = self.values_of(process, n)
        commit = n % ABORT_EVERY != ABORT_EVERY - 1
        txn = f"{process}-{n}"
        fields = {"txn": txn, "topic": TXN_TOPIC, "values": values}
        self.event("invoke", process, "txn", intent="commit" if commit else "abort", **fields)
        try:
            await _call(producer.begin_transaction)
            for partition, value in values:
                producer.produce(TXN_TOPIC, value.encode(), partition=partition)
            await _call(lambda: producer.flush(CALL_TIMEOUT_S))
        except (KafkaException, BufferError, TimeoutError) as exc:
            name = _error_name(exc)
            self.event("info", process, "txn", txn=txn, error=name, ending_ms=self._clock_ms())
            return False
        kind, error, ending_ms = await self._end(producer, commit)
        self.event(kind, process, "txn", txn=txn, error=error, ending_ms=ending_ms)
        return kind != "info"

    # -- the processor ---------------------------------------------------------------------------

    async def run_processor(self, process: str) -> None:
        """Until drained: a consumer and a producer; both are made anew when the consumer could
        not be rewound after a transaction that did not commit, the producer alone when its
        state is unknown."""
        numbers = itertools.count()
        while not self.drained.is_set():
            async with self._consumer(process) as consumer:
                rewound = True
                while rewound and not self.drained.is_set():
                    try:
                        async with self._producer(process, CTP_ID) as producer:
                            rewound = await self._process(process, consumer, producer, numbers)
                    except (KafkaException, TimeoutError) as exc:
                        self.event("info", process, "txn_producer", error=_error_name(exc))

    @contextlib.asynccontextmanager
    async def _consumer(self, process: str) -> AsyncIterator[KafkaConsumer]:
        callbacks = Callbacks(process, self._record)
        consumer = KafkaConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": CTP_GROUP,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **callbacks.config(),
            }
        )
        consumer.subscribe([TXN_TOPIC])
        try:
            yield consumer
        finally:
            try:
                with contextlib.suppress(KafkaException, TimeoutError):
                    await _call(consumer.close)
            finally:
                callbacks.closed = True

    async def _process(
        self,
        process: str,
        consumer: KafkaConsumer,
        producer: KafkaProducer,
        numbers: itertools.count[int],
    ) -> bool:
        """`drive` with librdkafka's consumer and producer."""

        async def poll() -> list[list[object]]:
            messages = await _call(lambda: consumer.consume(CTP_BATCH_MAX, POLL_S))
            return [_row(m) for m in messages if m.error() is None]

        async def transform(inputs: list[list[object]], read_ms: float, n: int) -> str:
            return await self._transform(
                process, consumer, producer, inputs=inputs, read_ms=read_ms, n=n
            )

        return await self.drive(
            numbers,
            poll,
            transform,
            lambda: self._rewind(process, consumer),
            lambda: self._caught_up(consumer, producer),
        )

    async def _transform(
        self,
        process: str,
        consumer: KafkaConsumer,
        producer: KafkaProducer,
        *,
        inputs: list[list[Any]],
        read_ms: float,
        n: int,
    ) -> str:
        """One transaction of these inputs' outputs and offsets: "ok-commit" (committed),
        "ended" (certainly not committed: aborted) or "info" (unknown)."""
        txn = f"{process}-{n}"
        values = [[partition, output_of(value, txn)] for partition, _offset, value in inputs]
        commit = n % CTP_ABORT_EVERY != CTP_ABORT_EVERY - 1
        self.event(
            "invoke",
            process,
            "txn",
            txn=txn,
            topic=OUT_TOPIC,
            values=values,
            inputs=inputs,
            read_ms=read_ms,
            intent="commit" if commit else "abort",
        )
        try:
            await _call(producer.begin_transaction)
            for partition, value in values:
                producer.produce(OUT_TOPIC, value.encode(), partition=partition)
            positions = consumer.position(consumer.assignment())
            metadata = consumer.consumer_group_metadata()
            await _until_done(
                lambda: producer.send_offsets_to_transaction(positions, metadata, CALL_TIMEOUT_S)
            )
        except TimeoutError:
            self.event("info", process, "client_hang", call="send_offsets_to_transaction")
            self.event("info", process, "txn", txn=txn, error=HUNG, ending_ms=self._clock_ms())
            return "info"
        except (KafkaException, BufferError) as exc:
            name = _error_name(exc)
            kind, _, ending_ms = await self._end(producer, commit=False)
            kind = "fail" if kind == "ok" else "info"
            self.event(kind, process, "txn", txn=txn, error=name, ending_ms=ending_ms)
            return "ended" if kind == "fail" else "info"
        kind, error, ending_ms = await self._end(producer, commit)
        self.event(kind, process, "txn", txn=txn, error=error, ending_ms=ending_ms)
        if kind == "info":
            return "info"
        return "ok-commit" if kind == "ok" and commit else "ended"

    async def _rewind(self, process: str, consumer: KafkaConsumer) -> bool:
        """Back to the group's committed offsets (the start where none), as after an abort
        (librdkafka's pattern); False, recorded, if it could not be done: the consumer is
        then made anew, which starts from the committed offsets by itself."""
        try:
            assigned = consumer.assignment()
            committed = await _call(lambda: consumer.committed(assigned, CALL_TIMEOUT_S))
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        except (KafkaException, TimeoutError) as exc:
            self.event("info", process, "rewind", error=_error_name(exc))
            return False
        return True

    async def _caught_up(self, consumer: KafkaConsumer, producer: KafkaProducer) -> bool:
        """Whether the group committed every input partition's last stable offset (`standing`;
        where only aborted records lay past its commits, its positions are committed alone,
        `ctp_offsets`)."""
        asked = [TopicPartition(TXN_TOPIC, p) for p in range(self.partitions)]
        try:
            found = await _call(lambda: consumer.committed(asked, CALL_TIMEOUT_S))
            positions = {tp.partition: tp.offset for tp in consumer.position(asked)}
        except (KafkaException, TimeoutError):
            return False
        committed = {tp.partition: tp.offset for tp in found}
        standing = await self.standing(committed, positions)
        if standing == "behind":
            await self._commit_positions(consumer, producer)
        return standing == "caught-up"

    async def _commit_positions(self, consumer: KafkaConsumer, producer: KafkaProducer) -> None:
        positions = consumer.position(consumer.assignment())
        offsets = sorted([tp.topic, tp.partition, tp.offset] for tp in positions)
        try:
            await _call(producer.begin_transaction)
            metadata = consumer.consumer_group_metadata()
            await _until_done(
                lambda: producer.send_offsets_to_transaction(positions, metadata, CALL_TIMEOUT_S)
            )
        except (KafkaException, TimeoutError) as exc:
            await self._end(producer, commit=False)
            self.event("info", "y0", "ctp_offsets", offsets=offsets, error=_error_name(exc))
            return
        kind, error, _ = await self._end(producer, commit=True)
        self.event(kind, "y0", "ctp_offsets", offsets=offsets, error=error)

    # -- what the watcher and the final reads ask ------------------------------------------------

    async def offset(self, topic: str, partition: int, *, read_committed: bool) -> tuple[int, int]:
        try:
            error, offset = await self._wire.list_offsets(
                topic, partition, read_committed=read_committed
            )
        except ClientError as exc:
            return exc.error, -1
        if error != ErrorCode.NONE:
            with contextlib.suppress(ClientError):
                await self._wire.refresh(topic)
        return error, offset

    async def read_final(self, topic: str, isolation: str) -> tuple[Rows, set[int]]:
        return await _call(partial(self._read_all, topic, isolation), READ_TIMEOUT_S)

    async def committed(self) -> list[list[int]]:
        return await _call(self._committed, READ_TIMEOUT_S)

    def _read_all(self, topic: str, isolation: str) -> tuple[Rows, set[int]]:
        """Every partition of `topic`, from its start to its end, at this isolation level;
        and the partitions whose end it reached (the others' reads stopped short)."""
        consumer = KafkaConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "chaos-final",
                "isolation.level": isolation,
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
        rows: Rows = [[] for _ in range(self.partitions)]
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(self.partitions)]
        )
        ended: set[int] = set()
        attempts = int(READ_TIMEOUT_S / POLL_S)  # (a worker thread's deadline, in polls)
        try:
            while len(ended) < self.partitions and attempts > 0:
                attempts -= 1
                for message in consumer.consume(1_000, POLL_S):
                    error = message.error()
                    partition = int(message.partition() or 0)
                    if error is None:
                        rows[partition].append(_record_row(message))
                    elif error.code() == KafkaError._PARTITION_EOF:
                        ended.add(partition)
        finally:
            consumer.close()
        return rows, ended

    def _committed(self) -> list[list[int]]:
        """[partition, committed offset] of the processor's group, for the partitions read
        without error (none, if the read failed): the checker judges only those."""
        consumer = KafkaConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": CTP_GROUP,
                "isolation.level": "read_committed",
            }
        )
        try:
            asked = [TopicPartition(TXN_TOPIC, p) for p in range(self.partitions)]
            found = consumer.committed(asked, READ_TIMEOUT_S)
        except KafkaException:
            return []
        finally:
            consumer.close()
        return [[tp.partition, tp.offset] for tp in found if tp.error is None]

    async def coordinator_node(self) -> int | None:
        from cluster.kafka import messages as m  # noqa: PLC0415 - the codec's table is big

        try:
            answer = await self._wire.call_any(
                m.Api.FIND_COORDINATOR, 1, m.FindCoordinatorRequest(WRITER_ID, 1)
            )
        except ClientError:
            return None
        assert isinstance(answer, m.FindCoordinatorResponse)
        return answer.node_id if answer.error_code == ErrorCode.NONE else None


def _row(message: Message) -> list[Any]:
    value = message.value()
    text = value.decode() if isinstance(value, bytes) else (value or "")
    return [message.partition(), message.offset(), text]


def _record_row(message: Message) -> list[object]:
    """A final read's row, as the history's records are: [offset, value, pid, epoch, seq]."""
    _, offset, text = _row(message)
    return [offset, text, -1, -1, -1]


async def _call(call: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
    """`call` (a blocking librdkafka call) in a daemon thread of its own, awaited for
    `timeout_s` and HANG_MARGIN_S more: TimeoutError then, the thread left to itself (a
    daemon: it holds neither the loop nor the process's exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return  # given up on
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(T, result))

    def run() -> None:
        try:
            result, error = call(), None
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting task, whatever it is
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="librdkafka-call", daemon=True).start()
    return await asyncio.wait_for(asyncio.shield(future), timeout_s + HANG_MARGIN_S)


def _error_name(exc: BaseException) -> str:
    if isinstance(exc, KafkaException):
        return str(exc.args[0].name())
    return HUNG if isinstance(exc, TimeoutError) else "_QUEUE_FULL"


async def _until_done(call: Callable[[], object]) -> None:
    """A transactional call, again while librdkafka says it may be retried (its documented
    contract: a retriable error leaves the call to be made again), RETRIES_MAX times at most;
    TimeoutError if it hangs."""
    for attempt in range(RETRIES_MAX):
        try:
            await _call(call)
        except KafkaException as exc:
            if exc.args[0].retriable() and attempt < RETRIES_MAX - 1:
                continue
            raise
        return
