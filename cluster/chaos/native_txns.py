"""The chaos workload's transactions through the client library (`raftbroker chaos run`, the
native client): the same writer, processor and watcher as kafka_txns.py's, with
`TransactionalProducer`, a read_committed `GroupConsumer` and `Admin`, recording the same events
(txn_workload.py), so txn_checker.py judges the native protocol's transactions as it judges
Kafka's.

Rules: a call that fails with the transaction certainly not committed (a record failed, the
abort that followed answered) is `fail`; one whose outcome is unknown (the commit's answer lost,
the producer fenced or out of time) is `info`, and a new producer takes the transactional id
(fencing the old and aborting what it left open, as an application restarts). The processor
rewinds its consumer to the group's committed offsets after a transaction that did not commit,
as the Kafka processor does, and makes a new member where it cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable

from cluster import native as p
from cluster.chaos.clients import Record
from cluster.chaos.txn_checker import output_of
from cluster.chaos.txn_workload import (
    ABORT_EVERY,
    CALL_TIMEOUT_S,
    CTP_ABORT_EVERY,
    CTP_GROUP,
    CTP_ID,
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
from cluster.client import (
    Admin,
    Client,
    ClientError,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    Groups,
    ProducerConfig,
    RetryPolicy,
    TransactionalProducer,
    TxnAbortableError,
)
from statemachine.errors import ErrorCode

REQUEST_TIMEOUT_S = 5.0
PRODUCER = ProducerConfig(
    transaction_timeout_ms=TXN_TIMEOUT_MS,
    linger_ms=1.0,
    delivery_timeout_ms=int(CALL_TIMEOUT_S * 1000),
    request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000),
)
MEMBER = GroupConfig(
    session_timeout_ms=6_000,
    heartbeat_interval_ms=500,
    client_id="chaos-ctp",
    auto_offset_reset=Consumer.EARLIEST,
)


class NativeTxnWorkload(TxnWorkloadBase):
    """The writer, the processor, the watcher and the final reads, with the client library."""

    def __init__(
        self, bootstrap: list[str], partitions: int, record: Record, clock_ms: Callable[[], float]
    ) -> None:
        super().__init__(partitions, record, clock_ms)
        self.bootstrap = bootstrap
        self._watching = self._client()  # the watcher's and the final reads'

    def _client(self) -> Client:
        return Client(
            self.bootstrap,
            request_timeout_s=REQUEST_TIMEOUT_S,
            retry=RetryPolicy(CALL_TIMEOUT_S),
        )

    async def close(self) -> None:
        await self._watching.close()

    @contextlib.asynccontextmanager
    async def _own_client(self) -> AsyncIterator[Client]:
        client = self._client()
        try:
            yield client
        finally:
            await client.close()

    async def _end(self, producer: TransactionalProducer, commit: bool) -> tuple[str, str, float]:
        """Commit or abort the open transaction: (outcome, error, when it was asked)."""
        ending_ms = self._clock_ms()
        try:
            await (producer.commit() if commit else producer.abort())
        except TxnAbortableError as exc:  # a record failed: the commit was never asked
            try:
                await producer.abort()
            except ClientError:
                return "info", exc.error.name, ending_ms
            return "fail", exc.error.name, ending_ms
        except ClientError as exc:
            return "info", exc.error.name, ending_ms
        return "ok", "", ending_ms

    # -- the writer ------------------------------------------------------------------------------

    async def run_writer(self, process: str) -> None:
        numbers = itertools.count()
        async with self._own_client() as client:
            while not self.stopping.is_set():
                try:
                    async with TransactionalProducer(client, WRITER_ID, PRODUCER) as producer:
                        while not self.stopping.is_set():
                            if not await self._write(process, producer, next(numbers)):
                                break  # its state is unknown: a new producer takes the id
                            await asyncio.sleep(WRITER_INTERVAL_S)
                except ClientError as exc:
                    self.event("info", process, "txn_producer", error=exc.error.name)

    async def _write(self, process: str, producer: TransactionalProducer, n: int) -> bool:
        values = self.values_of(process, n)
        commit = n % ABORT_EVERY != ABORT_EVERY - 1
        txn = f"{process}-{n}"
        fields = {"txn": txn, "topic": TXN_TOPIC, "values": values}
        self.event("invoke", process, "txn", intent="commit" if commit else "abort", **fields)
        try:
            producer.begin()
            for partition, value in values:
                await producer.send(TXN_TOPIC, value.encode(), partition=partition)
        except ClientError as exc:  # a registration refused or not answered: unknown
            self.event("info", process, "txn", txn=txn, error=exc.error.name,
                       ending_ms=self._clock_ms())  # fmt: skip
            return False
        kind, error, ending_ms = await self._end(producer, commit)
        self.event(kind, process, "txn", txn=txn, error=error, ending_ms=ending_ms)
        return kind != "info"

    # -- the processor ---------------------------------------------------------------------------

    async def run_processor(self, process: str) -> None:
        """Until drained: a member and a producer; both are made anew when the member could not
        be rewound after a transaction that did not commit, the producer alone when its state
        is unknown."""
        numbers = itertools.count()
        async with self._own_client() as client:
            while not self.drained.is_set():
                member = GroupConsumer(
                    client, CTP_GROUP, [TXN_TOPIC], MEMBER, ConsumerConfig(read_committed=True)
                )
                try:
                    await self._with_member(process, client, member, numbers)
                finally:
                    with contextlib.suppress(ClientError):
                        await member.close()

    async def _with_member(
        self,
        process: str,
        client: Client,
        member: GroupConsumer,
        numbers: itertools.count[int],
    ) -> None:
        rewound = True
        while rewound and not self.drained.is_set():
            try:
                async with TransactionalProducer(client, CTP_ID, PRODUCER) as producer:
                    rewound = await self._process(process, client, member, producer, numbers)
            except ClientError as exc:
                self.event("info", process, "txn_producer", error=exc.error.name)

    async def _process(
        self,
        process: str,
        client: Client,
        member: GroupConsumer,
        producer: TransactionalProducer,
        numbers: itertools.count[int],
    ) -> bool:
        """`drive` with the client library's member and transactional producer."""

        async def poll() -> list[list[object]] | None:
            try:
                records = await member.poll(round(POLL_S * 1000))
            except ClientError as exc:
                self.event("info", process, "txn_member", error=exc.error.name)
                return None
            return [[r.partition, r.offset, (r.value or b"").decode()] for r in records]

        async def transform(inputs: list[list[object]], read_ms: float, n: int) -> str:
            return await self._transform(
                process, member, producer, inputs=inputs, read_ms=read_ms, n=n
            )

        return await self.drive(
            numbers,
            poll,
            transform,
            lambda: self._rewind(process, client, member),
            lambda: self._caught_up(client, member, producer),
        )

    async def _transform(
        self,
        process: str,
        member: GroupConsumer,
        producer: TransactionalProducer,
        *,
        inputs: list[list[object]],
        read_ms: float,
        n: int,
    ) -> str:
        """One transaction of these inputs' outputs and offsets: "ok-commit", "ended"
        (certainly not committed) or "info" (unknown)."""
        txn = f"{process}-{n}"
        values = [[partition, output_of(str(value), txn)] for partition, _offset, value in inputs]
        commit = n % CTP_ABORT_EVERY != CTP_ABORT_EVERY - 1
        self.event(
            "invoke", process, "txn", txn=txn, topic=OUT_TOPIC, values=values, inputs=inputs,
            read_ms=read_ms, intent="commit" if commit else "abort",
        )  # fmt: skip
        try:
            producer.begin()
            for partition, value in values:
                await producer.send(OUT_TOPIC, str(value).encode(), partition=int(str(partition)))
            await producer.send_offsets(member.positions(), member.group_metadata())
        except ClientError as exc:
            kind, _, ending_ms = await self._end(producer, commit=False)
            kind = "fail" if kind == "ok" else "info"
            self.event(kind, process, "txn", txn=txn, error=exc.error.name, ending_ms=ending_ms)
            return "ended" if kind == "fail" else "info"
        kind, error, ending_ms = await self._end(producer, commit)
        self.event(kind, process, "txn", txn=txn, error=error, ending_ms=ending_ms)
        if kind == "info":
            return "info"
        return "ok-commit" if kind == "ok" and commit else "ended"

    async def _rewind(self, process: str, client: Client, member: GroupConsumer) -> bool:
        """Back to the group's committed offsets (the start where none), as after an abort;
        False, recorded, if it could not be done (a new member starts there by itself)."""
        assigned = sorted(member.assignment())
        try:
            committed = await Groups(client).committed(CTP_GROUP, assigned, require_stable=True)
            for topic, partition in assigned:
                start = committed.get((topic, partition), Consumer.EARLIEST)
                await member.consumer.seek(topic, partition, start)
        except ClientError as exc:
            self.event("info", process, "rewind", error=exc.error.name)
            return False
        return True

    async def _caught_up(
        self, client: Client, member: GroupConsumer, producer: TransactionalProducer
    ) -> bool:
        """Whether the group committed every input partition's last stable offset (`standing`;
        where only aborted records lay past its commits, its positions are committed alone,
        `ctp_offsets`)."""
        asked = [(TXN_TOPIC, n) for n in range(self.partitions)]
        try:
            found = await Groups(client).committed(CTP_GROUP, asked, require_stable=True)
        except ClientError:
            return False
        committed = {n: offset for (_topic, n), offset in found.items()}
        positions = {n: offset for (t, n), offset in member.positions().items() if t == TXN_TOPIC}
        standing = await self.standing(committed, positions)
        if standing == "behind":
            await self._commit_positions(member, producer)
        return standing == "caught-up"

    async def _commit_positions(
        self, member: GroupConsumer, producer: TransactionalProducer
    ) -> None:
        positions = member.positions()
        try:
            producer.begin()
            await producer.send_offsets(positions, member.group_metadata())
            await producer.commit()
        except ClientError as exc:
            with contextlib.suppress(ClientError):
                await producer.abort()
            self.event("info", "y0", "ctp_offsets", offsets=sorted(positions.items()),
                       error=exc.error.name)  # fmt: skip
            return
        self.event("ok", "y0", "ctp_offsets", offsets=sorted(positions.items()), error="")

    # -- what the watcher and the final reads ask ------------------------------------------------

    async def offset(self, topic: str, partition: int, *, read_committed: bool) -> tuple[int, int]:
        admin = Admin(self._watching)
        try:
            found = await admin.list_offsets(
                topic, partition, Consumer.LATEST, read_committed=read_committed
            )
        except ClientError as exc:
            return exc.error, -1
        return ErrorCode.NONE, found

    async def read_final(self, topic: str, isolation: str) -> tuple[Rows, set[int]]:
        committed = isolation == "read_committed"
        consumer = Consumer(self._watching, ConsumerConfig(read_committed=committed))
        rows: Rows = [[] for _ in range(self.partitions)]
        ends: dict[int, int] = {}
        for partition in range(self.partitions):
            error, end = await self.offset(topic, partition, read_committed=committed)
            if not error:
                ends[partition] = end
                await consumer.seek(topic, partition, Consumer.EARLIEST)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_TIMEOUT_S
        ended = {n for n, end in ends.items() if consumer.positions[(topic, n)].offset >= end}
        while len(ended) < len(ends) and loop.time() < deadline:
            for r in await consumer.poll(round(POLL_S * 1000)):
                if r.offset < ends[r.partition]:
                    value = (r.value or b"").decode()
                    rows[r.partition].append([r.offset, value, r.producer_id, r.producer_epoch,
                                              r.sequence])  # fmt: skip
            ended = {n for n, end in ends.items() if consumer.positions[(topic, n)].offset >= end}
        return rows, ended

    async def committed(self) -> list[list[int]]:
        asked = [(TXN_TOPIC, n) for n in range(self.partitions)]
        try:
            found = await Groups(self._watching).committed(CTP_GROUP, asked)
        except ClientError:
            return []
        return [[n, found.get((TXN_TOPIC, n), -1)] for n in range(self.partitions)]

    async def coordinator_node(self) -> int | None:
        try:
            answer = await self._watching.send_any(p.FindCoordinator(WRITER_ID, p.TXN_KEY))
        except ClientError:
            return None
        assert isinstance(answer, p.FindCoordinatorResponse)
        return answer.node_id if answer.error == ErrorCode.NONE else None
