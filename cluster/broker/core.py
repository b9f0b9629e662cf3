"""The broker core: what a node does for a client request, in the broker's own terms.

Role: both listeners (cluster/native/, cluster/kafka/) translate their wire's requests into
calls on `Broker` and its answers back into their wire's responses; no rule about what a
request may do is written in a listener. Inputs and outputs are the small tuples below, never
a wire class. (Consumer groups have their core in cluster/broker/groups.py, `GroupService`.)

Every name and size is validated here, before anything is proposed: a malformed batch, an
invalid topic name or an unknown partition gets an error and never reaches a Raft log. Produce
is acks=all: the answer is the apply result of the committed entry (offsets, the original
offsets of a duplicate, or the rejection). Fetch serves only applied, hence committed, batches
from the partition leader, and long-polls up to its wait for new ones; its answer keeps to one
byte budget as Kafka's does (KIP-74), and a partition listed twice is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence

from cluster.broker.calls import (
    Fence,
    Fetched,
    FetchWant,
    NodeSeen,
    Produced,
    RaftGroupReport,
    Where,
)
from cluster.broker.configs import ConfigChange, altered
from cluster.broker.metrics import Metrics
from cluster.broker.node import (
    INTERNAL_TOPICS,
    OFFSETS_TOPIC,
    TXN_STATE_TOPIC,
    Node,
    PartitionHandle,
    client_topics,
)
from cluster.broker.partition_admin import PartitionAdmin
from cluster.broker.peers import PeerWatcher
from cluster.broker.storage import StorageError
from cluster.broker.txns import TxnService
from cluster.clock import wall_ms
from cluster.config import Limits
from cluster.errors import RequestRefusedError
from cluster.raft import ProposalError
from statemachine.commands import (
    UNCHANGED,
    AlterTopicConfigs,
    CreateTopic,
    DeleteTopic,
    encode_append,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.metadata import (
    BrokerInfo,
    TopicAltered,
    TopicCreated,
    TopicDeleted,
    TopicInfo,
    topic_name_error,
)
from statemachine.partition import Appended, Duplicate
from statemachine.records import (
    HEADER_BYTES,
    TRANSACTIONAL_BIT,
    BatchFormatError,
    UnsupportedBatchError,
    verify_batch,
)
from statemachine.txn_registry import ProducerIdAndEpoch

# What a Fetch answer holds besides its batches' bytes and the topic names it echoes, on
# either wire (the larger of the two): the frame and response headers; per partition its
# integers, array headers and a leader hint; per batch its offset, append time and headers
# (less than the HEADER_BYTES every batch has).
FETCH_ANSWER_OVERHEAD_BYTES = 64
FETCH_RESULT_OVERHEAD_BYTES = 64 + DEFAULT_LIMITS.address_length_max
FETCHED_BATCH_OVERHEAD_BYTES = 24
assert FETCHED_BATCH_OVERHEAD_BYTES < HEADER_BYTES
UTF8_BYTES_PER_CHAR_MAX = 4


class Broker(PartitionAdmin):
    """The core both listeners of a node call."""

    def __init__(self, node: Node, peers: PeerWatcher, metrics: Metrics) -> None:
        self.node = node
        self.peers = peers
        self.metrics = metrics
        self.txns = TxnService(node, peers)  # the transaction coordinator's requests

    @property
    def request_timeout_s(self) -> float:
        return self.node.config.timing.request_timeout_ms / 1000

    def timeout_s(self, asked_ms: int) -> float:
        """A request's own timeout, at most request_timeout_ms (which a 0 or less means)."""
        return min(max(asked_ms, 0) / 1000, self.request_timeout_s) or self.request_timeout_s

    # -- partitions: where they are ----------------------------------------------------------

    def leader_hint(self, error: ErrorCode, topic: str, partition: int) -> str:
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
        if info is None or not 0 <= partition < info.partitions or topic in INTERNAL_TOPICS:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.NOT_LEADER_OR_FOLLOWER

    def leader_and_term(self, topic: TopicInfo, partition: int) -> tuple[int, int]:
        """A partition's leader (node id, -1 when unknown) and its Raft term (Kafka's leader
        epoch)."""
        handle = self.node.partitions.get((topic.name, partition))
        if handle is not None and handle.topic.topic_id == topic.topic_id:
            status = handle.group.status()
            peer = handle.leader_peer()
            if peer is not None:
                return peer.node_id, status.term
        leader = self.peers.leader_of(topic.name, partition)
        return (-1 if leader is None else leader), self.peers.term_of(topic.name, partition)

    def in_sync(self, topic: TopicInfo, partition: int, leader_id: int) -> tuple[int, ...]:
        """A partition's replicas in sync by node id (Kafka's ISR): the leader's view when it
        is here, else what the leader last reported."""
        handle = self.node.partitions.get((topic.name, partition))
        if (
            handle is not None
            and handle.topic.topic_id == topic.topic_id
            and handle.group.is_leader
        ):
            node_of = self.peers.node_of_raft_address
            return tuple(n for n in map(node_of, handle.group.status().in_sync) if n is not None)
        reported = self.peers.in_sync_of(topic.name, partition)
        return reported or ((leader_id,) if leader_id >= 0 else ())

    def reachable(self, node_id: int) -> bool:
        """Whether the node answered this one's polls lately (itself: always)."""
        return self.peers.reachable(node_id)

    def log_start_offset(self, topic: str, partition: int) -> int:
        handle = self.node.partitions.get((topic, partition))
        return -1 if handle is None else handle.replica.log_start_offset

    # -- produce -----------------------------------------------------------------------------

    def produce(
        self,
        where: Where,
        batch: bytes | memoryview,
        timeout_s: float,
        fence: Fence | None,
        finish: Callable[[Produced], None],
    ) -> None:
        """Validate and propose one batch; `finish` gets its outcome once, now or on apply
        (in the Raft tick that applies it: no task between the commit and the answer)."""

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
            header = verify_batch(batch, self.node.limits)
        except UnsupportedBatchError:
            finish(self._failed(where, ErrorCode.INVALID_RECORD))
            return
        except BatchFormatError:
            finish(self._failed(where, ErrorCode.CORRUPT_MESSAGE))
            return
        machine = handle.replica.machine
        if machine.txns.producers or header.attributes & TRANSACTIONAL_BIT:
            # Data outside a transaction the coordinator registered here: refused before the
            # log, by apply's own rule (applied state is the leader's whole log: term start).
            refusal = machine.txn_refusal(header)
            if refusal != ErrorCode.NONE:
                finish(self._failed(where, refusal))
                return
        command = encode_append(wall_ms(), batch, fence)
        try:
            handle.group.submit(command, timeout_s, applied)
        except ProposalError as exc:
            finish(self._failed(where, exc.error))

    def _failed(self, where: Where, error: ErrorCode) -> Produced:
        topic, partition = where
        hint = self.leader_hint(error, topic, partition)
        return Produced(topic, partition, error, -1, -1, -1, False, hint)

    def _produced(self, where: Where, result: object) -> Produced:
        match result:
            case Appended() | Duplicate():
                return Produced(
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

    async def fetch(
        self, wants: Sequence[FetchWant], max_bytes: int, max_wait_ms: int, *, replica_read: bool
    ) -> list[Fetched]:
        """Each partition's committed batches, at once when any has data or an error, else
        when one gets data or after `max_wait_ms` (a long poll)."""
        refuse_duplicates(wants)
        deadline = self.fetch_deadline(max_wait_ms)
        results = self.read(wants, max_bytes, replica_read=replica_read)
        if max_wait_ms > 0 and not any(r.batches or r.error for r in results):
            await self.wait_for_data(wants, deadline)
            results = self.read(wants, max_bytes, replica_read=replica_read)
        return results

    def fetch_deadline(self, max_wait_ms: int) -> float:
        """When a long poll ends (time.monotonic()): its wait, at most request_timeout_ms, so
        that it is answered well before answer_timeout_ms."""
        wait_ms = min(max_wait_ms, self.node.config.timing.request_timeout_ms)
        return time.monotonic() + wait_ms / 1000

    def read(
        self, wants: Iterable[FetchWant], max_bytes: int, *, replica_read: bool = False
    ) -> list[Fetched]:
        """Each partition's batches now, within one byte budget for the whole answer (KIP-74).

        Only the first partition with data gives at least one batch whatever the budgets, so
        that a consumer whose next batch exceeds them still progresses; every later one gives
        only whole batches within its own `max_bytes` and what is left of the budget.
        """
        budget = fetch_budget_bytes(max_bytes, self.node.config.limits)
        results = []
        first = True  # no partition has given a batch yet
        for want in wants:
            result = self._read_one(want, min(want.max_bytes, budget), replica_read, first)
            size = sum(len(b.batch) for b in result.batches)
            budget = max(0, budget - size)
            first = first and not result.batches
            results.append(result)
        return results

    async def wait_for_data(self, wants: Iterable[FetchWant], deadline: float) -> bool:
        """Until a batch is appended to one of the partitions this node leads, or `deadline`
        (time.monotonic()). False, at once, when there is nothing to wait for: no partition
        led here, or no time left."""
        handles = [
            h
            for w in wants
            if isinstance(h := self._leading(w.topic, w.partition), PartitionHandle)
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

    def _read_one(
        self, want: FetchWant, max_bytes: int, replica_read: bool, at_least_one: bool
    ) -> Fetched:
        topic, partition, offset = want.topic, want.partition, want.offset
        found = self._hosting(topic, partition) if replica_read else self._leading(topic, partition)
        handle = self._serving(found, topic, partition, want.current_leader_epoch)
        if not isinstance(handle, PartitionHandle):
            return Fetched(topic, partition, handle[0], -1, -1, handle[1], ())
        replica = handle.replica
        high, start = replica.high_watermark, replica.log_start_offset
        stable = replica.last_stable_offset
        read_committed = want.read_committed
        if self.node.config.unsafe_ignore_isolation:  # the chaos suite's negative control
            stable, read_committed = high, False

        def answer(error: ErrorCode) -> Fetched:
            return Fetched(topic, partition, error, high, start, "", (), stable)

        if not start <= offset <= high:
            return answer(ErrorCode.OFFSET_OUT_OF_RANGE)
        if offset < replica.store.log_start_offset:
            # This replica is restoring records it missed; they exist on the others. Retriable.
            return answer(ErrorCode.LEADER_NOT_AVAILABLE)
        try:
            batches, aborted = replica.read(
                offset, max_bytes, at_least_one=at_least_one, read_committed=read_committed
            )
        except StorageError:  # damage on disk: retriable, another replica can serve it
            return answer(ErrorCode.LEADER_NOT_AVAILABLE)
        self.metrics.fetched_bytes.inc(sum(len(b.batch) for b in batches))
        return Fetched(topic, partition, ErrorCode.NONE, high, start, "", batches, stable, aborted)

    # -- the metadata group ------------------------------------------------------------------

    async def _propose_metadata(self, command: bytes) -> object:
        try:
            return await self.node.metadata.propose(command, self.request_timeout_s, forward=True)
        except ProposalError as exc:
            # Its code only: a proposal's leader hint is a Raft address, not one clients use.
            raise RequestRefusedError(exc.error) from exc

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        retention_ms: int,
        retention_bytes: int,
    ) -> int:
        """The new topic's id, once its creation is committed."""
        problem = topic_name_error(name, self.node.limits) or _internal(name)
        if problem:
            raise RequestRefusedError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        command = CreateTopic(name, partitions, replication_factor, retention_ms, retention_bytes)
        result = await self._propose_metadata(command.encode())
        if isinstance(result, Rejected):
            raise RequestRefusedError(result.error)
        assert isinstance(result, TopicCreated), result
        return result.topic.topic_id

    async def delete_topic(self, name: str) -> None:
        problem = _internal(name)
        if problem:
            raise RequestRefusedError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        result = await self._propose_metadata(DeleteTopic(name).encode())
        if isinstance(result, Rejected):
            raise RequestRefusedError(result.error)
        assert isinstance(result, TopicDeleted), result

    async def alter_topic_configs(
        self, name: str, changes: Sequence[ConfigChange], *, validate_only: bool = False
    ) -> None:
        """Make `changes` to a topic's configs (cluster/broker/configs.py: `altered` says which
        may change), once committed; with `validate_only`, only check them."""
        problem = _internal(name)
        topic = self.node.metadata_replica.machine.topics.get(name)
        if problem or topic is None:
            raise RequestRefusedError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, problem or "")
        new = altered(topic, changes, self.node.limits.batch_bytes_max)
        if isinstance(new, tuple):
            raise RequestRefusedError(*new)
        if validate_only or new == topic:
            return
        asked = {c.name for c in changes}
        command = AlterTopicConfigs(
            name,
            topic.topic_id,
            new.retention_ms if "retention.ms" in asked else UNCHANGED,
            new.retention_bytes if "retention.bytes" in asked else UNCHANGED,
        )
        result = await self._propose_metadata(command.encode())
        if isinstance(result, Rejected):
            raise RequestRefusedError(result.error)
        assert isinstance(result, TopicAltered), result

    async def init_producer_id(
        self,
        transactional_id: str = "",
        transaction_timeout_ms: int = 0,
        expected_producer_id: int = -1,
        expected_epoch: int = -1,
    ) -> ProducerIdAndEpoch:
        """A new id (epoch 0) for an idempotent producer (no `transactional_id`), from this
        node's lease; for a transactional one, its id and next epoch (fencing the last), from
        its transaction coordinator (cluster/broker/txns.py)."""
        if not transactional_id:
            producer_id = self.node.lease.take()
            self.node.pid_block_wanted.set()  # prefetch, or refill an empty lease
            if isinstance(producer_id, ErrorCode):
                raise RequestRefusedError(producer_id, "no producer-id block yet; retry")
            return ProducerIdAndEpoch(producer_id, 0)
        result = await self.txns.init_producer(
            transactional_id, transaction_timeout_ms, expected_producer_id, expected_epoch
        )
        if isinstance(result, ErrorCode):
            raise RequestRefusedError(result)
        return result

    async def topics_and_brokers(self) -> tuple[dict[str, TopicInfo], dict[int, BrokerInfo]]:
        """The topics clients see and the registered brokers, read between two applies of the
        metadata replica."""
        replica = self.node.metadata_replica
        return await self.node.metadata.read(
            lambda: (client_topics(replica.machine.topics), dict(replica.machine.brokers))
        )

    def controller_id(self) -> int:
        """The metadata group's leader (Kafka's controller), -1 when unknown."""
        leader = self.node.metadata_leader()
        return -1 if leader is None else leader.node_id

    # -- the node's own view -----------------------------------------------------------------

    def nodes_seen(self) -> list[NodeSeen]:
        return [
            NodeSeen(peer.node_id, peer.client_address, self.reachable(peer.node_id))
            for peer in self.node.config.peers
        ]

    def raft_groups(self) -> list[RaftGroupReport]:
        """Every Raft group of this node as ClusterStatus reports it."""
        offsets = self.node.partition_offsets()
        node_of = self.peers.node_of_raft_address
        reports = []
        for s in self.node.group_statuses():
            leader = node_of(s.leader_address)
            log_start, high_watermark = offsets.get(s.name, (-1, -1))
            reports.append(
                RaftGroupReport(
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
        return reports


# -- fetch bounds --------------------------------------------------------------------------------


def fetch_budget_bytes(max_bytes: int, limits: Limits) -> int:
    """The budget for a Fetch answer's batch bytes (KIP-74: the first partition with data
    exceeds it by one batch when that batch alone is larger)."""
    return min(max_bytes, limits.fetch_bytes_max)


def fetch_answer_bytes_bound(
    topics: Iterable[str], max_bytes: int, limits: Limits, state: StateLimits
) -> int:
    """The most bytes the answer to a Fetch of partitions of `topics` (one name per
    partition) can take: its batches (the budget, or the one batch of the first partition with
    data, however large) with their framing (less than their own bytes, so at most twice as
    much), and each partition's result."""
    batch_bytes = max(fetch_budget_bytes(max_bytes, limits), state.batch_bytes_max)
    results = sum(FETCH_RESULT_OVERHEAD_BYTES + UTF8_BYTES_PER_CHAR_MAX * len(t) for t in topics)
    return FETCH_ANSWER_OVERHEAD_BYTES + 2 * batch_bytes + results


def refuse_duplicates(wants: Iterable[FetchWant]) -> None:
    """A partition listed twice would be read and answered twice: refused before any read."""
    seen: set[tuple[str, int]] = set()
    for want in wants:
        key = (want.topic, want.partition)
        if key in seen:
            raise RequestRefusedError(
                ErrorCode.INVALID_REQUEST,
                f"Fetch lists partition {want.topic}-{want.partition} more than once",
            )
        seen.add(key)


def _internal(name: str) -> str | None:
    """Why a client may not create or delete `name`, or None."""
    if name == OFFSETS_TOPIC:
        return f"{OFFSETS_TOPIC} is the consumer groups' internal topic"
    if name == TXN_STATE_TOPIC:
        return f"{TXN_STATE_TOPIC} is the transaction coordinator's internal topic"
    return None
