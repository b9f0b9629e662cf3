"""What a node answers Kafka's clients: each Kafka API translated onto the broker core.

Role: the handler of the Kafka listener (the `Server` with `KafkaWire`). Every rule lives in
the broker core (cluster/broker/core.py, `Broker`; consumer groups in
cluster/broker/groups.py), which the native listener calls too, so both protocols share one set
of rules: names are validated and proposals made by the core, its answers translated here into
each Kafka API's terms.

Rules:
- Brokers are the registered nodes, each at its Kafka address (`host` and `kafka_port` of the
  node's entry in this node's `[[peers]]`); a partition's leader is its Raft leader and its
  leader epoch the Raft term; ISR is what the leader reports in sync.
- Topics are never created by Metadata (`allow_auto_topic_creation` is ignored): an unknown
  topic is UNKNOWN_TOPIC_OR_PARTITION. A topic's Kafka id (a UUID) is derived from the
  cluster id and its topic id, the same on every node.
- Produce goes through the core's produce path (`Broker.produce`) and is answered from the
  apply callbacks, acks=1 and acks=-1 alike after the Raft commit; Fetch is the core's Fetch,
  its stored batches handed over as they are, waiting for `min_bytes` up to `max_wait`.
  Records are never decoded here.
- Whole-request failures become each API's own error response (wire.py: `refusal`); here,
  errors are answered per topic and partition as Kafka does.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from functools import partial

from cluster.addresses import parse_address
from cluster.broker.calls import (
    EARLIEST,
    EpochWant,
    Fetched,
    FetchWant,
    OffsetFound,
    OffsetWant,
    PartitionProducers,
    Produced,
)
from cluster.broker.core import Broker, fetch_answer_bytes_bound
from cluster.broker.groups import GroupService
from cluster.errors import RequestRefusedError
from cluster.kafka import codec
from cluster.kafka import messages as m
from cluster.kafka.dispatch import Call, check_every_request_served, handlers_of, serves
from cluster.kafka.groups import KafkaGroups
from cluster.kafka.producer_ids import KafkaProducerIds
from cluster.kafka.topics import KafkaTopics, by_uuid, topic_uuid
from statemachine.errors import ErrorCode
from statemachine.metadata import BrokerInfo, TopicInfo

log = logging.getLogger(__name__)
TOPIC_IDS_SINCE_VERSION = 12  # Metadata: a topic asked for by its id, a null name answered
NODE_ENDPOINTS_SINCE_VERSION = 10  # Produce: where leaders named in current_leader are (KIP-951)
# ListOffsets specs below EARLIEST but the max timestamp (-3, KIP-734, from v7) are the
# tiered-storage ones: answered UNSUPPORTED_VERSION, as no version we serve defines them.
SPECS_FROM = EARLIEST
MAX_TIMESTAMP = -3
MAX_TIMESTAMP_SINCE_VERSION = 7
NO_TIME = -1
READ_COMMITTED = 1  # isolation_level of Fetch (v4+) and ListOffsets (v2+)
ACKS = (0, 1, -1)  # none, the leader, all in sync: 1 and -1 both answer after the Raft commit


class KafkaFrontend:
    """The RequestHandler of a node's Kafka listener."""

    def __init__(
        self,
        broker: Broker,
        groups: GroupService,
        *,
        versions: codec.Versions = codec.SUPPORTED,
        external: bool = False,
    ) -> None:
        node = broker.node
        self.broker = broker
        self.node = node
        self.groups = groups
        self.group_apis = KafkaGroups(groups)
        self.topic_apis = KafkaTopics(broker)
        self.producer_ids = KafkaProducerIds(broker)
        # Each request's handler, declared on it (`@serves`); Produce is answered at once.
        handling = (self, self.group_apis, self.topic_apis, self.producer_ids)
        self._handlers = handlers_of(*handling)
        check_every_request_served(self._handlers, elsewhere=(m.ProduceRequest,))
        self.metrics = broker.metrics
        self.versions = versions
        config = node.config
        self._cluster_id = config.cluster_id
        # Where this listener's clients reach each node: its Kafka address, or on the
        # external listener the address advertised for clients outside (Kafka's listeners).
        advertised = {
            peer.node_id: peer.kafka_external_address if external else peer.kafka_address
            for peer in config.peers
        }
        self._addresses = {
            node_id: parse_address(address)
            for node_id, address in advertised.items()
            if address is not None
        }

    # -- the Server's handler ----------------------------------------------------------------

    def answer_now(
        self, request: m.KafkaRequest, respond: Callable[[m.ResponseBody | Exception], None]
    ) -> bool:
        """Produce: answered from the apply callbacks of its entries (as the native listener's
        is), with no task between the commit and the socket; everything else is `handle`'s."""
        body = request.body
        if not isinstance(body, m.ProduceRequest):
            return False
        self.produce(body, request.api_version, respond)
        return True

    def answer_bytes_reserved(self, request: m.KafkaRequest) -> int:
        """A Fetch answer's bound, held while it is under way (as on the native listener)."""
        body = request.body
        if not isinstance(body, m.FetchRequest):
            return 0
        topics = (want.topic for want in _wants(body))
        node = self.node
        return fetch_answer_bytes_bound(
            topics, max(body.max_bytes, 0), node.config.limits, node.limits
        )

    def answer_wait_s(self, request: m.KafkaRequest) -> float:
        """A JoinGroup or SyncGroup waits for its rebalance by design."""
        return self.group_apis.answer_wait_s(request.body)

    async def handle(self, request: m.KafkaRequest, source: str) -> m.ResponseBody:
        body, header = request.body, request.header
        call = Call(header.api_version, header.client_id, source)
        with self.metrics.timed(f"kafka.{m.Api(request.api_key).name}"):
            return await self._handlers[type(body)](body, call)

    @serves(m.ApiVersionsRequest)
    async def api_versions(self, _body: m.ApiVersionsRequest, _call: Call) -> m.ResponseBody:
        return codec.api_versions_response(ErrorCode.NONE, self.versions)

    # -- the cluster: brokers, topics, partitions --------------------------------------------

    def _brokers(self, registered: Mapping[int, BrokerInfo]) -> list[tuple[int, str, int]]:
        """(node id, host, port) of each registered node with a Kafka address."""
        return [
            (node_id, *self._addresses[node_id])
            for node_id in sorted(registered)
            if node_id in self._addresses
        ]

    def _partition(self, topic: TopicInfo, partition: int) -> m.MetadataResponsePartition:
        leader_id, term = self.broker.leader_and_term(topic, partition)
        replicas = topic.replicas[partition]
        return m.MetadataResponsePartition(
            ErrorCode.NONE if leader_id >= 0 else ErrorCode.LEADER_NOT_AVAILABLE,
            partition,
            leader_id,
            term,
            replicas,
            self.broker.in_sync(topic, partition, leader_id),
            tuple(n for n in replicas if not self.broker.reachable(n)),
        )

    def _topic(self, topic: TopicInfo) -> m.MetadataResponseTopic:
        return m.MetadataResponseTopic(
            ErrorCode.NONE,
            topic.name,
            topic_uuid(self._cluster_id, topic.topic_id),
            partitions=tuple(self._partition(topic, n) for n in range(topic.partitions)),
        )

    # -- Metadata and DescribeCluster --------------------------------------------------------

    @serves(m.MetadataRequest)
    async def metadata(self, request: m.MetadataRequest, call: Call) -> m.MetadataResponse:
        asked, version = request.topics, call.version
        if version < TOPIC_IDS_SINCE_VERSION and any(
            t.name is None or t.topic_id is not None for t in asked or ()
        ):
            # As Kafka's KafkaApis: v10 and v11 carry a topic id field but name topics only
            # (the answer's names are not nullable there), so the request is invalid whole.
            raise RequestRefusedError(
                ErrorCode.INVALID_REQUEST,
                f"Metadata v{version} names topics by name only: topic ids need v12 or later",
            )
        topics, registered = await self.broker.topics_and_brokers()
        if asked is None or (version == 0 and not asked):
            answers = [self._topic(topics[name]) for name in sorted(topics)]
        else:
            ids = by_uuid(self._cluster_id, topics) if any(t.name is None for t in asked) else {}
            answers = [self._asked_topic(t, topics, ids) for t in asked]
            if request.allow_auto_topic_creation:
                answers = await self._created_on_first_use(answers, topics, registered)
        return m.MetadataResponse(
            tuple(m.MetadataResponseBroker(*b) for b in self._brokers(registered)),
            tuple(answers),
            self._cluster_id,
            self.broker.controller_id(),
        )

    async def _created_on_first_use(
        self,
        answers: list[m.MetadataResponseTopic],
        topics: Mapping[str, TopicInfo],
        registered: Mapping[int, BrokerInfo],
    ) -> list[m.MetadataResponseTopic]:
        """`answers` with each topic asked by name that does not exist created, where this
        node creates topics on first use (cluster/kafka/topics.py)."""
        unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        missing = [a.name for a in answers if a.error_code == unknown and a.name is not None]
        if not missing:
            return answers
        made = iter(await self.topic_apis.auto_create(missing, topics, registered))
        return [
            next(made) if a.error_code == unknown and a.name is not None else a for a in answers
        ]

    def _asked_topic(
        self,
        asked: m.MetadataRequestTopic,
        topics: Mapping[str, TopicInfo],
        by_uuid: Mapping[uuid.UUID, TopicInfo],
    ) -> m.MetadataResponseTopic:
        if asked.name is not None:
            topic = topics.get(asked.name)
            if topic is None:
                return m.MetadataResponseTopic(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, asked.name)
            return self._topic(topic)
        by_id = by_uuid.get(asked.topic_id) if asked.topic_id is not None else None
        if by_id is None:
            return m.MetadataResponseTopic(ErrorCode.UNKNOWN_TOPIC_ID, None, asked.topic_id)
        return self._topic(by_id)

    @serves(m.DescribeClusterRequest)
    async def describe_cluster(
        self, _request: m.DescribeClusterRequest, _call: Call
    ) -> m.DescribeClusterResponse:
        _topics, registered = await self.broker.topics_and_brokers()
        return m.DescribeClusterResponse(
            ErrorCode.NONE,
            self._cluster_id,
            tuple(m.DescribeClusterBroker(*b) for b in self._brokers(registered)),
            self.broker.controller_id(),
        )

    # -- ListOffsets, OffsetForLeaderEpoch, DescribeProducers -----------------------------

    @serves(m.ListOffsetsRequest)
    async def list_offsets(
        self, request: m.ListOffsetsRequest, call: Call
    ) -> m.ListOffsetsResponse:
        """Each partition asked, in order (one may be asked more than once, by several specs):
        earliest (-2: log start), latest (-1: the high watermark, or for isolation level 1,
        read_committed, the last stable offset), a time, by the log append time of stored
        batches, or from v7 the max timestamp (-3: the record with the largest producer
        timestamp)."""
        asked = [(t.name, q) for t in request.topics for q in t.partitions]
        committed = request.isolation_level == READ_COMMITTED
        wants = [
            OffsetWant(name, q.partition_index, q.timestamp, q.current_leader_epoch, committed)
            for name, q in asked
            if _askable(q)
        ]
        answered = iter(self.broker.list_offsets(wants))
        results = iter(
            self._offset(next(answered) if _askable(q) else None, q, name, call.version)
            for name, q in asked
        )
        return m.ListOffsetsResponse(
            tuple(
                m.ListOffsetsTopicResponse(
                    t.name, tuple(next(results) for _ in range(len(t.partitions)))
                )
                for t in request.topics
            )
        )

    def _offset(
        self,
        result: OffsetFound | None,
        asked: m.ListOffsetsPartition,
        name: str,
        version: int,
    ) -> m.ListOffsetsPartitionResponse:
        index, timestamp = asked.partition_index, NO_TIME
        max_asked = asked.timestamp == MAX_TIMESTAMP and version >= MAX_TIMESTAMP_SINCE_VERSION
        if max_asked and index >= 0:
            want = OffsetWant(name, index, MAX_TIMESTAMP, asked.current_leader_epoch)
            result, timestamp = self.broker.max_timestamp(want)
        if result is None:  # refused before asking, or a spec no version we serve defines
            error = (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if index < 0 else ErrorCode.UNSUPPORTED_VERSION
            )
            return m.ListOffsetsPartitionResponse(index, error)
        if result.error != ErrorCode.NONE:
            return m.ListOffsetsPartitionResponse(index, result.error)
        return m.ListOffsetsPartitionResponse(
            index, ErrorCode.NONE, timestamp, result.offset, result.leader_epoch
        )

    @serves(m.OffsetForLeaderEpochRequest)
    async def offset_for_leader_epoch(
        self, request: m.OffsetForLeaderEpochRequest, _call: Call
    ) -> m.OffsetForLeaderEpochResponse:
        """Where each asked epoch ends (KIP-320: a consumer checks its position after a leader
        change): the leader epochs are Raft terms, recorded as records are appended
        (statemachine/leader_epochs.py)."""
        wants = [
            EpochWant(t.topic, p.partition, p.current_leader_epoch, p.leader_epoch)
            for t in request.topics
            for p in t.partitions
        ]
        found = iter(self.broker.epoch_end_offsets(wants))
        return m.OffsetForLeaderEpochResponse(
            tuple(
                m.OffsetForLeaderTopicResult(
                    t.topic,
                    tuple(
                        m.EpochEndOffset(f.error, f.partition, f.leader_epoch, f.end_offset)
                        for f in (next(found) for _ in t.partitions)
                    ),
                )
                for t in request.topics
            )
        )

    @serves(m.DescribeProducersRequest)
    async def describe_producers(
        self, request: m.DescribeProducersRequest, _call: Call
    ) -> m.DescribeProducersResponse:
        answers = []
        for topic in request.topics:
            asked = [n for n in topic.partition_indexes if n >= 0]
            described = await self.broker.describe_producers(topic.name, asked)
            by_partition = {r.partition: r for r in described}
            answers.append(
                m.TopicResponse(
                    topic.name,
                    tuple(_producers(n, by_partition.get(n)) for n in topic.partition_indexes),
                )
            )
        return m.DescribeProducersResponse(tuple(answers))

    # -- Produce ---------------------------------------------------------------------------------

    def produce(
        self,
        request: m.ProduceRequest,
        version: int,
        respond: Callable[[m.ResponseBody | Exception], None],
    ) -> None:
        """Each partition's batch through the core's produce path (`Broker.produce`:
        leadership and the term-start barrier, `verify_batch`, the proposal),
        answered once every one has its result: acks=1 and acks=-1 alike after the Raft commit
        and apply (an acks=0 request is never answered: wire.py)."""
        started = time.perf_counter()
        entries = [(t.name, d) for t in request.topic_data for d in t.partition_data]
        results: list[m.PartitionProduceResponse | None] = [None] * len(entries)
        left = [len(entries)]

        def finish(index: int, result: m.PartitionProduceResponse) -> None:
            results[index] = result
            left[0] -= 1
            if left[0] == 0:
                respond(self._produced(request, results, version))
                self.metrics.request_done("kafka.PRODUCE", "NONE", time.perf_counter() - started)

        if not entries:
            respond(m.ProduceResponse(()))
            return
        timeout_s = self.broker.timeout_s(request.timeout)
        for index, (topic, data) in enumerate(entries):
            done = partial(finish, index)
            if request.acks not in ACKS:
                done(m.PartitionProduceResponse(data.index, ErrorCode.INVALID_REQUIRED_ACKS))
            elif data.index < 0:
                done(m.PartitionProduceResponse(data.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            elif len(data.records or b"") > self.node.limits.batch_bytes_max:
                # Kafka's answer to a batch past max.message.bytes: not retriable, unlike the
                # CORRUPT_MESSAGE the core gives any batch it cannot take.
                done(m.PartitionProduceResponse(data.index, ErrorCode.MESSAGE_TOO_LARGE))
            else:
                where = (topic, data.index)
                records = data.records or b""
                answer = partial(self._partition_produced, done)
                self.broker.produce(where, records, timeout_s, None, answer)

    def _partition_produced(
        self, done: Callable[[m.PartitionProduceResponse], None], result: Produced
    ) -> None:
        index = result.partition
        if result.error == ErrorCode.NONE:
            # The record timestamps are the producer's (CreateTime): no log append time.
            start = self.broker.log_start_offset(result.topic, index)
            done(m.PartitionProduceResponse(index, ErrorCode.NONE, result.base_offset, -1, start))
            return
        leader = self._current_leader(result.topic, index, result.error)
        done(m.PartitionProduceResponse(index, result.error, current_leader=leader))

    def _produced(
        self,
        request: m.ProduceRequest,
        results: list[m.PartitionProduceResponse | None],
        version: int,
    ) -> m.ProduceResponse:
        answers = iter(results)
        topics = tuple(
            m.TopicProduceResponse(
                t.name, tuple(next(answers) or _lost(d.index) for d in t.partition_data)
            )
            for t in request.topic_data
        )
        leaders = {
            r.current_leader.leader_id
            for r in results
            if r is not None and r.current_leader.leader_id >= 0
        }
        endpoints = tuple(
            m.NodeEndpoint(n, *self._addresses[n])
            for n in sorted(leaders)
            if n in self._addresses and version >= NODE_ENDPOINTS_SINCE_VERSION
        )
        return m.ProduceResponse(topics, node_endpoints=endpoints)

    def _current_leader(self, topic: str, partition: int, error: int) -> m.LeaderIdAndEpoch:
        """Where a partition refused with NOT_LEADER_OR_FOLLOWER is led (KIP-951: Produce
        v10+ and Fetch v12+ carry it), so a client need not ask Metadata first."""
        info = self.node.metadata_replica.machine.topics.get(topic)
        if error != ErrorCode.NOT_LEADER_OR_FOLLOWER or info is None:
            return m.NO_LEADER
        leader_id, term = self.broker.leader_and_term(info, partition)
        me = self.node.config.node_id
        if leader_id < 0 or leader_id == me:  # no leader yet, or here but not serving yet
            return m.NO_LEADER
        return m.LeaderIdAndEpoch(leader_id, term)

    # -- Fetch -----------------------------------------------------------------------------------

    @serves(m.FetchRequest)
    async def fetch(self, request: m.FetchRequest, _call: Call) -> m.FetchResponse:
        """The core's Fetch (the leader's committed batches, one byte budget for the answer as
        KIP-74's, a long poll up to max_wait), then, while the answer holds fewer than
        min_bytes and max_wait has not passed, more of the same. Fetch sessions are not
        kept (KIP-227's session id 0: every request is a full one)."""
        wants = _wants(request)
        broker, max_bytes = self.broker, max(request.max_bytes, 0)
        max_wait_ms = max(request.max_wait, 0)
        deadline = broker.fetch_deadline(max_wait_ms)
        answer = await broker.fetch(wants, max_bytes, max_wait_ms, replica_read=False)
        # Kafka answers at once when no partition it leads could fill the answer; waiting
        # on nothing would spin here without yielding, the node stalled until the deadline.
        while _wants_more(answer, request.min_bytes) and await broker.wait_for_data(
            wants, deadline
        ):
            answer = broker.read(wants, max_bytes)
        results = iter(answer)
        return m.FetchResponse(
            tuple(
                m.FetchableTopicResponse(
                    t.topic,
                    tuple(
                        self._fetched(next(results))
                        if fp.partition >= 0
                        else _unknown(fp.partition)
                        for fp in t.partitions
                    ),
                )
                for t in request.topics
            )
        )

    def _fetched(self, result: Fetched) -> m.PartitionData:
        if result.error != ErrorCode.NONE:
            leader = self._current_leader(result.topic, result.partition, result.error)
            return m.PartitionData(result.partition, result.error, current_leader=leader)
        records = b"".join(b.batch for b in result.batches)  # stored bytes, as they are
        aborted = tuple(m.AbortedTransaction(a.producer_id, a.first_offset) for a in result.aborted)
        return m.PartitionData(
            result.partition,
            ErrorCode.NONE,
            result.high_watermark,
            result.last_stable_offset,
            result.log_start_offset,
            aborted_transactions=aborted,
            records=records,
        )

    # -- coordinators --------------------------------------------------------------------------

    @serves(m.FindCoordinatorRequest)
    async def find_coordinator(
        self, request: m.FindCoordinatorRequest, call: Call
    ) -> m.FindCoordinatorResponse:
        """Transactions (key type 1): the leader of the transactional id's transaction state
        partition (cluster/broker/txns.py); groups (key type 0): the leader of the group's
        offsets partition (cluster/broker/groups.py). Each internal topic is created on its
        first ask (COORDINATOR_NOT_AVAILABLE until it has leaders)."""
        keys = request.coordinator_keys if call.version >= 4 else (request.key,)
        answers = tuple([await self._coordinator(key, request.key_type) for key in keys])
        first = answers[0] if answers else m.Coordinator("", -1, "", -1, ErrorCode.NONE)
        return m.FindCoordinatorResponse(
            first.error_code, first.error_message, first.node_id, first.host, first.port, answers
        )

    async def _coordinator(self, key: str, key_type: int) -> m.Coordinator:
        if key_type in (m.COORDINATOR_GROUP, m.COORDINATOR_TRANSACTION):
            if key_type == m.COORDINATOR_GROUP:
                error, node_id = await self.groups.coordinator_node(key)
            else:
                error, node_id = await self.broker.txns.coordinator_node(key)
            if error is ErrorCode.NONE and node_id in self._addresses:
                host, port = self._addresses[node_id]
                return m.Coordinator(key, node_id, host, port, ErrorCode.NONE)
            if error is ErrorCode.NONE:
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            message = "the coordinator is not known yet"
        else:
            error, message = ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}"
        return m.Coordinator(key, -1, "", -1, error, message)


def _wants(request: m.FetchRequest) -> list[FetchWant]:
    """A Kafka Fetch's partitions, in order (a negative partition is left out and answered
    UNKNOWN_TOPIC_OR_PARTITION)."""
    return [
        FetchWant(
            t.topic,
            fp.partition,
            fp.fetch_offset,
            max(fp.partition_max_bytes, 0),
            fp.current_leader_epoch,
            request.isolation_level == READ_COMMITTED,
        )
        for t in request.topics
        for fp in t.partitions
        if fp.partition >= 0
    ]


def _wants_more(answer: list[Fetched], min_bytes: int) -> bool:
    """Whether a Fetch answer holds fewer than min_bytes of batches, and no error to report."""
    if any(r.error for r in answer):
        return False
    return sum(len(b.batch) for r in answer for b in r.batches) < min_bytes


def _unknown(partition: int) -> m.PartitionData:
    return m.PartitionData(partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)


def _lost(partition: int) -> m.PartitionProduceResponse:
    raise AssertionError(f"partition {partition} of a Produce has no result")


def _askable(query: m.ListOffsetsPartition) -> bool:
    """Whether the core can answer it (a partition, and a spec it knows)."""
    return query.partition_index >= 0 and query.timestamp >= SPECS_FROM


def _producers(partition: int, result: PartitionProducers | None) -> m.PartitionResponse:
    if result is None:
        return m.PartitionResponse(partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if result.error != ErrorCode.NONE:
        return m.PartitionResponse(partition, result.error)
    return m.PartitionResponse(
        partition,
        ErrorCode.NONE,
        None,
        tuple(
            m.ProducerState(
                d.producer_id,
                d.epoch,
                d.last_sequence,
                d.last_timestamp_ms,
                d.coordinator_epoch,
                d.txn_start_offset,
            )
            for d in result.producers
        ),
    )
