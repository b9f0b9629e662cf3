"""The Consumer: reads assigned partitions in order from their leaders.

Rules: `poll` never fails for a retriable reason. A partition whose leader is dead, moving or
not elected yet is asked again within the poll (its leader forgotten or its hint believed,
metadata refreshed, backing off) and is *stalled* (`stalled`, `stall_error`) until its leader
answers; the caller decides how long a stall may last (the CLI: its --timeout-ms). While any
partition is stalled, fetches wait at most `STALLED_WAIT_MS`, so the stalled one is asked
again soon, not after a long poll of the others. A final error (OFFSET_OUT_OF_RANGE) raises,
unless `auto_offset_reset` says where such a partition starts over (Kafka's fetcher resets it
there, and the other partitions' records of the same fetch are returned as usual).

Fairness: a fetch's budget (`max_bytes`) goes to partitions in the order the fetch lists them,
and a partition that returned records moves to the back of that order, so a partition with a
long backlog cannot starve the others of one leader (KIP-74 gives only the first partition
with data a batch beyond the budget).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from cluster import native as p
from cluster.client.admin import Admin
from cluster.client.batches import read_batch
from cluster.client.errors import ClientError
from cluster.client.metadata import Client, no_leader
from cluster.client.retry import CallTimeoutError, Failure
from statemachine.errors import ErrorCode
from statemachine.records import SEQUENCE_MODULUS, BatchFormatError, is_control_batch

STALLED_WAIT_MS = 100


class ConsumedRecord(NamedTuple):
    """One record as a consumer sees it (a named tuple: a consumer makes one per record)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    append_time_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    producer_id: int
    producer_epoch: int
    sequence: int


@dataclass(slots=True)
class _Position:
    offset: int
    high_watermark: int = -1


@dataclass(slots=True)
class Stall:
    """A partition whose leader has not served a fetch since `since` (seconds on the client's
    clock, `RetryPolicy.clock`)."""

    since: float
    last: Failure


@dataclass(slots=True)
class ConsumerConfig:
    max_wait_ms: int = 500
    max_bytes: int = 4 << 20
    partition_max_bytes: int = 1 << 20
    # Where a partition whose position is outside its log starts over (Consumer.EARLIEST or
    # LATEST); None: OFFSET_OUT_OF_RANGE raises.
    auto_offset_reset: int | None = None
    # Kafka's isolation.level: read_committed (librdkafka's default) reads up to the last
    # stable offset, without aborted transactions' records; False reads them all.
    read_committed: bool = True


