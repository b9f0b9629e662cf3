"""The chaos workload: producers and consumers that record every operation in the history.

Role: drive the cluster as users do (the real `Producer` and `Consumer` of `cluster.client`) and
write what each operation asked and got as history events for the checker. Every value is
unique (`<process>-<n>`), so the checker can follow each one into the log. Besides producers
and a consumer, a streaming sink writes micro-batches through fenced writes and reruns some of
them, as Spark does after a crash: its values must be in the log once, whatever the faults.

An operation is `fail` only when the broker said, definitely, that it did not happen (a fenced
epoch, a sequence or request error); a timeout, a lost connection, a leader change or anything
unknown is `info`: it may or may not have happened, and the checker treats it so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

from cluster import protocol as p
from cluster.client import (
    ClientError,
    Consumer,
    ConsumerConfig,
    Producer,
    ProducerConfig,
    RecordMetadata,
    retrying,
)
from cluster.client import Cluster as ClientCluster
from cluster.client.fenced import FencedWriter, FencedWriterConfig, SinkRecord
from cluster.clock import wall_ms
from statemachine.errors import ErrorCode
from statemachine.records import Record as LogRecord
from statemachine.records import RecordBatch

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


class Clock:
    """Milliseconds since the run started, for every event."""

    def __init__(self) -> None:
        self._start = asyncio.get_running_loop().time()

    def ms(self) -> float:
        return round((asyncio.get_running_loop().time() - self._start) * 1000, 3)


class Workload:
    """`record` takes each event and stamps it with the run's clock (runner.py)."""

    def __init__(self, cluster: ClientCluster, settings: WorkloadSettings, record: Record) -> None:
        self.cluster = cluster
        self.settings = settings
        self._record = record
        self.stopping = asyncio.Event()

    def event(self, kind: str, process: str, f: str, **fields: object) -> None:
        self._record({"type": kind, "process": process, "f": f, **fields})

    # -- producers -------------------------------------------------------------------------------

    def _producer_config(self, transactional_id: str = "") -> ProducerConfig:
        return ProducerConfig(
            transactional_id=transactional_id,
            linger_ms=1.0,
            delivery_timeout_ms=int(self.settings.op_timeout_s * 1000),
        )

    async def run_producer(self, process: str) -> None:
        async with Producer(self.cluster, self._producer_config()) as producer:
            self.event("ok", process, "init", pid=producer.producer_id, epoch=producer.epoch)
            await self._send_loop(process, producer, itertools.count())
            self.event("ok", process, "stats", **_stats(producer))

    async def _send_loop(
        self,
        process: str,
        producer: Producer,
        numbers: itertools.count[int],
        until: asyncio.Event | None = None,
    ) -> None:
        s = self.settings
        limit = asyncio.Semaphore(s.outstanding_max)
        async with asyncio.TaskGroup() as tasks:
            while (
                not self.stopping.is_set()
                and not (until and until.is_set())
                and producer.fatal is None
            ):
                n = next(numbers)
                await limit.acquire()
                tasks.create_task(
                    self._send_one(process, producer, f"{process}-{n}", n % s.partitions, limit)
                )
                await asyncio.sleep(s.send_interval_s)

    async def _send_one(
        self, process: str, producer: Producer, value: str, partition: int, limit: asyncio.Semaphore
    ) -> None:
        self.event("invoke", process, "send", partition=partition, value=value)
        try:
            future = await producer.send(self.settings.topic, value.encode(), partition=partition)
            meta: RecordMetadata = await asyncio.wait_for(future, self.settings.op_timeout_s)
        except ClientError as exc:
            kind = "fail" if exc.error in DEFINITE else "info"
            self.event(
                kind, process, "send", partition=partition, value=value, error=exc.error.name
            )
        except TimeoutError:
            self.event("info", process, "send", partition=partition, value=value, error="timeout")
        else:
            self.event(
                "ok",
                process,
                "send",
                partition=partition,
                value=value,
                offset=meta.offset,
                pid=meta.producer_id,
                epoch=meta.producer_epoch,
                sequence=meta.sequence,
                node=None,
                duplicate=meta.duplicate,
            )
        finally:
            limit.release()

    # -- a streaming sink: fenced micro-batches, rerun and cut off ---------------------------------

    async def run_sink(self, process: str) -> None:
        """Micro-batches of a streaming sink through fenced writes (cluster/fenced.py): some run
        again by a new writer, as Spark reruns a batch after a crash, some cut off mid-way
        first. Every value must be in the log exactly once (the checker's duplicate rule)."""
        s = self.settings
        rng = random.Random(process)  # the same choices on every run of the same process
        for batch_id in itertools.count():
            if self.stopping.is_set():
                return
            values = [f"{process}-{batch_id}-{i}" for i in range(s.sink_batch_records)]
            records = [
                SinkRecord(s.topic, None, v.encode(), i % s.partitions)
                for i, v in enumerate(values)
            ]
            for r, v in zip(records, values, strict=True):
                self.event("invoke", process, "send", partition=r.partition, value=v)
            if rng.random() < s.sink_cut_ratio:
                await self._cut_sink_run(process, batch_id, records, rng.uniform(0.001, 0.03))
            runs = 2 if rng.random() < s.sink_rerun_ratio else 1
            done = all([await self._sink_run(process, batch_id, records) for _ in range(runs)])
            # Acknowledged by micro-batch: no offsets (the checker finds each value in the log).
            unknown = {"offset": -1, "pid": -1, "epoch": -1, "sequence": -1} if done else {}
            kind = "ok" if done else "info"
            for r, v in zip(records, values, strict=True):
                self.event(kind, process, "send", partition=r.partition, value=v, **unknown)
            await asyncio.sleep(s.sink_interval_s)

    async def _sink_run(self, process: str, batch_id: int, records: list[SinkRecord]) -> bool:
        """Run the batch until a run completes, as Spark retries a failed task; False if the
        workload stopped first."""
        while not self.stopping.is_set():
            writer = FencedWriter(self.cluster, f"chaos-{process}", 0, self._sink_config())
            try:
                await writer.write(batch_id, records)
                return True
            except ClientError as exc:
                self.event("info", process, "sink_run", batch=batch_id, error=exc.error.name)
        return False

    async def _cut_sink_run(
        self, process: str, batch_id: int, records: list[SinkRecord], after_s: float
    ) -> None:
        writer = FencedWriter(self.cluster, f"chaos-{process}", 0, self._sink_config())
        run = asyncio.ensure_future(writer.write(batch_id, records))
        await asyncio.wait({run}, timeout=after_s)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError, ClientError):
            await run
        self.event("info", process, "sink_run", batch=batch_id, error="cut off")

    def _sink_config(self) -> FencedWriterConfig:
        return FencedWriterConfig(
            part_bytes_max=512,  # a few records a part: many parts, many places to cut
            delivery_timeout_s=self.settings.op_timeout_s,
        )

    # -- the transactional-id producer, restarted to exercise fencing ----------------------------

    async def run_transactional(self, process: str, transactional_id: str) -> None:
        """Instances of one transactional id, each replaced after a while; the old one (a
        zombie) then tries one more send to every partition, which must be fenced."""
        numbers = itertools.count()
        previous: Producer | None = None
        previous_stack: contextlib.AsyncExitStack | None = None
        while not self.stopping.is_set():
            stack = contextlib.AsyncExitStack()
            config = self._producer_config(transactional_id)
            try:
                producer = await stack.enter_async_context(Producer(self.cluster, config))
            except ClientError:
                await stack.aclose()
                continue
            self.event(
                "ok",
                process,
                "init",
                pid=producer.producer_id,
                epoch=producer.epoch,
                transactional_id=transactional_id,
            )
            if previous is not None and previous_stack is not None:
                await self._zombie_sends(process, previous, numbers, producer)
                with contextlib.suppress(ClientError):
                    await previous_stack.aclose()
                self.event("ok", process, "stats", **_stats(previous))
            restart = asyncio.Event()
            asyncio.get_running_loop().call_later(self.settings.txn_restart_s, restart.set)
            await self._send_loop(process, producer, numbers, until=restart)
            previous, previous_stack = producer, stack
        if previous_stack is not None:
            with contextlib.suppress(ClientError):
                await previous_stack.aclose()

    async def _zombie_sends(
        self, process: str, zombie: Producer, numbers: itertools.count[int], current: Producer
    ) -> None:
        # The new epoch reaches a partition with its first batch there (as in Kafka without
        # transactions): write one record per partition first, then let the zombie try.
        limit = asyncio.Semaphore(self.settings.partitions * 2)
        async with asyncio.TaskGroup() as tasks:
            for partition in range(self.settings.partitions):
                await limit.acquire()
                n = next(numbers)
                tasks.create_task(
                    self._send_one(process, current, f"{process}-{n}", partition, limit)
                )
        async with asyncio.TaskGroup() as tasks:
            for partition in range(self.settings.partitions):
                await limit.acquire()
                n = next(numbers)
                tasks.create_task(
                    self._send_one(process, zombie, f"{process}-{n}", partition, limit)
                )

    # -- a client whose acknowledgements get lost -------------------------------------------

    async def run_resender(self, process: str) -> None:
        """Sends each batch, then sends the very same bytes again, as a client does when an
        acknowledgement is lost: the broker must answer the second with the first's offsets,
        never append it twice. (The negative control's duplicates come from here for sure.)"""
        init = await retrying(
            lambda: self.cluster.send_any(p.InitProducerId("", 60_000, -1, -1)), 30.0
        )
        assert isinstance(init, p.InitProducerIdResponse)
        pid, epoch = init.producer_id, init.epoch
        self.event("ok", process, "init", pid=pid, epoch=epoch)
        sequences = [0] * self.settings.partitions
        for n in itertools.count():
            if self.stopping.is_set():
                return
            partition, value = n % self.settings.partitions, f"{process}-{n}"
            sequence = sequences[partition]
            stamp = wall_ms()
            batch = RecordBatch(pid, epoch, sequence, (LogRecord(None, value.encode(), stamp),))
            self.event("invoke", process, "send", partition=partition, value=value)
            encoded = batch.encode()
            first = await self._produce_raw(partition, encoded)
            again = await self._produce_raw(partition, encoded)
            if first is None or again is None:
                self.event(
                    "info", process, "send", partition=partition, value=value, error="timeout"
                )
                return  # the session's sequence is unknown now: stop this process
            sequences[partition] = sequence + 1
            self.event(
                "ok",
                process,
                "send",
                partition=partition,
                value=value,
                offset=first.base_offset,
                pid=pid,
                epoch=epoch,
                sequence=sequence,
                resent_offset=again.base_offset,
                duplicate=again.duplicate,
            )
            await asyncio.sleep(self.settings.send_interval_s * 2)

    async def _produce_raw(self, partition: int, batch: bytes) -> p.ProduceResult | None:
        """Until acknowledged (retrying retriable errors), or None after the op timeout."""
        request = p.Produce(5_000, (p.ProduceEntry(self.settings.topic, partition, batch),))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.op_timeout_s
        while loop.time() < deadline:
            try:
                response = await self.cluster.send_to_leader(
                    self.settings.topic, partition, request, 6.0
                )
            except ClientError:
                await self.cluster.refresh([self.settings.topic])
                await asyncio.sleep(0.05)
                continue
            assert isinstance(response, p.ProduceResponse)
            result = response.results[0]
            if result.error == ErrorCode.NONE:
                return result
            if result.leader:
                self.cluster.note_leader(self.settings.topic, partition, result.leader)
            else:
                await self.cluster.refresh([self.settings.topic])
            await asyncio.sleep(0.05)
        return None

    # -- consumers -------------------------------------------------------------------------------

    async def run_consumer(self, process: str) -> None:
        consumer = Consumer(self.cluster, ConsumerConfig(max_wait_ms=200))
        await consumer.assign(
            self.settings.topic, range(self.settings.partitions), Consumer.EARLIEST
        )
        for partition in range(self.settings.partitions):
            self.event("ok", process, "seek", partition=partition, offset=0)
        while not self.stopping.is_set():
            try:
                records = await asyncio.wait_for(consumer.poll(), self.settings.op_timeout_s)
            except (ClientError, TimeoutError):
                continue
            by_partition: dict[int, list[list[object]]] = {}
            for r in records:
                by_partition.setdefault(r.partition, []).append(
                    [
                        r.offset,
                        (r.value or b"").decode(),
                        r.producer_id,
                        r.producer_epoch,
                        r.sequence,
                    ]
                )
            for partition, rows in by_partition.items():
                self.event("ok", process, "poll", partition=partition, records=rows)


def _stats(producer: Producer) -> dict[str, object]:
    return {"retries": producer.stats["retries"], "dedup_hits": producer.stats["duplicates"]}
