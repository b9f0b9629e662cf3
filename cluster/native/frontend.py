"""What a node answers the native protocol's clients: each request translated onto the core.

Role: the handler of the native listener (the `Server` with `NativeWire`). Every rule lives in
the broker core (cluster/broker/core.py, `Broker`; consumer groups in
cluster/broker/groups.py): this module turns a request into the core's call and the core's
answer into the response, field for field. Produce and FencedProduce are answered from the
apply callbacks of their entries (`answer_now`), with no task between the commit and the
socket.
"""

from __future__ import annotations

import time
from functools import partial

from cluster import native as p
from cluster.broker.calls import Fence, Fetched, FetchWant, OffsetWant, Produced
from cluster.broker.core import Broker, fetch_answer_bytes_bound
from cluster.broker.groups import GroupService
from cluster.errors import RequestRefusedError
from cluster.native.groups import NativeGroups
from cluster.native.txns import NativeTxns
from cluster.native.wire import Respond
from statemachine.errors import ErrorCode
from statemachine.metadata import TopicInfo
from statemachine.partition_txns import aborted_by


class NativeFrontend:
    """The RequestHandler of a node's native listener."""

    def __init__(self, broker: Broker, groups: GroupService) -> None:
        self.broker = broker
        self.metrics = broker.metrics
        self.groups = NativeGroups(broker.node, groups)
        self.txns = NativeTxns(broker.node, broker.txns)

    async def handle(self, request: p.Request, source: str) -> p.Response:
        with self.metrics.timed(type(request).__name__):
            return await self._dispatch(request, source)

    def answer_bytes_reserved(self, request: p.Request) -> int:
        """What the server holds in reserve for `request`'s answer while it is under way: the
        bound of a Fetch answer; 0 for the others, whose answers are small (their frames count
        once they are known)."""
        if not isinstance(request, p.Fetch):
            return 0
        node = self.broker.node
        topics = (fp.topic for fp in request.partitions)
        return fetch_answer_bytes_bound(topics, request.max_bytes, node.config.limits, node.limits)

    def answer_wait_s(self, request: p.Request) -> float:
        """How long `request` may wait by design (a JoinGroup or SyncGroup parked for its
        rebalance), beyond the answer timeout."""
        return self.groups.answer_wait_s(request)

    async def _dispatch(self, request: p.Request, source: str) -> p.Response:
        broker = self.broker
        match request:
            case p.Fetch():
                return await self.fetch(request)
            case p.Metadata():
                return await self.metadata(request)
            case p.InitProducerId():
                pid, epoch = await broker.init_producer_id(
                    request.transactional_id,
                    request.transaction_timeout_ms,
                    request.expected_producer_id,
                    request.expected_epoch,
                )
                return p.InitProducerIdResponse(pid, epoch)
            case p.ListOffsets():
                found = broker.list_offsets(
                    OffsetWant(q.topic, q.partition, q.spec, -1, request.read_committed)
                    for q in request.partitions
                )
                return p.ListOffsetsResponse(
                    tuple(
                        p.OffsetResult(f.topic, f.partition, f.error, f.offset, f.leader)
                        for f in found
                    )
                )
            case p.DescribeProducers():
                return await self.describe_producers(request)
            case p.CreateTopic():
                topic_id = await broker.create_topic(
                    request.name,
                    request.partitions,
                    request.replication_factor,
                    request.retention_ms,
                    request.retention_bytes,
                )
                return p.CreateTopicResponse(topic_id)
            case p.DeleteTopic():
                await broker.delete_topic(request.name)
                return p.DeleteTopicResponse()
            case p.ClusterStatus():
                return self.cluster_status()
        answer = await self.txns.handle(request, source)
        if answer is None:
            answer = await self.groups.handle(request, source)
        if answer is not None:
            return answer
        raise RequestRefusedError(
            ErrorCode.INVALID_REQUEST, f"unsupported {type(request).__name__}"
        )

    # -- produce -----------------------------------------------------------------------------

    def answer_now(self, request: p.Request, respond: Respond) -> bool:
        """Produce and FencedProduce: answered from the apply callback of their entries (the
        server writes the answer at once); every other request is `handle`'s."""
        match request:
            case p.Produce(timeout_ms=timeout_ms, entries=entries):
                fences: tuple[Fence | None, ...] = (None,) * len(entries)
            case p.FencedProduce(timeout_ms=timeout_ms, entry=entry):
                entries = (entry,)
                fences = ((request.sink, request.writer, request.batch_id, request.part),)
            case _:
                return False
        op, started = type(request).__name__, time.perf_counter()
        timeout_s = self.broker.timeout_s(timeout_ms)
        results: dict[int, p.ProduceResult] = {}

        def finish(index: int, produced: Produced) -> None:
            results[index] = p.ProduceResult(*produced)
            if len(results) == len(entries):
                respond(p.ProduceResponse(tuple(results[i] for i in range(len(entries)))))
                # After the answer left: not on its path.
                self.metrics.request_done(op, "NONE", time.perf_counter() - started)

        if not entries:
            # Nothing to wait for: the answer is due now (Kafka answers an empty produce with
            # an empty response). Waiting for every entry's result would never answer it.
            respond(p.ProduceResponse(()))
            return True
        for index, (entry, fence) in enumerate(zip(entries, fences, strict=True)):
            where = (entry.topic, entry.partition)
            self.broker.produce(where, entry.batch, timeout_s, fence, partial(finish, index))
        return True

    # -- fetch, producers, metadata, status ----------------------------------------------------

    async def fetch(self, request: p.Fetch) -> p.FetchResponse:
        read_committed = request.read_committed
        fetched = await self.broker.fetch(
            [
                FetchWant(fp.topic, fp.partition, fp.offset, fp.max_bytes, -1, read_committed)
                for fp in request.partitions
            ],
            request.max_bytes,
            request.max_wait_ms,
            replica_read=request.replica_read,
        )
        return p.FetchResponse(
            tuple(
                _fetch_result(f, fp.offset, read_committed)
                for f, fp in zip(fetched, request.partitions, strict=True)
            )
        )

    async def describe_producers(self, request: p.DescribeProducers) -> p.DescribeProducersResponse:
        described = await self.broker.describe_producers(request.topic, request.partitions)
        return p.DescribeProducersResponse(
            tuple(
                p.PartitionProducers(
                    d.partition,
                    d.error,
                    d.leader,
                    tuple(
                        p.ProducerDescription(
                            *v[:4],
                            tuple(p.WindowEntry(*batch) for batch in v.window),
                            v.coordinator_epoch,
                            v.txn_start_offset,
                        )
                        for v in d.producers
                    ),
                )
                for d in described
            )
        )

    async def metadata(self, request: p.Metadata) -> p.MetadataResponse:
        broker = self.broker
        topics, brokers = await broker.topics_and_brokers()
        names = request.topics or tuple(sorted(topics))
        described = []
        for name in names:
            topic = topics.get(name)
            if topic is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                described.append(p.TopicMetadata(name, error, -1, ()))
                continue
            partitions = tuple(
                p.PartitionMetadata(n, *_leader_with(broker, topic, n))
                for n in range(topic.partitions)
            )
            described.append(p.TopicMetadata(name, ErrorCode.NONE, topic.topic_id, partitions))
        return p.MetadataResponse(
            broker.node.config.cluster_id,
            broker.controller_id(),
            tuple(
                p.BrokerAddress(b.broker_id, b.client_address) for _, b in sorted(brokers.items())
            ),
            tuple(described),
        )

    def cluster_status(self) -> p.ClusterStatusResponse:
        broker = self.broker
        return p.ClusterStatusResponse(
            broker.node.config.node_id,
            tuple(p.NodeStatus(*seen) for seen in broker.nodes_seen()),
            tuple(p.RaftGroupReport(*report) for report in broker.raft_groups()),
        )


def _fetch_result(f: Fetched, offset: int, read_committed: bool) -> p.FetchResult:
    """A partition's answer; a read_committed reader's without markers and aborted data,
    which this listener drops for its clients (Kafka's clients drop them themselves)."""
    if f.error != ErrorCode.NONE:
        return p.FetchResult(*f[:6], (), -1, -1)
    stored = f.batches
    next_offset = stored[-1].next_offset if stored else offset
    if read_committed:
        stored = tuple(b for b in stored if not aborted_by(b.batch, b.base_offset, f.aborted))
    batches = tuple(p.FetchedBatch(b.base_offset, b.append_time_ms, b.batch) for b in stored)
    return p.FetchResult(*f[:6], batches, f.last_stable_offset, next_offset)


def _leader_with(
    broker: Broker, topic: TopicInfo, partition: int
) -> tuple[int, tuple[int, ...], int]:
    """A partition's leader id, replicas and term, in PartitionMetadata's order."""
    leader_id, term = broker.leader_and_term(topic, partition)
    return leader_id, topic.replicas[partition], term
