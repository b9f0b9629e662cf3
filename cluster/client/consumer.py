"""The Consumer: reads assigned partitions in order from their leaders."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from cluster import protocol as p
from cluster.client.admin import Admin
from cluster.client.errors import ClientError
from cluster.client.metadata import Cluster
from statemachine.errors import ErrorCode
from statemachine.records import SEQUENCE_MODULUS, RecordBatch


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
