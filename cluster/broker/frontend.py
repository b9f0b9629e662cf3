"""What a broker answers to each request: the edge between the wire and the replicas.

Every name and size is validated here, before anything is proposed: a malformed batch, an
invalid topic name or an unknown partition gets an error and never reaches a Raft log. Produce
is acks=all: the answer is the apply result of the committed entry (offsets, the original
offsets of a duplicate, or the rejection). Fetch serves only applied, hence committed, batches
from the partition leader, and long-polls up to `max_wait_ms` for new ones; its answer keeps to
one byte budget as Kafka's does (KIP-74), and a partition listed twice is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial

from cluster import native as p
from cluster.broker.group_requests import NativeGroups
from cluster.broker.groups import GroupService
from cluster.broker.metrics import Metrics
from cluster.broker.node import OFFSETS_TOPIC, Node, PartitionHandle, client_topics
from cluster.broker.peers import PeerWatcher
from cluster.broker.server import Respond
from cluster.broker.storage import StorageError
from cluster.clock import wall_ms
from cluster.config import Limits
from cluster.errors import RequestRefusedError
from cluster.raft import ProposalError
from statemachine.commands import (
    CreateTopic,
    DeleteTopic,
    InitTransactionalProducer,
    encode_append,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import StateLimits
from statemachine.metadata import TopicCreated, TopicDeleted, TopicInfo, topic_name_error
from statemachine.partition import Appended, Duplicate
from statemachine.records import (
    HEADER_BYTES,
    BatchFormatError,
    UnsupportedBatchError,
    verify_batch,
)
from statemachine.txn_registry import ProducerIdAndEpoch

EARLIEST, LATEST = -2, -1
Fence = tuple[str, int, int, int]  # (sink, writer, batch id, part) of a FencedProduce
Where = tuple[str, int]  # a topic and a partition
# What a Fetch answer holds besides its batches' bytes and the topic names it echoes, in msgpack:
# the frame and response headers; per partition its integers, array headers and a leader hint;
# per batch its offset, append time and headers (less than the HEADER_BYTES every batch has).
FETCH_ANSWER_OVERHEAD_BYTES = 64
FETCH_RESULT_OVERHEAD_BYTES = 64 + p.ADDRESS_CHARS_MAX
FETCHED_BATCH_OVERHEAD_BYTES = 24
assert FETCHED_BATCH_OVERHEAD_BYTES < HEADER_BYTES
UTF8_BYTES_PER_CHAR_MAX = 4


class RequestFrontend:
    """The RequestHandler of a node."""

    def __init__(
        self, node: Node, peers: PeerWatcher, metrics: Metrics, groups: GroupService
    ) -> None:
        self.node = node
        self.peers = peers
        self.metrics = metrics
        self.groups = NativeGroups(node, groups)

    @property
    def _timeout_s(self) -> float:
        return self.node.config.timing.request_timeout_ms / 1000

    async def handle(self, request: p.Request, source: str) -> p.Response:
        with self.metrics.timed(type(request).__name__):
            return await self._dispatch(request, source)

    def answer_bytes_reserved(self, request: p.Request) -> int:
        """What the server holds in reserve for `request`'s answer while it is under way: the
        bound of a Fetch answer; 0 for the others, whose answers are small (their frames count
        once they are known)."""
        if isinstance(request, p.Fetch):
            return fetch_answer_bytes_bound(request, self.node.config.limits, self.node.limits)
        return 0

    def answer_wait_s(self, request: p.Request) -> float:
        """How long `request` may wait by design (a JoinGroup or SyncGroup parked for its
        rebalance), beyond the answer timeout."""
        return self.groups.answer_wait_s(request)

    def _observe(self, op: str, error: str, started: float) -> None:
        self.metrics.request_done(op, error, time.perf_counter() - started)

    async def _dispatch(self, request: p.Request, source: str) -> p.Response:
        match request:
            case p.Fetch():
                return await self.fetch(request)
            case p.Metadata():
                return await self.metadata(request)
            case p.InitProducerId():
                return await self.init_producer_id(request)
            case p.ListOffsets():
                return await self.list_offsets(request)
            case p.DescribeProducers():
                return await self.describe_producers(request)
            case p.CreateTopic():
                return await self.create_topic(request)
            case p.DeleteTopic():
                return await self.delete_topic(request)
            case p.ClusterStatus():
                return self.cluster_status()
        answer = await self.groups.handle(request, source)
        if answer is not None:
            return answer
        raise RequestRefusedError(
            ErrorCode.INVALID_REQUEST, f"unsupported {type(request).__name__}"
        )

    # -- partitions: where they are ----------------------------------------------------------

    def _leader_hint(self, error: ErrorCode, topic: str, partition: int) -> str:
        """Where a partition refused with `error` is led, for the client's retry ("" when it
        does not exist: a stale hint would send the client to a node that lost it)."""
        if error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            return ""
        handle = self.node.partitions.get((topic, partition))
        peer = handle.leader_peer() if handle else None
        if peer is None:
            node_id = self.peers.leader_of(topic, partition)
            peer = self.node.peer(node_id) if node_id is not None else None
        return "" if peer is None else peer.client_address

    def _leading(self, topic: str, partition: int) -> PartitionHandle | ErrorCode:
        """The partition's handle if this node serves it as leader, else why not."""
        handle = self._hosting(topic, partition)
        if isinstance(handle, PartitionHandle) and not handle.group.serving:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return handle

    def _hosting(self, topic: str, partition: int) -> PartitionHandle | ErrorCode:
        """The partition's handle if this node holds a replica of it, else why not: the
        partition does not exist as far as this node's metadata knows (Kafka's
        UNKNOWN_TOPIC_OR_PARTITION: a client refreshes its metadata, which says whether the
        topic exists), or its replicas are on other nodes (NOT_LEADER_OR_FOLLOWER)."""
        handle = self.node.partitions.get((topic, partition))
        if handle is not None:
            return handle
        info = self.node.metadata_replica.machine.topics.get(topic)
        if info is None or partition >= info.partitions or topic == OFFSETS_TOPIC:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.NOT_LEADER_OR_FOLLOWER

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
        timeout_s = min(timeout_ms / 1000, self._timeout_s) or self._timeout_s
        results: dict[int, p.ProduceResult] = {}

        def finish(index: int, result: p.ProduceResult) -> None:
            results[index] = result
            if len(results) == len(entries):
                respond(p.ProduceResponse(tuple(results[i] for i in range(len(entries)))))
                self._observe(op, "NONE", started)  # after the answer left: not on its path

        if not entries:
            # Nothing to wait for: the answer is due now (Kafka answers an empty produce with
            # an empty response). Waiting for every entry's result would never answer it.
            respond(p.ProduceResponse(()))
            return True
        for index, (entry, fence) in enumerate(zip(entries, fences, strict=True)):
            where = (entry.topic, entry.partition)
            self._start_produce(where, entry.batch, timeout_s, fence, partial(finish, index))
        return True

    def start_produce(
        self,
        where: Where,
        batch: bytes | memoryview,
        timeout_s: float,
        finish: Callable[[p.ProduceResult], None],
    ) -> None:
        """One plain (unfenced) batch through the native produce path: the Kafka listener's
        Produce (cluster/kafka/frontend.py), whose batch is a view of its request."""
        self._start_produce(where, batch, timeout_s, None, finish)

    def _start_produce(
        self,
        where: Where,
        batch: bytes | memoryview,
        timeout_s: float,
        fence: Fence | None,
        finish: Callable[[p.ProduceResult], None],
    ) -> None:
        """Validate and propose one batch; `finish` gets its result once, now or on apply."""

        def applied(result: object, error: ProposalError | None) -> None:
            if error is not None:
                finish(self._failed(where, error.error))
            else:
                finish(self._produced(where, result))
                self._count(result)

        handle = self._leading(*where)
        if isinstance(handle, ErrorCode):
            finish(self._failed(where, handle))
            return
        try:
            verify_batch(batch, self.node.limits)
        except UnsupportedBatchError:
            finish(self._failed(where, ErrorCode.INVALID_RECORD))
            return
        except BatchFormatError:
            finish(self._failed(where, ErrorCode.CORRUPT_MESSAGE))
            return
        command = encode_append(wall_ms(), batch, fence)
        try:
            handle.group.submit(command, timeout_s, applied)
        except ProposalError as exc:
            finish(self._failed(where, exc.error))

    def _failed(self, where: Where, error: ErrorCode) -> p.ProduceResult:
        topic, partition = where
        hint = self._leader_hint(error, topic, partition)
        return p.ProduceResult(topic, partition, error, -1, -1, -1, False, hint)

    def _produced(self, where: Where, result: object) -> p.ProduceResult:
        match result:
            case Appended() | Duplicate():
                return p.ProduceResult(
                    *where,
                    ErrorCode.NONE,
                    result.base_offset,
                    result.last_offset,
                    result.append_time_ms,
                    isinstance(result, Duplicate),
                    "",
                )
            case Rejected(error=error):
                return self._failed(where, error)
        raise AssertionError(f"unexpected apply result {result!r}")

    def _count(self, result: object) -> None:
        m = self.metrics
        match result:
            case Appended(base_offset=base, last_offset=last):
                m.produced_records.inc(last - base + 1)
            case Duplicate():
                m.dedup_hits.inc()
            case Rejected(error=ErrorCode.INVALID_PRODUCER_EPOCH):
                m.fenced.inc()
            case Rejected(error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER):
                m.out_of_order.inc()

    # -- fetch -------------------------------------------------------------------------------

    async def fetch(self, request: p.Fetch) -> p.FetchResponse:
        _refuse_duplicates(request)
        deadline = self.fetch_deadline(request)
        results = self._fetch_all(request)
        if request.max_wait_ms > 0 and not any(r.batches or r.error for r in results):
            await self._wait_for_any(request.partitions, deadline)
            results = self._fetch_all(request)
        return p.FetchResponse(tuple(results))

    def fetch_deadline(self, request: p.Fetch) -> float:
        """When a long poll of `request` ends (time.monotonic()): its max_wait_ms, at most
        request_timeout_ms, so that it is answered well before answer_timeout_ms."""
        wait_ms = min(request.max_wait_ms, self.node.config.timing.request_timeout_ms)
        return time.monotonic() + wait_ms / 1000

    def _fetch_all(self, request: p.Fetch) -> list[p.FetchResult]:
        """Each partition's batches, within one byte budget for the whole response (KIP-74).

        Only the first partition with data gives at least one batch whatever the budgets, so
        that a consumer whose next batch exceeds them still progresses; every later one gives
        only whole batches within its own `max_bytes` and what is left of the budget.
        """
        budget = fetch_budget_bytes(request, self.node.config.limits)
        results = []
        first = True  # no partition has given a batch yet
        for fp in request.partitions:
            result = self._fetch_one(fp, min(fp.max_bytes, budget), request.replica_read, first)
            size = sum(len(b.batch) for b in result.batches)
            budget = max(0, budget - size)
            first = first and not result.batches
            results.append(result)
        return results

    async def wait_for_data(
        self, partitions: tuple[p.FetchPartition, ...], deadline: float
    ) -> bool:
        """Until a batch is appended to one of `partitions` this node leads, or `deadline`
        (time.monotonic()): the Kafka listener's Fetch waits for its min_bytes with it. False,
        at once, when there is nothing to wait for: no partition led here, or no time left."""
        return await self._wait_for_any(partitions, deadline)

    async def _wait_for_any(
        self, partitions: tuple[p.FetchPartition, ...], deadline: float
    ) -> bool:
        handles = [
            h
            for fp in partitions
            if isinstance(h := self._leading(fp.topic, fp.partition), PartitionHandle)
        ]
        remaining = deadline - time.monotonic()
        if not handles or remaining <= 0:
            return False
        waits = [asyncio.ensure_future(h.wait_for_data(remaining)) for h in handles]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return True

    def _fetch_one(
        self, fp: p.FetchPartition, max_bytes: int, replica_read: bool, at_least_one: bool
    ) -> p.FetchResult:
        handle = (
            self._hosting(fp.topic, fp.partition)
            if replica_read
            else self._leading(fp.topic, fp.partition)
        )
        if not isinstance(handle, PartitionHandle):
            hint = self._leader_hint(handle, fp.topic, fp.partition)
            return p.FetchResult(fp.topic, fp.partition, handle, -1, -1, hint, ())
        replica = handle.replica
        high, start = replica.high_watermark, replica.log_start_offset

        def answer(error: ErrorCode, batches: tuple[p.FetchedBatch, ...] = ()) -> p.FetchResult:
            return p.FetchResult(fp.topic, fp.partition, error, high, start, "", batches)

        if not start <= fp.offset <= high:
            return answer(ErrorCode.OFFSET_OUT_OF_RANGE)
        if fp.offset < replica.store.log_start_offset:
            # This replica is restoring records it missed; they exist on the others. Retriable.
            return answer(ErrorCode.LEADER_NOT_AVAILABLE)
        try:
            stored = (
                replica.store.read(fp.offset, max_bytes, at_least_one=at_least_one)
                if fp.offset < high
                else []
            )
        except StorageError:  # damage on disk: retriable, another replica can serve it
            return answer(ErrorCode.LEADER_NOT_AVAILABLE)
        self.metrics.fetched_bytes.inc(sum(len(b.batch) for b in stored))
        return answer(
            ErrorCode.NONE,
            tuple(
                p.FetchedBatch(b.base_offset, b.append_time_ms, b.batch)
                for b in stored
                if b.base_offset < high
            ),
        )

    # -- offsets and producers ---------------------------------------------------------------

    async def list_offsets(self, request: p.ListOffsets) -> p.ListOffsetsResponse:
        results = []
        for q in request.partitions:
            handle = self._leading(q.topic, q.partition)
            if isinstance(handle, ErrorCode):
                hint = self._leader_hint(handle, q.topic, q.partition)
                results.append(p.OffsetResult(q.topic, q.partition, handle, -1, hint))
                continue
            replica = handle.replica
            if q.spec == EARLIEST:
                offset = replica.log_start_offset
            elif q.spec == LATEST:
                offset = replica.high_watermark
            elif replica.restoring:  # batches below the local log may match: not known yet
                error = ErrorCode.LEADER_NOT_AVAILABLE
                results.append(p.OffsetResult(q.topic, q.partition, error, -1, ""))
                continue
            else:
                offset = replica.offset_for_time(q.spec)
            results.append(p.OffsetResult(q.topic, q.partition, ErrorCode.NONE, offset, ""))
        return p.ListOffsetsResponse(tuple(results))

    async def describe_producers(self, request: p.DescribeProducers) -> p.DescribeProducersResponse:
        results = []
        for partition in request.partitions:
            handle = self._leading(request.topic, partition)
            if isinstance(handle, ErrorCode):
                hint = self._leader_hint(handle, request.topic, partition)
                results.append(p.PartitionProducers(partition, handle, hint, ()))
                continue
            producers = await handle.group.read(partial(_describe, handle))
            results.append(p.PartitionProducers(partition, ErrorCode.NONE, "", producers))
        return p.DescribeProducersResponse(tuple(results))

    # -- metadata group ----------------------------------------------------------------------

    async def _propose_metadata(self, command: bytes) -> object:
        try:
            return await self.node.metadata.propose(command, self._timeout_s, forward=True)
        except ProposalError as exc:
            # Its code only: a proposal's leader hint is a Raft address, not one clients use.
            raise RequestRefusedError(exc.error) from exc

    async def create_topic(self, request: p.CreateTopic) -> p.CreateTopicResponse:
        problem = topic_name_error(request.name, self.node.limits) or _internal(request.name)
        if problem:
            raise RequestRefusedError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        command = CreateTopic(
            request.name,
            request.partitions,
            request.replication_factor,
            request.retention_ms,
            request.retention_bytes,
        )
        result = await self._propose_metadata(command.encode())
        if isinstance(result, Rejected):
            raise RequestRefusedError(result.error)
        assert isinstance(result, TopicCreated), result
        return p.CreateTopicResponse(result.topic.topic_id)

    async def delete_topic(self, request: p.DeleteTopic) -> p.DeleteTopicResponse:
        problem = _internal(request.name)
        if problem:
            raise RequestRefusedError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        result = await self._propose_metadata(DeleteTopic(request.name).encode())
        if isinstance(result, Rejected):
            raise RequestRefusedError(result.error)
        assert isinstance(result, TopicDeleted), result
        return p.DeleteTopicResponse()

    async def init_producer_id(self, request: p.InitProducerId) -> p.InitProducerIdResponse:
        if not request.transactional_id:
            producer_id = self.node.lease.take()
            self.node.pid_block_wanted.set()  # prefetch, or refill an empty lease
            if isinstance(producer_id, ErrorCode):
                raise RequestRefusedError(producer_id, "no producer-id block yet; retry")
            return p.InitProducerIdResponse(producer_id, 0)
        command = InitTransactionalProducer(
            request.transactional_id,
            request.transaction_timeout_ms,
            request.expected_producer_id,
            request.expected_epoch,
            wall_ms(),
        )
        result = await self._propose_metadata(command.encode())
        if isinstance(result, Rejected):
            raise RequestRefusedError(result.error)
        assert isinstance(result, ProducerIdAndEpoch), result
        return p.InitProducerIdResponse(result.producer_id, result.epoch)

    async def metadata(self, request: p.Metadata) -> p.MetadataResponse:
        machine = self.node.metadata_replica
        topics, brokers = await self.node.metadata.read(
            lambda: (client_topics(machine.machine.topics), dict(machine.machine.brokers))
        )
        names = request.topics or tuple(sorted(topics))
        leader = self.node.metadata_leader()
        return p.MetadataResponse(
            self.node.config.cluster_id,
            -1 if leader is None else leader.node_id,
            tuple(
                p.BrokerAddress(b.broker_id, b.client_address) for _, b in sorted(brokers.items())
            ),
            tuple(self._topic_metadata(name, topics.get(name)) for name in names),
        )

    def _topic_metadata(self, name: str, topic: TopicInfo | None) -> p.TopicMetadata:
        if topic is None:
            return p.TopicMetadata(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, ())
        partitions = []
        for partition in range(topic.partitions):
            leader_id, term = self._leader_and_term(topic, partition)
            partitions.append(
                p.PartitionMetadata(partition, leader_id, topic.replicas[partition], term)
            )
        return p.TopicMetadata(name, ErrorCode.NONE, topic.topic_id, tuple(partitions))

    def leader_and_term(self, topic: TopicInfo, partition: int) -> tuple[int, int]:
        """A partition's leader (node id, -1 when unknown) and its Raft term, as Metadata
        reports them (the Kafka listener's Metadata too)."""
        return self._leader_and_term(topic, partition)

    def _leader_and_term(self, topic: TopicInfo, partition: int) -> tuple[int, int]:
        handle = self.node.partitions.get((topic.name, partition))
        if handle is not None and handle.topic == topic:
            status = handle.group.status()
            peer = handle.leader_peer()
            if peer is not None:
                return peer.node_id, status.term
        leader = self.peers.leader_of(topic.name, partition)
        return (-1 if leader is None else leader), self.peers.term_of(topic.name, partition)

    def cluster_status(self) -> p.ClusterStatusResponse:
        nodes = tuple(
            p.NodeStatus(peer.node_id, peer.client_address, self.peers.reachable(peer.node_id))
            for peer in self.node.config.peers
        )
        offsets = self.node.partition_offsets()
        node_of = self.peers.node_of_raft_address
        groups = []
        for s in self.node.group_statuses():
            leader = node_of(s.leader_address)
            log_start, high_watermark = offsets.get(s.name, (-1, -1))
            groups.append(
                p.GroupStatus(
                    s.name,
                    -1 if leader is None else leader,
                    s.term,
                    s.commit_index,
                    s.last_applied,
                    s.is_leader,
                    s.healthy,
                    s.detail,
                    tuple(n for n in map(node_of, s.in_sync) if n is not None),
                    log_start,
                    high_watermark,
                )
            )
        return p.ClusterStatusResponse(self.node.config.node_id, nodes, tuple(groups))


