"""raftbroker's own client behind the workload's `Clients` (clients.py): the native
`Producer`, `Consumer` and `GroupConsumer`, and the resender's raw batches through the native
protocol. Kafka's clients are the other implementation (kafka_clients.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from cluster import native as p
from cluster.chaos.clients import (
    DEFINITE,
    Ack,
    GroupPoll,
    GroupReader,
    Reader,
    Refused,
    Sent,
    Session,
    WorkloadSettings,
)
from cluster.client import (
    Client,
    ClientError,
    CommitFailedError,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    Producer,
    ProducerConfig,
    retrying,
)
from statemachine.errors import ErrorCode

RAW_INIT_TIMEOUT_S = 30.0  # the resender's InitProducerId


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

    def __init__(self, cluster: Client, settings: WorkloadSettings) -> None:
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