class Consumer:
    """Reads assigned partitions in order from their leaders."""

    EARLIEST, LATEST = -2, -1

    def __init__(self, cluster: Client, config: ConsumerConfig | None = None) -> None:
        self.cluster = cluster
        self.config = config or ConsumerConfig()
        self.positions: dict[tuple[str, int], _Position] = {}
        self.stalled: dict[tuple[str, int], Stall] = {}
        self._admin = Admin(cluster)

    async def assign(
        self, topic: str, partitions: Iterable[int] | None = None, start: int = EARLIEST
    ) -> None:
        """Assign partitions (all by default) at EARLIEST, LATEST or an absolute offset."""
        infos = await self.cluster.partitions(topic)
        for partition in partitions if partitions is not None else [i.partition for i in infos]:
            await self.seek(topic, partition, start)

    async def seek(self, topic: str, partition: int, offset: int) -> None:
        """EARLIEST, LATEST (for a read_committed consumer, the last stable offset) or an
        absolute offset."""
        if offset in (self.EARLIEST, self.LATEST):
            offset = await self._admin.list_offsets(
                topic, partition, offset, read_committed=self.config.read_committed
            )
        self.positions[(topic, partition)] = _Position(offset)

    async def poll(self, max_wait_ms: int | None = None) -> list[ConsumedRecord]:
        """The next records of every assigned partition, in offset order per partition; []
        once `max_wait_ms` passed without any (stalled partitions asked again meanwhile)."""
        wait_ms = self.config.max_wait_ms if max_wait_ms is None else max_wait_ms
        deadline = time.monotonic() + wait_ms / 1000
        backoff_s = self.cluster.retry.backoff_s
        while True:
            left_ms = max(0, round((deadline - time.monotonic()) * 1000))
            records = await self._round(min(left_ms, STALLED_WAIT_MS) if self.stalled else left_ms)
            left_s = deadline - time.monotonic()
            if records or left_s <= 0:
                return records
            if self.stalled:
                await asyncio.sleep(min(backoff_s, left_s))
                backoff_s = min(backoff_s * 2, self.cluster.retry.backoff_max_s)

    def stall_error(self, at_least_s: float = 0.0) -> CallTimeoutError | None:
        """The error for the longest stall, if it has lasted `at_least_s`: what a caller
        raises when it stops waiting for that partition's leader."""
        if not self.stalled:
            return None
        (topic, partition), stall = min(self.stalled.items(), key=lambda kv: kv[1].since)
        lasted_s = self.cluster.retry.clock() - stall.since
        if lasted_s < at_least_s:
            return None
        return CallTimeoutError(f"no leader for {topic}-{partition} answered", lasted_s, stall.last)

    def _stall(self, key: tuple[str, int], failure: Failure) -> None:
        stall = self.stalled.get(key)
        if stall is None:
            self.stalled[key] = Stall(self.cluster.retry.clock(), failure)
        else:
            stall.last = failure

    async def _round(self, wait_ms: int) -> list[ConsumedRecord]:
        """One fetch from each leader of the assigned partitions."""
        by_leader: dict[str, list[tuple[str, int]]] = {}
        for topic, partition in self.positions:
            unknown = None
            if self.cluster.leader_address(topic, partition) is None:
                unknown = await self.cluster.reroute(topic, partition)
            address = self.cluster.leader_address(topic, partition)
            if address is None:
                self._stall((topic, partition), no_leader(unknown))
            else:
                by_leader.setdefault(address, []).append((topic, partition))
        results = await asyncio.gather(
            *(self._fetch(address, keys, wait_ms) for address, keys in by_leader.items())
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
            replica_read=False,
            read_committed=self.config.read_committed,
        )
        try:
            response = await self.cluster.send(address, request, wait_ms / 1000 + 10)
        except ClientError as exc:
            if not exc.retriable:
                raise
            for key in keys:
                self._stall(key, Failure.of(exc, address))
            for t, n in {t: (t, n) for t, n in keys}.values():  # one refresh per topic
                await self.cluster.reroute(t, n, exc)
            return []
        assert isinstance(response, p.FetchResponse)
        records: list[ConsumedRecord] = []
        for result in response.results:
            records.extend(await self._take(address, result))
        return records

    async def _take(self, address: str, result: p.FetchResult) -> list[ConsumedRecord]:
        key = (result.topic, result.partition)
        position = self.positions[key]
        error = ErrorCode(result.error)
        if error != ErrorCode.NONE:
            if error == ErrorCode.OFFSET_OUT_OF_RANGE:
                reset = self.config.auto_offset_reset
                if reset is None:
                    raise ClientError(error, f"{result.topic}-{result.partition}@{position.offset}")
                await self.seek(result.topic, result.partition, reset)
                return []
            self._stall(key, Failure(error, address))
            await self.cluster.reroute(result.topic, result.partition, hint=result.leader)
            return []
        self.stalled.pop(key, None)
        # What is there to read: up to the last stable offset for a read_committed consumer.
        position.high_watermark = (
            result.last_stable_offset if self.config.read_committed else result.high_watermark
        )
        records = []
        for fetched in result.batches:
            records.extend(self._records(result.topic, result.partition, fetched, position))
        # Past what the broker dropped for a read_committed reader (aborted data, markers).
        position.offset = max(position.offset, result.next_offset)
        if result.batches:
            # To the back of the fetch order (as Kafka's fetcher does): the budget of the next
            # fetch goes to the partitions that got nothing this time first.
            self.positions[key] = self.positions.pop(key)
        return records

    @staticmethod
    def _records(
        topic: str, partition: int, fetched: p.FetchedBatch, position: _Position
    ) -> list[ConsumedRecord]:
        base = fetched.base_offset
        if is_control_batch(fetched.batch):  # a transaction's marker: one offset, no record
            position.offset = max(position.offset, base + 1)
            return []
        try:
            batch, records = read_batch(fetched.batch)  # verifies the CRC end to end
        except BatchFormatError as exc:  # as Kafka's consumers raise CorruptRecordException
            where = f"{topic}-{partition}, the batch at offset {base}"
            raise ClientError(ErrorCode.CORRUPT_MESSAGE, f"{where}: {exc}") from None
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