def _describe(handle: PartitionHandle) -> tuple[p.ProducerDescription, ...]:
    """Between applies: the producer table as DescribeProducers shows it."""
    return tuple(
        p.ProducerDescription(
            pid,
            entry.epoch,
            entry.last_sequence,
            entry.last_timestamp_ms,
            tuple(p.WindowEntry(*m) for m in entry.window),
        )
        for pid, entry in handle.replica.machine.producers
    )


# -- fetch bounds --------------------------------------------------------------------------------


def fetch_budget_bytes(request: p.Fetch, limits: Limits) -> int:
    """The budget for a Fetch answer's batch bytes (KIP-74: the first partition with data
    exceeds it by one batch when that batch alone is larger)."""
    return min(request.max_bytes, limits.fetch_bytes_max)


def fetch_answer_bytes_bound(request: p.Fetch, limits: Limits, state: StateLimits) -> int:
    """The most bytes the answer to `request` can take: its batches (the budget, or the one
    batch of the first partition with data, however large) with their framing (less than their
    own bytes, so at most twice as much), and each partition's result."""
    batch_bytes = max(fetch_budget_bytes(request, limits), state.batch_bytes_max)
    results = sum(
        FETCH_RESULT_OVERHEAD_BYTES + UTF8_BYTES_PER_CHAR_MAX * len(fp.topic)
        for fp in request.partitions
    )
    return FETCH_ANSWER_OVERHEAD_BYTES + 2 * batch_bytes + results


def _refuse_duplicates(request: p.Fetch) -> None:
    """A partition listed twice would be read and answered twice: refused before any read."""
    seen: set[tuple[str, int]] = set()
    for fp in request.partitions:
        key = (fp.topic, fp.partition)
        if key in seen:
            raise RequestRefusedError(
                ErrorCode.INVALID_REQUEST,
                f"Fetch lists partition {fp.topic}-{fp.partition} more than once",
            )
        seen.add(key)


def _internal(name: str) -> str | None:
    """Why a client may not create or delete `name`, or None."""
    if name == OFFSETS_TOPIC:
        return f"{OFFSETS_TOPIC} is the consumer groups' internal topic"
    return None
