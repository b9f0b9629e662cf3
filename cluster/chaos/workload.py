"""The chaos workload: producers and consumers that record every operation in the history.

Role: drive the cluster as users do and write what each operation asked and got as history
events for the checker. Every value is unique (`<process>-<n>`), so the checker can follow each
one into the log. The processes: idempotent producers; a transactional-id producer replaced
now and then, whose predecessor (a zombie) must be fenced; a client that sends every batch twice
as if its acknowledgement had been lost; a consumer; a streaming sink that writes
micro-batches through fenced writes and reruns some of them, as Spark does after a crash: its
values must be in the log once, whatever the faults; and a consumer group whose members read
what it assigns them and commit after each poll, with a watcher reading the group's commits.

Which client does the work is a `Clients` (one per protocol, `--client`): `NativeClients` here
(raftbroker's own `Producer` and `Consumer`), `KafkaClients` in kafka_clients.py (confluent-kafka
and requests of our Kafka codec). The processes' logic, and so their events, is the same for
both. The sink has no Kafka counterpart and always writes through the native client.

An operation is `fail` only when the broker said, definitely, that it did not happen (a fenced
epoch, a sequence or request error); a timeout, a lost connection, a leader change or anything
unknown is `info`: it may or may not have happened, and the checker treats it so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from cluster import protocol as p
from cluster.client import (
    ClientError,
    CommitFailedError,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    Groups,
    Producer,
    ProducerConfig,
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
RAW_INIT_TIMEOUT_S = 30.0  # the resender's InitProducerId


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


class Clock:
    """Milliseconds since the run started, for every event."""

    def __init__(self) -> None:
        self._start = asyncio.get_running_loop().time()

    def ms(self) -> float:
        return round((asyncio.get_running_loop().time() - self._start) * 1000, 3)


# -- what the processes need of a client ---------------------------------------------------------


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


# -- the processes -------------------------------------------------------------------------------


class Workload:
    """`record` takes each event and stamps it with the run's clock (runner.py). `native` is
    the native client the sink writes through, whichever `clients` do the rest."""

    def __init__(
        self,
        clients: Clients,
        native: ClientCluster,
        settings: WorkloadSettings,
        record: Record,
    ) -> None:
        self.clients = clients
        self.native = native
        self.settings = settings
        self._record = record
        self.stopping = asyncio.Event()
        self.group_stopping = asyncio.Event()  # once the group has read what was written
        self.group_formed = asyncio.Event()  # every member has been assigned partitions once
        self._assigned_once: set[str] = set()

    def event(self, kind: str, process: str, f: str, **fields: object) -> None:
        self._record({"type": kind, "process": process, "f": f, **fields})

    # -- producers -------------------------------------------------------------------------------

    async def run_producer(self, process: str) -> None:
        async with self.clients.producer(process) as session:
            self.event("ok", process, "init", pid=session.producer_id, epoch=session.epoch)
            await self._send_loop(process, session, itertools.count())
            self.event("ok", process, "stats", **session.stats())

    async def _send_loop(
        self,
        process: str,
        session: Session,
        numbers: itertools.count[int],
        until: asyncio.Event | None = None,
    ) -> None:
        s = self.settings
        limit = asyncio.Semaphore(s.outstanding_max)
        async with asyncio.TaskGroup() as tasks:
            while (
                not self.stopping.is_set() and not (until and until.is_set()) and not session.ended
            ):
                n = next(numbers)
                await limit.acquire()
                tasks.create_task(
                    self._send_one(process, session, f"{process}-{n}", n % s.partitions, limit)
                )
                await asyncio.sleep(s.send_interval_s)

    async def _send_one(
        self, process: str, session: Session, value: str, partition: int, limit: asyncio.Semaphore
    ) -> None:
        self.event("invoke", process, "send", partition=partition, value=value)
        try:
            sent = await session.send(partition, value.encode())
            self.event(sent.kind, process, "send", partition=partition, value=value, **sent.fields)
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
            writer = FencedWriter(self.native, f"chaos-{process}", 0, self._sink_config())
            try:
                await writer.write(batch_id, records)
                return True
            except ClientError as exc:
                self.event("info", process, "sink_run", batch=batch_id, error=exc.error.name)
        return False

    async def _cut_sink_run(
        self, process: str, batch_id: int, records: list[SinkRecord], after_s: float
    ) -> None:
        writer = FencedWriter(self.native, f"chaos-{process}", 0, self._sink_config())
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
        """Sessions of one transactional id, each replaced after a while; the old one (a
        zombie) then tries one more send to every partition, which must be fenced."""
        numbers = itertools.count()
        previous: Session | None = None
        previous_stack: contextlib.AsyncExitStack | None = None
        while not self.stopping.is_set():
            stack = contextlib.AsyncExitStack()
            try:
                session = await stack.enter_async_context(
                    self.clients.transactional(process, transactional_id)
                )
            except ClientError:
                await stack.aclose()
                continue
            self.event(
                "ok",
                process,
                "init",
                pid=session.producer_id,
                epoch=session.epoch,
                transactional_id=transactional_id,
            )
            if previous is not None and previous_stack is not None:
                await self._zombie_sends(process, previous, numbers, session)
                with contextlib.suppress(ClientError):
                    await previous_stack.aclose()
                self.event("ok", process, "stats", **previous.stats())
            restart = asyncio.Event()
            asyncio.get_running_loop().call_later(self.settings.txn_restart_s, restart.set)
            await self._send_loop(process, session, numbers, until=restart)
            previous, previous_stack = session, stack
        if previous_stack is not None:
            with contextlib.suppress(ClientError):
                await previous_stack.aclose()

    async def _zombie_sends(
        self, process: str, zombie: Session, numbers: itertools.count[int], current: Session
    ) -> None:
        # The new epoch reaches a partition with its first batch there (as in Kafka without
        # transactions): write one record per partition first, then let the zombie try.
        limit = asyncio.Semaphore(self.settings.partitions * 2)
        for session in (current, zombie):
            async with asyncio.TaskGroup() as tasks:
                for partition in range(self.settings.partitions):
                    await limit.acquire()
                    n = next(numbers)
                    tasks.create_task(
                        self._send_one(process, session, f"{process}-{n}", partition, limit)
                    )

    # -- a client whose acknowledgements get lost -------------------------------------------

    async def run_resender(self, process: str) -> None:
        """Sends each batch, then sends the very same bytes again, as a client does when an
        acknowledgement is lost: the broker must answer the second with the first's offsets,
        never append it twice. (The negative control's duplicates come from here for sure.)"""
        pid, epoch = await self.clients.init_producer_id()
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
            first = await self.clients.produce_raw(partition, encoded)
            if isinstance(first, Refused):
                self.event(
                    "fail", process, "send", partition=partition, value=value, error=first.error
                )
                return
            again = None if first is None else await self.clients.produce_raw(partition, encoded)
            if first is None or again is None:
                self.event(
                    "info", process, "send", partition=partition, value=value, error="timeout"
                )
                return  # the session's sequence is unknown now: stop this process
            sequences[partition] = sequence + 1
            # A refused resend is answered with no offset: the checker's ack-mismatch.
            resent = again.offset if isinstance(again, Ack) else -1
            self.event(
                "ok",
                process,
                "send",
                partition=partition,
                value=value,
                offset=first.offset,
                pid=pid,
                epoch=epoch,
                sequence=sequence,
                resent_offset=resent,
                duplicate=again.duplicate if isinstance(again, Ack) else False,
            )
            await asyncio.sleep(self.settings.send_interval_s * 2)

    # -- consumers -------------------------------------------------------------------------------

    async def run_consumer(self, process: str) -> None:
        async with self.clients.reader(process) as reader:
            for partition in range(self.settings.partitions):
                self.event("ok", process, "seek", partition=partition, offset=0)
            while not self.stopping.is_set():
                try:
                    rows = await reader.poll()
                except (ClientError, TimeoutError):
                    continue
                by_partition: dict[int, list[list[object]]] = {}
                for partition, row in rows:
                    by_partition.setdefault(partition, []).append(row)
                for partition, found in by_partition.items():
                    self.event("ok", process, "poll", partition=partition, records=found)

    # -- a consumer group ------------------------------------------------------------------------

    async def run_group_member(self, process: str, group: str, *, restarts: bool = False) -> None:
        """A member of `group`: what it is assigned (each generation), what it reads, and its
        commit after each poll of what that poll read. With `restarts`, it leaves the group
        and joins again every `group_member_restart_s` (rebalances, under the faults)."""
        while not self.group_stopping.is_set():
            restart = asyncio.Event()
            if restarts:
                loop = asyncio.get_running_loop()
                loop.call_later(self.settings.group_member_restart_s, restart.set)
            await self._group_member_session(process, group, restart)

    async def _group_member_session(self, process: str, group: str, restart: asyncio.Event) -> None:
        async with self.clients.group_member(process, group) as member:
            held: tuple[int, str, tuple[int, ...]] | None = None
            while not self.group_stopping.is_set() and not restart.is_set():
                try:
                    got = await asyncio.wait_for(member.poll(), self.settings.op_timeout_s)
                except (ClientError, TimeoutError) as exc:
                    error = exc.error.name if isinstance(exc, ClientError) else "timeout"
                    self.event("info", process, "group_error", group=group, error=error)
                    continue
                who = {"group": group, "member": got.member_id, "generation": got.generation}
                if (got.generation, got.member_id, got.owned) != held:
                    held = (got.generation, got.member_id, got.owned)
                    self.event("ok", process, "assigned", partitions=list(got.owned), **who)
                    self._note_assigned(process, got.owned)
                by_partition: dict[int, list[list[object]]] = {}
                for partition, row in got.rows:
                    by_partition.setdefault(partition, []).append(row)
                for partition, found in by_partition.items():
                    self.event("ok", process, "group_poll", partition=partition, records=found,
                               **who)  # fmt: skip
                if by_partition:
                    offsets = {p: int(str(rows[-1][0])) + 1 for p, rows in by_partition.items()}
                    kind, error = await member.commit(offsets)
                    self.event(kind, process, "commit", offsets=sorted(offsets.items()),
                               error=error, **who)  # fmt: skip

    def _note_assigned(self, process: str, owned: tuple[int, ...]) -> None:
        if owned:
            self._assigned_once.add(process)
        if len(self._assigned_once) >= self.settings.group_members:
            self.group_formed.set()

    async def run_committed_watch(self, process: str, group: str) -> None:
        """The group's committed offsets, read again and again: they must never go back."""
        groups = Groups(self.native)
        while not self.group_stopping.is_set():
            try:
                committed = await groups.committed(group, timeout_s=self.settings.op_timeout_s)
            except ClientError:
                continue
            offsets = sorted((p, o) for (_, p), o in committed.items())
            self.event("ok", process, "committed", group=group, offsets=offsets)
            await asyncio.sleep(self.settings.committed_watch_interval_s)


# -- raftbroker's own client ---------------------------------------------------------------------


class NativeSession:
    """A session of the native `Producer`."""

    def __init__(self, producer: Producer, settings: WorkloadSettings) -> None:
        self._producer = producer
        self._settings = settings

    @property
    def producer_id(self) -> int:
        return self._producer.producer_id

    @property
    def epoch(self) -> int:
        return self._producer.epoch

    @property
    def ended(self) -> bool:
        return self._producer.fatal is not None

    async def send(self, partition: int, value: bytes) -> Sent:
        s = self._settings
        try:
            future = await self._producer.send(s.topic, value, partition=partition)
            meta = await asyncio.wait_for(future, s.op_timeout_s)
        except ClientError as exc:
            return Sent("fail" if exc.error in DEFINITE else "info", {"error": exc.error.name})
        except TimeoutError:
            return Sent("info", {"error": "timeout"})
        return Sent(
            "ok",
            {
                "offset": meta.offset,
                "pid": meta.producer_id,
                "epoch": meta.producer_epoch,
                "sequence": meta.sequence,
                "node": None,
                "duplicate": meta.duplicate,
            },
        )

    def stats(self) -> dict[str, int]:
        stats = self._producer.stats
        return {"retries": stats["retries"], "dedup_hits": stats["duplicates"]}


class NativeReader:
    def __init__(self, consumer: Consumer, timeout_s: float) -> None:
        self._consumer = consumer
        self._timeout_s = timeout_s

    async def poll(self) -> list[tuple[int, list[object]]]:
        records = await asyncio.wait_for(self._consumer.poll(), self._timeout_s)
        return [
            (
                r.partition,
                [r.offset, (r.value or b"").decode(), r.producer_id, r.producer_epoch, r.sequence],
            )
            for r in records
        ]


class NativeGroupReader:
    """A native `GroupConsumer`."""

    def __init__(self, member: GroupConsumer, timeout_s: float) -> None:
        self._member = member
        self._timeout_s = timeout_s

    async def poll(self) -> GroupPoll:
        records = await self._member.poll(200)
        member = self._member
        owned = tuple(sorted(i for _, i in member.assignment()))
        rows = [
            (
                r.partition,
                [r.offset, (r.value or b"").decode(), r.producer_id, r.producer_epoch, r.sequence],
            )
            for r in records
        ]
        return GroupPoll(member.generation, member.member_id, owned, rows)

    async def commit(self, offsets: dict[int, int]) -> tuple[str, str]:
        topic = next(iter(self._member.topics))
        try:
            await asyncio.wait_for(
                self._member.commit({(topic, p): o for p, o in offsets.items()}), self._timeout_s
            )
        except CommitFailedError as exc:
            return "fail", exc.error.name
        except ClientError as exc:
            return "info", exc.error.name
        except TimeoutError:
            return "info", "timeout"
        return "ok", ""


class NativeClients:
    """The processes' client: raftbroker's own `Producer` and `Consumer` (cluster/client)."""

    def __init__(self, cluster: ClientCluster, settings: WorkloadSettings) -> None:
        self.cluster = cluster
        self.settings = settings

    def _config(self, transactional_id: str = "") -> ProducerConfig:
        return ProducerConfig(
            transactional_id=transactional_id,
            linger_ms=1.0,
            delivery_timeout_ms=int(self.settings.op_timeout_s * 1000),
        )

    @contextlib.asynccontextmanager
    async def producer(self, process: str) -> AsyncIterator[Session]:  # noqa: ARG002
        async with Producer(self.cluster, self._config()) as producer:
            yield NativeSession(producer, self.settings)

    @contextlib.asynccontextmanager
    async def transactional(
        self,
        process: str,  # noqa: ARG002
        transactional_id: str,
    ) -> AsyncIterator[Session]:
        async with Producer(self.cluster, self._config(transactional_id)) as producer:
            yield NativeSession(producer, self.settings)

    @contextlib.asynccontextmanager
    async def reader(self, process: str) -> AsyncIterator[Reader]:  # noqa: ARG002
        s = self.settings
        consumer = Consumer(self.cluster, ConsumerConfig(max_wait_ms=200))
        await consumer.assign(s.topic, range(s.partitions), Consumer.EARLIEST)
        yield NativeReader(consumer, s.op_timeout_s)

    @contextlib.asynccontextmanager
    async def group_member(self, process: str, group: str) -> AsyncIterator[GroupReader]:
        s = self.settings
        config = GroupConfig(
            session_timeout_ms=s.group_session_timeout_ms,
            heartbeat_interval_ms=s.group_heartbeat_interval_ms,
            rebalance_timeout_ms=int(s.op_timeout_s * 1000),
            client_id=process,
            auto_offset_reset=Consumer.EARLIEST,
        )
        member = GroupConsumer(
            self.cluster, group, [s.topic], config, ConsumerConfig(max_wait_ms=200)
        )
        try:
            yield NativeGroupReader(member, s.op_timeout_s)
        finally:
            await member.close()

    async def init_producer_id(self) -> tuple[int, int]:
        init = await retrying(
            lambda: self.cluster.send_any(p.InitProducerId("", 60_000, -1, -1)),
            RAW_INIT_TIMEOUT_S,
        )
        assert isinstance(init, p.InitProducerIdResponse)
        return init.producer_id, init.epoch

    async def produce_raw(self, partition: int, batch: bytes) -> Ack | Refused | None:
        """Retries every error, definite ones included, until the op timeout (as before the
        Kafka client existed: a correct broker never refuses these batches)."""
        topic = self.settings.topic
        request = p.Produce(5_000, (p.ProduceEntry(topic, partition, batch),))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.op_timeout_s
        while loop.time() < deadline:
            try:
                response = await self.cluster.send_to_leader(topic, partition, request, 6.0)
            except ClientError:
                await self._refresh()
                continue
            assert isinstance(response, p.ProduceResponse)
            result = response.results[0]
            if result.error == ErrorCode.NONE:
                return Ack(result.base_offset, result.duplicate)
            if result.leader:
                self.cluster.note_leader(topic, partition, result.leader)
                await asyncio.sleep(0.05)
            else:
                await self._refresh()
        return None

    async def _refresh(self) -> None:
        """Metadata again, after a pause; no node answering (every node down at once, as in a
        power cut of them all) is one more thing to retry."""
        with contextlib.suppress(ClientError):
            await self.cluster.refresh([self.settings.topic])
        await asyncio.sleep(0.05)
