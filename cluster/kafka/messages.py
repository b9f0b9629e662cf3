"""The Kafka messages the listener reads and writes, in our own types: one class per message,
its fields the union of every version we support.

Role: the vocabulary shared by the codec (cluster/kafka/codec.py, the only module that knows
kio, which has one generated class per message *and version*) and the frontend, which reads
requests and builds responses without knowing which version is on the wire.

Rules:
- A field's name is the one Kafka's schema gives it (as kio spells it: snake case), so the
  codec maps our fields to a version's by name alone: a field that version lacks is left out
  on the way out, and takes our default on the way in.
- Units are Kafka's: a duration field (`timeout`, `max_wait`, `throttle_time`) is in ms, a time
  (`log_append_time`) in ms since the epoch, -1 for none; error codes are plain integers
  (`statemachine.errors.ErrorCode` values).
- Requests carry only what the frontend reads; a response carries every field it may set.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

NO_TOPIC_ID: uuid.UUID | None = None


class Api(IntEnum):
    """The API keys this listener knows (Kafka's numbers)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    DELETE_GROUPS = 42
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61


class VersionRange(NamedTuple):
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


# -- ApiVersions (18) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest:
    client_software_name: str = ""
    client_software_version: str = ""


@dataclass(frozen=True, slots=True)
class ApiVersion:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse:
    error_code: int
    api_keys: tuple[ApiVersion, ...]
    throttle_time: int = 0


# -- Metadata (3) --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataRequestTopic:
    name: str | None = None
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    # None: every topic (v1+); in v0 an empty list means every topic.
    topics: tuple[MetadataRequestTopic, ...] | None = None
    allow_auto_topic_creation: bool = True
    include_cluster_authorized_operations: bool = False
    include_topic_authorized_operations: bool = False


@dataclass(frozen=True, slots=True)
class MetadataResponseBroker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class MetadataResponsePartition:
    error_code: int
    partition_index: int
    leader_id: int
    leader_epoch: int = -1
    replica_nodes: tuple[int, ...] = ()
    isr_nodes: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MetadataResponseTopic:
    error_code: int
    name: str | None
    topic_id: uuid.UUID | None = NO_TOPIC_ID
    is_internal: bool = False
    partitions: tuple[MetadataResponsePartition, ...] = ()


@dataclass(frozen=True, slots=True)
class MetadataResponse:
    brokers: tuple[MetadataResponseBroker, ...]
    topics: tuple[MetadataResponseTopic, ...]
    cluster_id: str | None = None
    controller_id: int = -1
    error_code: int = 0
    throttle_time: int = 0


# -- DescribeCluster (60) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DescribeClusterRequest:
    include_cluster_authorized_operations: bool = False
    endpoint_type: int = 1
    include_fenced_brokers: bool = False


@dataclass(frozen=True, slots=True)
class DescribeClusterBroker:
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    is_fenced: bool = False


@dataclass(frozen=True, slots=True)
class DescribeClusterResponse:
    error_code: int
    cluster_id: str
    brokers: tuple[DescribeClusterBroker, ...] = ()
    controller_id: int = -1
    error_message: str | None = None
    endpoint_type: int = 1
    cluster_authorized_operations: int = -(2**31)
    throttle_time: int = 0


# -- CreateTopics (19) and DeleteTopics (20) -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreatableReplicaAssignment:
    partition_index: int
    broker_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CreatableTopicConfig:
    name: str
    value: str | None


@dataclass(frozen=True, slots=True)
class CreatableTopic:
    name: str
    num_partitions: int
    replication_factor: int
    assignments: tuple[CreatableReplicaAssignment, ...] = ()
    configs: tuple[CreatableTopicConfig, ...] = ()


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest:
    topics: tuple[CreatableTopic, ...]
    timeout: int = 60_000
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class CreatableTopicConfigs:
    name: str
    value: str | None
    read_only: bool = False
    config_source: int = -1
    is_sensitive: bool = False


@dataclass(frozen=True, slots=True)
class CreatableTopicResult:
    name: str
    error_code: int
    error_message: str | None = None
    topic_id: uuid.UUID | None = NO_TOPIC_ID
    num_partitions: int = -1
    replication_factor: int = -1
    configs: tuple[CreatableTopicConfigs, ...] | None = None
    topic_config_error_code: int = 0


@dataclass(frozen=True, slots=True)
class CreateTopicsResponse:
    topics: tuple[CreatableTopicResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeleteTopicState:
    name: str | None = None
    topic_id: uuid.UUID | None = NO_TOPIC_ID


@dataclass(frozen=True, slots=True)
class DeleteTopicsRequest:
    topic_names: tuple[str, ...] = ()  # v1-v5
    topics: tuple[DeleteTopicState, ...] = ()  # v6: by name or by topic id
    timeout: int = 0


@dataclass(frozen=True, slots=True)
class DeletableTopicResult:
    name: str | None
    error_code: int
    topic_id: uuid.UUID | None = NO_TOPIC_ID
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse:
    responses: tuple[DeletableTopicResult, ...]
    throttle_time: int = 0


# -- ListOffsets (2) -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition:
    partition_index: int
    timestamp: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ListOffsetsTopic:
    name: str
    partitions: tuple[ListOffsetsPartition, ...]


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    topics: tuple[ListOffsetsTopic, ...]
    replica_id: int = -1
    isolation_level: int = 0


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResponse:
    partition_index: int
    error_code: int
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ListOffsetsTopicResponse:
    name: str
    partitions: tuple[ListOffsetsPartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse:
    topics: tuple[ListOffsetsTopicResponse, ...]
    throttle_time: int = 0


# -- InitProducerId (22) -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    transactional_id: str | None = None
    transaction_timeout: int = 0
    producer_id: int = -1  # v3+: the producer's current id and epoch (KIP-360), or -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse:
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    throttle_time: int = 0


# -- AddPartitionsToTxn (24), AddOffsetsToTxn (25): served only to refuse (no transactions yet) --


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnTopic:
    name: str
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest:
    # v0-v3, a client's (v4+ batch transactions: a broker's). Kafka's own field names.
    v3_and_below_transactional_id: str
    v3_and_below_producer_id: int
    v3_and_below_producer_epoch: int
    v3_and_below_topics: tuple[AddPartitionsToTxnTopic, ...]


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnPartitionResult:
    partition_index: int
    partition_error_code: int


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnTopicResult:
    name: str
    results_by_partition: tuple[AddPartitionsToTxnPartitionResult, ...]


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnResponse:
    results_by_topic_v3_and_below: tuple[AddPartitionsToTxnTopicResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnResponse:
    error_code: int
    throttle_time: int = 0


# -- DescribeProducers (61) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRequest:
    name: str
    partition_indexes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeProducersRequest:
    topics: tuple[TopicRequest, ...]


@dataclass(frozen=True, slots=True)
class ProducerState:
    producer_id: int
    producer_epoch: int
    last_sequence: int = -1
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class PartitionResponse:
    partition_index: int
    error_code: int
    error_message: str | None = None
    active_producers: tuple[ProducerState, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicResponse:
    name: str
    partitions: tuple[PartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class DescribeProducersResponse:
    topics: tuple[TopicResponse, ...]
    throttle_time: int = 0


# -- FindCoordinator (10) ------------------------------------------------------------------------

COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest:
    key: str = ""  # v0-v3: one key
    key_type: int = COORDINATOR_GROUP  # v1+
    coordinator_keys: tuple[str, ...] = ()  # v4+: several keys at once


@dataclass(frozen=True, slots=True)
class Coordinator:
    key: str
    node_id: int
    host: str
    port: int
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse:
    # v0-v3 answer one key in these fields; v4+ answer every key in `coordinators`.
    error_code: int = 0
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1
    coordinators: tuple[Coordinator, ...] = ()
    throttle_time: int = 0


# -- JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13) -----------------------------

NO_GENERATION = -1
UNKNOWN_MEMBER_ID = ""  # a member's first JoinGroup: the coordinator names it


@dataclass(frozen=True, slots=True)
class JoinGroupRequestProtocol:
    name: str  # the assignor ("range", "roundrobin", "cooperative-sticky", ...)
    metadata: bytes  # opaque to the coordinator (the consumer's subscription)


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    session_timeout: int
    member_id: str
    protocol_type: str  # "consumer" for Kafka's consumers
    protocols: tuple[JoinGroupRequestProtocol, ...]
    rebalance_timeout: int = -1  # v1+; v0 has none: Kafka takes the session timeout
    group_instance_id: str | None = None  # v5+: a static member's id (KIP-345)
    reason: str | None = None  # v8+: why the member (re)joins (KIP-800)


@dataclass(frozen=True, slots=True)
class JoinGroupResponseMember:
    member_id: str
    metadata: bytes
    group_instance_id: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    error_code: int
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None  # v7+
    # Nullable in v7+ only: "" where none was chosen, as Kafka writes it before v7.
    protocol_name: str | None = ""
    leader: str = ""
    skip_assignment: bool = False  # v9+
    member_id: str = UNKNOWN_MEMBER_ID
    members: tuple[JoinGroupResponseMember, ...] = ()  # the leader's answer only
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class SyncGroupRequestAssignment:
    member_id: str
    assignment: bytes  # opaque to the coordinator (the consumer's partitions)


@dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    assignments: tuple[SyncGroupRequestAssignment, ...] = ()  # the leader's only
    group_instance_id: str | None = None  # v3+
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class SyncGroupResponse:
    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None  # v3+


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error_code: int
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    group_id: str
    member_id: str = ""  # v0-v2: one member
    members: tuple[MemberIdentity, ...] = ()  # v3+: several at once (KIP-345)


@dataclass(frozen=True, slots=True)
class MemberResponse:
    member_id: str
    group_instance_id: str | None
    error_code: int


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse:
    error_code: int
    members: tuple[MemberResponse, ...] = ()  # v3+: each member's outcome
    throttle_time: int = 0


# -- OffsetCommit (8) and OffsetFetch (9) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitRequestPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1  # v6+
    committed_metadata: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitRequestTopic:
    name: str
    partitions: tuple[OffsetCommitRequestPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    group_id: str
    topics: tuple[OffsetCommitRequestTopic, ...]
    # The member's generation; -1 with an empty member id: a commit from outside the group
    # (a consumer with manual assignment, the admin client).
    generation_id_or_member_epoch: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None  # v7+
    retention_time: int = -1  # v2-v4; -1: the broker's retention


@dataclass(frozen=True, slots=True)
class OffsetCommitResponsePartition:
    partition_index: int
    error_code: int


@dataclass(frozen=True, slots=True)
class OffsetCommitResponseTopic:
    name: str
    partitions: tuple[OffsetCommitResponsePartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    topics: tuple[OffsetCommitResponseTopic, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetFetchRequestTopic:
    name: str
    partition_indexes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetFetchRequestGroup:
    group_id: str
    topics: tuple[OffsetFetchRequestTopic, ...] | None = None  # None: every committed partition


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    # v1-v7 ask for one group in these fields; v8+ for several in `groups` (KIP-709).
    group_id: str = ""
    topics: tuple[OffsetFetchRequestTopic, ...] | None = None  # None (v2+): every partition
    groups: tuple[OffsetFetchRequestGroup, ...] = ()
    require_stable: bool = False  # v7+ (KIP-447)


@dataclass(frozen=True, slots=True)
class OffsetFetchResponsePartition:
    partition_index: int
    error_code: int
    committed_offset: int = -1  # -1: nothing committed
    committed_leader_epoch: int = -1  # v5+
    metadata: str | None = ""  # "" where nothing was committed, as Kafka answers


@dataclass(frozen=True, slots=True)
class OffsetFetchResponseTopic:
    name: str
    partitions: tuple[OffsetFetchResponsePartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchResponseGroup:
    group_id: str
    error_code: int
    topics: tuple[OffsetFetchResponseTopic, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    # v1-v7 answer one group in these fields (its error code from v2); v8+ every group in
    # `groups`.
    topics: tuple[OffsetFetchResponseTopic, ...] = ()
    error_code: int = 0
    groups: tuple[OffsetFetchResponseGroup, ...] = ()
    throttle_time: int = 0


# -- DescribeGroups (15), ListGroups (16), DeleteGroups (42) -------------------------------------


@dataclass(frozen=True, slots=True)
class DescribeGroupsRequest:
    groups: tuple[str, ...]
    include_authorized_operations: bool = False  # v3+


@dataclass(frozen=True, slots=True)
class DescribedGroupMember:
    member_id: str
    client_id: str
    client_host: str
    member_metadata: bytes = b""
    member_assignment: bytes = b""
    group_instance_id: str | None = None  # v4+


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error_code: int
    group_state: str = ""  # "Stable", "Empty", "Dead", ... ("" with an error)
    protocol_type: str = ""
    protocol_data: str = ""  # the chosen protocol (the assignor) while the group is stable
    members: tuple[DescribedGroupMember, ...] = ()
    authorized_operations: int = -(2**31)  # v3+; -2^31: not asked for


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse:
    groups: tuple[DescribedGroup, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ListGroupsRequest:
    states_filter: tuple[str, ...] = ()  # v4+: only groups in these states; () for every group


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str = ""  # v4+


@dataclass(frozen=True, slots=True)
class ListGroupsResponse:
    error_code: int
    groups: tuple[ListedGroup, ...] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeleteGroupsRequest:
    groups_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeletableGroupResult:
    group_id: str
    error_code: int


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse:
    results: tuple[DeletableGroupResult, ...]
    throttle_time: int = 0


# -- Produce (0) ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionProduceData:
    index: int
    records: bytes | memoryview | None  # decoded: a view of the request (codec.py)


@dataclass(frozen=True, slots=True)
class TopicProduceData:
    name: str
    partition_data: tuple[PartitionProduceData, ...]


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    acks: int
    timeout: int
    topic_data: tuple[TopicProduceData, ...]
    transactional_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeaderIdAndEpoch:
    leader_id: int = -1
    leader_epoch: int = -1


NO_LEADER = LeaderIdAndEpoch()


@dataclass(frozen=True, slots=True)
class BatchIndexAndErrorMessage:
    batch_index: int
    batch_index_error_message: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionProduceResponse:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    record_errors: tuple[BatchIndexAndErrorMessage, ...] = ()
    error_message: str | None = None
    current_leader: LeaderIdAndEpoch = NO_LEADER


@dataclass(frozen=True, slots=True)
class TopicProduceResponse:
    name: str
    partition_responses: tuple[PartitionProduceResponse, ...]


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    responses: tuple[TopicProduceResponse, ...]
    throttle_time: int = 0
    node_endpoints: tuple[NodeEndpoint, ...] = ()


# -- Fetch (1) -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchPartition:
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class FetchTopic:
    topic: str
    partitions: tuple[FetchPartition, ...]


@dataclass(frozen=True, slots=True)
class ForgottenTopic:
    topic: str
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FetchRequest:
    max_wait: int
    min_bytes: int
    topics: tuple[FetchTopic, ...]
    max_bytes: int = 2**31 - 1
    isolation_level: int = 0
    session_id: int = 0
    session_epoch: int = -1
    replica_id: int = -1
    forgotten_topics_data: tuple[ForgottenTopic, ...] = ()  # sessions only: not kept here


@dataclass(frozen=True, slots=True)
class PartitionData:
    partition_index: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    current_leader: LeaderIdAndEpoch = NO_LEADER
    aborted_transactions: tuple[AbortedTransaction, ...] | None = None
    preferred_read_replica: int = -1
    # Empty, never null, as Kafka answers a partition in error: librdkafka reads a null as an
    # invalid MessageSetSize (-1), fails to parse the whole answer and so never sees the error
    # (a NOT_LEADER_OR_FOLLOWER it should follow): it fetches again at once, in a loop.
    records: bytes | None = b""


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class FetchableTopicResponse:
    topic: str
    partitions: tuple[PartitionData, ...]


@dataclass(frozen=True, slots=True)
class FetchResponse:
    responses: tuple[FetchableTopicResponse, ...]
    error_code: int = 0
    session_id: int = 0
    throttle_time: int = 0
    node_endpoints: tuple[NodeEndpoint, ...] = ()


RequestBody = (
    ApiVersionsRequest
    | MetadataRequest
    | DescribeClusterRequest
    | CreateTopicsRequest
    | DeleteTopicsRequest
    | ListOffsetsRequest
    | InitProducerIdRequest
    | AddPartitionsToTxnRequest
    | AddOffsetsToTxnRequest
    | DescribeProducersRequest
    | FindCoordinatorRequest
    | JoinGroupRequest
    | SyncGroupRequest
    | HeartbeatRequest
    | LeaveGroupRequest
    | OffsetCommitRequest
    | OffsetFetchRequest
    | DescribeGroupsRequest
    | ListGroupsRequest
    | DeleteGroupsRequest
    | ProduceRequest
    | FetchRequest
)
ResponseBody = (
    ApiVersionsResponse
    | MetadataResponse
    | DescribeClusterResponse
    | CreateTopicsResponse
    | DeleteTopicsResponse
    | ListOffsetsResponse
    | InitProducerIdResponse
    | AddPartitionsToTxnResponse
    | AddOffsetsToTxnResponse
    | DescribeProducersResponse
    | FindCoordinatorResponse
    | JoinGroupResponse
    | SyncGroupResponse
    | HeartbeatResponse
    | LeaveGroupResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
    | DescribeGroupsResponse
    | ListGroupsResponse
    | DeleteGroupsResponse
    | ProduceResponse
    | FetchResponse
)

# Each API's request and response classes.
MESSAGES: dict[Api, tuple[type[RequestBody], type[ResponseBody]]] = {
    Api.PRODUCE: (ProduceRequest, ProduceResponse),
    Api.FETCH: (FetchRequest, FetchResponse),
    Api.LIST_OFFSETS: (ListOffsetsRequest, ListOffsetsResponse),
    Api.METADATA: (MetadataRequest, MetadataResponse),
    Api.OFFSET_COMMIT: (OffsetCommitRequest, OffsetCommitResponse),
    Api.OFFSET_FETCH: (OffsetFetchRequest, OffsetFetchResponse),
    Api.FIND_COORDINATOR: (FindCoordinatorRequest, FindCoordinatorResponse),
    Api.JOIN_GROUP: (JoinGroupRequest, JoinGroupResponse),
    Api.HEARTBEAT: (HeartbeatRequest, HeartbeatResponse),
    Api.LEAVE_GROUP: (LeaveGroupRequest, LeaveGroupResponse),
    Api.SYNC_GROUP: (SyncGroupRequest, SyncGroupResponse),
    Api.DESCRIBE_GROUPS: (DescribeGroupsRequest, DescribeGroupsResponse),
    Api.LIST_GROUPS: (ListGroupsRequest, ListGroupsResponse),
    Api.DELETE_GROUPS: (DeleteGroupsRequest, DeleteGroupsResponse),
    Api.API_VERSIONS: (ApiVersionsRequest, ApiVersionsResponse),
    Api.CREATE_TOPICS: (CreateTopicsRequest, CreateTopicsResponse),
    Api.DELETE_TOPICS: (DeleteTopicsRequest, DeleteTopicsResponse),
    Api.INIT_PRODUCER_ID: (InitProducerIdRequest, InitProducerIdResponse),
    Api.ADD_PARTITIONS_TO_TXN: (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse),
    Api.ADD_OFFSETS_TO_TXN: (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse),
    Api.DESCRIBE_CLUSTER: (DescribeClusterRequest, DescribeClusterResponse),
    Api.DESCRIBE_PRODUCERS: (DescribeProducersRequest, DescribeProducersResponse),
}


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    """One decoded request: its header, and its body in our types."""

    header: RequestHeader
    body: RequestBody

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        return self.header.api_version
