"""Administration: topics, producer state, cluster status and offsets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from cluster import protocol as p
from cluster.client.errors import ClientError
from cluster.client.metadata import Cluster, retrying
from statemachine.errors import ErrorCode


class Admin:
    """Topics, producers and cluster status."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        *,
        retention_ms: int = -1,
        retention_bytes: int = -1,
        wait_s: float = 30.0,
    ) -> int:
        """Create a topic and wait until every partition has a leader; returns its id."""
        request = p.CreateTopic(name, partitions, replication_factor, retention_ms, retention_bytes)
        response = await retrying(lambda: self.cluster.send_any(request), wait_s)
        assert isinstance(response, p.CreateTopicResponse)
        await self.wait_for_leaders(name, wait_s)
        return response.topic_id

    async def wait_for_leaders(self, name: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            meta = await self.cluster.refresh([name])
            topic = next(t for t in meta.topics if t.name == name)
            if topic.error == ErrorCode.NONE and all(pm.leader_id >= 0 for pm in topic.partitions):
                return
            if time.monotonic() > deadline:
                raise ClientError(ErrorCode.LEADER_NOT_AVAILABLE, f"{name}: no leader yet")
            await asyncio.sleep(0.1)

    async def delete_topic(self, name: str) -> None:
        await retrying(lambda: self.cluster.send_any(p.DeleteTopic(name)), 30.0)

    async def describe_topics(self, names: Iterable[str] = ()) -> p.MetadataResponse:
        return await self.cluster.refresh(names)

    async def describe_producers(
        self, topic: str, partitions: Iterable[int] | None = None
    ) -> list[p.PartitionProducers]:
        infos = await self.cluster.partitions(topic)
        wanted = list(partitions) if partitions is not None else [i.partition for i in infos]
        results: list[p.PartitionProducers] = []
        for partition in wanted:
            request = p.DescribeProducers(topic, (partition,))
            response = await retrying(
                lambda r=request, n=partition: self._ask_leader(topic, n, r), 10.0
            )
            assert isinstance(response, p.DescribeProducersResponse)
            results.extend(response.results)
        return results

    async def _ask_leader(self, topic: str, partition: int, request: p.Request) -> p.Response:
        response = await self.cluster.send_to_leader(topic, partition, request)
        errors = _partition_errors(response)
        if errors:
            error, leader = errors[0]
            await self._follow(topic, partition, leader)
            raise ClientError(error, f"{topic}-{partition}", leader)
        return response

    async def _follow(self, topic: str, partition: int, leader: str) -> None:
        if leader:
            self.cluster.note_leader(topic, partition, leader)
        else:
            await self.cluster.refresh([topic])

    async def cluster_status(self, address: str | None = None) -> p.ClusterStatusResponse:
        request = p.ClusterStatus()
        response = await (
            self.cluster.send(address, request) if address else self.cluster.send_any(request)
        )
        assert isinstance(response, p.ClusterStatusResponse)
        return response

    async def list_offsets(self, topic: str, partition: int, spec: int) -> int:
        request = p.ListOffsets((p.OffsetQuery(topic, partition, spec),))
        response = await retrying(lambda: self._ask_leader(topic, partition, request), 10.0)
        assert isinstance(response, p.ListOffsetsResponse)
        return response.results[0].offset


def _partition_errors(response: p.Response) -> list[tuple[ErrorCode, str]]:
    results = getattr(response, "results", ())
    return [
        (ErrorCode(r.error), getattr(r, "leader", ""))
        for r in results
        if getattr(r, "error", 0) != ErrorCode.NONE
    ]
