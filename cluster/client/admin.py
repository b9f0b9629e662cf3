"""Administration: topics, producer state, cluster status and offsets.

Rules: every call rides out dead nodes and leader changes until its timeout (`timeout_s`, else
the cluster's retry policy; cluster/client/retry.py), through the Client's `call_any` (topics:
any broker forwards to the metadata leader) and `call_leader` (a partition's leader answers).
A refusal of a topic command names its topic and why (`topic 'orders' already exists`), with
the broker's code kept as the error's `.error`.
"""

from __future__ import annotations

from collections.abc import Iterable

from cluster import native as p
from cluster.client.errors import ClientError
from cluster.client.metadata import Client, partition_error
from cluster.client.retry import Attempts, Failure, RetryPolicy, final
from statemachine.errors import ErrorCode
from statemachine.limits import DEFAULT_LIMITS

LEADER_POLL_S = 0.1  # a new topic's partitions elect leaders in about a second


class Admin:
    """Topics, producers and cluster status."""

    def __init__(self, cluster: Client) -> None:
        self.cluster = cluster

    def _timeout(self, timeout_s: float | None) -> float:
        return self.cluster.retry.timeout_s if timeout_s is None else timeout_s

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        *,
        retention_ms: int = -1,
        retention_bytes: int = -1,
        timeout_s: float | None = None,
    ) -> int:
        """Create a topic and wait until every partition has a leader; returns its id."""
        request = p.CreateTopic(name, partitions, replication_factor, retention_ms, retention_bytes)
        leaders = self._leader_wait(name, self._timeout(timeout_s))  # one deadline for both
        try:
            response = await self.cluster.call_any(request, timeout_s=leaders.left_s())
        except ClientError as exc:
            raise await self._refused_creation(request, exc, leaders.left_s()) from None
        assert isinstance(response, p.CreateTopicResponse)
        await self._wait_for_leaders(name, leaders)
        return response.topic_id

    async def wait_for_leaders(self, name: str, timeout_s: float | None = None) -> None:
        """Until every partition of `name` has a leader, as metadata from any broker says."""
        await self._wait_for_leaders(name, self._leader_wait(name, self._timeout(timeout_s)))

    def _leader_wait(self, name: str, timeout_s: float) -> Attempts:
        polling = RetryPolicy(timeout_s, LEADER_POLL_S, LEADER_POLL_S, self.cluster.retry.clock)
        return Attempts(f"topic {name}: not every partition had a leader", timeout_s, polling)

    async def _wait_for_leaders(self, name: str, attempts: Attempts) -> None:
        while True:
            try:
                meta = await self.cluster.refresh([name])
            except ClientError as exc:
                if final(exc.error):
                    raise
                attempts.failed(Failure.of(exc))
            else:
                topic = next(t for t in meta.topics if t.name == name)
                if topic.error == ErrorCode.NONE and all(
                    pm.leader_id >= 0 for pm in topic.partitions
                ):
                    return
                # A broker that has not applied the creation yet says UNKNOWN: keep asking.
                attempts.failed(Failure(ErrorCode.LEADER_NOT_AVAILABLE, detail="no leader yet"))
            await attempts.pause()

    async def _refused_creation(
        self, request: p.CreateTopic, exc: ClientError, timeout_s: float
    ) -> ClientError:
        """The error of a refused CreateTopic, naming the topic and the bound it broke."""
        name, factor = request.name, request.replication_factor
        match exc.error:
            case ErrorCode.TOPIC_ALREADY_EXISTS:
                why = f"topic {name!r} already exists"
            case ErrorCode.INVALID_PARTITIONS:
                most = DEFAULT_LIMITS.partitions_per_topic_max
                why = f"topic {name!r}: {request.partitions} partitions, at most {most}"
            case ErrorCode.INVALID_REPLICATION_FACTOR:
                why = f"topic {name!r}: {await self._replication_bound(name, factor, timeout_s)}"
            case ErrorCode.INVALID_TOPIC_EXCEPTION:
                why = f"{name!r} is not a valid topic name: {exc.message}"
            case ErrorCode.POLICY_VIOLATION:
                most = DEFAULT_LIMITS.topics_max
                why = f"topic {name!r}: the cluster holds its maximum of {most} topics"
            case _:
                return exc
        return ClientError(exc.error, why, exc.leader, address=exc.address, answered=exc.answered)

    async def _replication_bound(self, name: str, factor: int, timeout_s: float) -> str:
        """Why `factor` replicas cannot be placed: the cluster's node count, or the limit."""
        most = DEFAULT_LIMITS.replication_factor_max
        if factor > most:
            return f"replication factor {factor}, at most {most} (replication_factor_max)"
        try:  # metadata of this one topic: every answer lists the brokers
            meta = await self.cluster.metadata([name], timeout_s=max(timeout_s, 1.0))
            nodes = len(meta.brokers)
        except ClientError:
            return f"replication factor {factor} is more than the cluster's nodes"
        held = "node" if nodes == 1 else "nodes"
        return f"replication factor {factor}, but the cluster has {nodes} {held}"

    async def delete_topic(self, name: str, *, timeout_s: float | None = None) -> None:
        try:
            await self.cluster.call_any(p.DeleteTopic(name), timeout_s=timeout_s)
        except ClientError as exc:
            if exc.error != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            gone = f"topic {name!r} does not exist"
            raise ClientError(exc.error, gone, address=exc.address, answered=exc.answered) from None

    async def describe_topics(
        self, names: Iterable[str] = (), *, timeout_s: float | None = None
    ) -> p.MetadataResponse:
        return await self.cluster.metadata(names, timeout_s=timeout_s)

    async def describe_producers(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> list[p.PartitionProducers]:
        infos = await self.cluster.partitions(topic, timeout_s=timeout_s)
        wanted = list(partitions) if partitions is not None else [i.partition for i in infos]
        results: list[p.PartitionProducers] = []
        for partition in wanted:
            request = p.DescribeProducers(topic, (partition,))
            response = await self._ask_leader(topic, partition, request, timeout_s)
            assert isinstance(response, p.DescribeProducersResponse)
            results.extend(response.results)
        return results

    async def _ask_leader(
        self, topic: str, partition: int, request: p.Request, timeout_s: float | None
    ) -> p.Response:
        """The leader's answer; its partition result's final error raised."""
        response = await self.cluster.call_leader(topic, partition, request, timeout_s=timeout_s)
        error, leader = partition_error(response)
        if error != ErrorCode.NONE:
            raise ClientError(error, f"{topic}-{partition}", leader)
        return response

    async def cluster_status(
        self, address: str | None = None, *, timeout_s: float | None = None
    ) -> p.ClusterStatusResponse:
        """The status of the broker at `address` (one attempt: it is that broker's), else of
        whichever broker answers."""
        request = p.ClusterStatus()
        response = await (
            self.cluster.send(address, request)
            if address
            else self.cluster.call_any(request, timeout_s=timeout_s)
        )
        assert isinstance(response, p.ClusterStatusResponse)
        return response

    async def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: int,
        *,
        timeout_s: float | None = None,
        read_committed: bool = False,
    ) -> int:
        """EARLIEST, LATEST (the high watermark; the last stable offset `read_committed`)
        or the first offset appended at a time."""
        request = p.ListOffsets((p.OffsetQuery(topic, partition, spec),), read_committed)
        response = await self._ask_leader(topic, partition, request, timeout_s)
        assert isinstance(response, p.ListOffsetsResponse)
        return response.results[0].offset
