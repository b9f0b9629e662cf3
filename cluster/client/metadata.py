"""The cluster as a client sees it: bootstrap addresses, a connection per broker, the metadata
cache, leader lookup and routing, and `retrying`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cluster import protocol as p
from cluster.client.connection import Connection, OnAnswer
from cluster.client.errors import ClientError
from statemachine.errors import ErrorCode


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
