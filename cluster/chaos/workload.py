"""The chaos workload: producers and consumers that record every operation in the history.

Role: drive the cluster as users do and write what each operation asked and got as history
events for the checker. Every value is unique (`<process>-<n>`), so the checker can follow each
one into the log. The processes: idempotent producers; a transactional-id producer replaced
now and then, whose predecessor (a zombie) must be fenced; a client that sends every batch twice
as if its acknowledgement had been lost; a consumer; a streaming sink that writes
micro-batches through fenced writes and reruns some of them, as Spark does after a crash: its
values must be in the log once, whatever the faults; and a consumer group whose members read
what it assigns them and commit after each poll, with a watcher reading the group's commits.

Which client does the work is a `Clients` (clients.py; one per protocol, `--client`):
`NativeClients` in native_clients.py (raftbroker's own `Producer` and `Consumer`), `KafkaClients`
in kafka_clients.py (confluent-kafka and requests of our Kafka codec). The processes' logic,
and so their events, is the same for both. The sink has no Kafka counterpart and always
writes through the native client.

An operation is `fail` only when the broker said, definitely, that it did not happen (a fenced
epoch, a sequence or request error); a timeout, a lost connection, a leader change or anything
unknown is `info`: it may or may not have happened, and the checker treats it so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random

from cluster.chaos.clients import Ack, Clients, Record, Refused, Session, WorkloadSettings
from cluster.client import Client, ClientError, Groups
from cluster.client.fenced import FencedWriter, FencedWriterConfig, SinkRecord
from cluster.clock import wall_ms
from statemachine.records import Record as LogRecord
from statemachine.records import RecordBatch


class Clock:
    """Milliseconds since the run started, for every event."""

    def __init__(self) -> None:
        self._start = asyncio.get_running_loop().time()

    def ms(self) -> float:
        return round((asyncio.get_running_loop().time() - self._start) * 1000, 3)


# -- the processes -------------------------------------------------------------------------------


class Workload:
    """`record` takes each event and stamps it with the run's clock (runner.py). `native` is
    the native client the sink writes through, whichever `clients` do the rest."""

    def __init__(
        self,
        clients: Clients,
        native: Client,
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
