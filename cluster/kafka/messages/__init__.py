"""The Kafka messages the listener reads and writes, in our own types: one class per message,
its fields the union of every version we support.

Role: the vocabulary shared by the codec (cluster/kafka/codec/, the only package that knows
kio, which has one generated class per message *and version*) and the frontend, which reads
requests and builds responses without knowing which version is on the wire. One module per
family of APIs (as aiokafka's protocol/): `cluster`, `configs`, `topics`, `records`,
`producers`, `groups`; this package gathers them, and builds the table of every request served
(`REQUESTS`) from the request classes themselves (cluster/kafka/messages/base.py).

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

from dataclasses import dataclass
from types import MappingProxyType, ModuleType

from cluster.kafka.messages import cluster, configs, groups, producers, records, topics
from cluster.kafka.messages.base import (
    NO_TOPIC_ID,
    Api,
    Request,
    RequestHeader,
    Response,
    VersionRange,
)
from cluster.kafka.messages.cluster import (
    COORDINATOR_GROUP,
    COORDINATOR_TRANSACTION,
    ApiVersion,
    ApiVersionsRequest,
    ApiVersionsResponse,
    Coordinator,
    DescribeClusterBroker,
    DescribeClusterRequest,
    DescribeClusterResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from cluster.kafka.messages.configs import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    AlterableConfig,
    AlterConfigsResource,
    AlterConfigsResourceResponse,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeConfigsSynonym,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from cluster.kafka.messages.groups import (
    NO_GENERATION,
    UNKNOWN_MEMBER_ID,
    DeletableGroupResult,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribedGroupMember,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
    JoinGroupResponseMember,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    MemberIdentity,
    MemberResponse,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
    OffsetDeleteResponse,
    OffsetDeleteResponsePartition,
    OffsetDeleteResponseTopic,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartition,
    OffsetFetchResponseTopic,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
    SyncGroupResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    commit_results,
)
from cluster.kafka.messages.producers import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnPartitionResult,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopic,
    AddPartitionsToTxnTopicResult,
    DescribedTransaction,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListedTransaction,
    ListTransactionsRequest,
    ListTransactionsResponse,
    PartitionResponse,
    ProducerState,
    TopicData,
    TopicRequest,
    TopicResponse,
    WritableTxnMarker,
    WritableTxnMarkerPartitionResult,
    WritableTxnMarkerResult,
    WritableTxnMarkerTopic,
    WritableTxnMarkerTopicResult,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from cluster.kafka.messages.records import (
    NO_LEADER,
    AbortedTransaction,
    BatchIndexAndErrorMessage,
    DeleteRecordsPartition,
    DeleteRecordsPartitionResult,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopic,
    DeleteRecordsTopicResult,
    EpochEndOffset,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ForgottenTopic,
    LeaderIdAndEpoch,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    ListOffsetsTopicResponse,
    NodeEndpoint,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
    OffsetForLeaderTopicResult,
    PartitionData,
    PartitionProduceData,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
    TopicProduceResponse,
)
from cluster.kafka.messages.topics import (
    CreatableReplicaAssignment,
    CreatableTopic,
    CreatableTopicConfig,
    CreatableTopicConfigs,
    CreatableTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DeleteTopicState,
)

RequestBody = Request
ResponseBody = Response


def _requests(*modules: ModuleType) -> MappingProxyType[Api, type[Request]]:
    """Every request class of `modules`, by its API: each one's declaration checked."""
    found: dict[Api, type[Request]] = {}
    for module in modules:
        for cls in vars(module).values():
            if not (isinstance(cls, type) and issubclass(cls, Request)) or cls is Request:
                continue
            assert cls.API not in found, f"{cls.__name__} and {found[cls.API].__name__}: one API"
            low, high = cls.VERSIONS
            assert 0 <= low <= high, f"{cls.__name__}: versions {cls.VERSIONS}"
            assert issubclass(cls.RESPONSE, Response), f"{cls.__name__}: RESPONSE"
            assert "refusal" in vars(cls), f"{cls.__name__} has no refusal"
            found[cls.API] = cls
    return MappingProxyType(dict(sorted(found.items())))


# Every request this listener serves, by API: the one table (the codec's versions, the
# dispatch, the messages of each API are read from it).
REQUESTS = _requests(cluster, configs, topics, records, producers, groups)
MESSAGES: MappingProxyType[Api, tuple[type[Request], type[Response]]] = MappingProxyType(
    {api: (cls, cls.RESPONSE) for api, cls in REQUESTS.items()}
)


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    """One decoded request: its header, and its body in our types."""

    header: RequestHeader
    body: Request

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        return self.header.api_version


__all__ = [
    "COORDINATOR_GROUP",
    "COORDINATOR_TRANSACTION",
    "MESSAGES",
    "NO_GENERATION",
    "NO_LEADER",
    "NO_TOPIC_ID",
    "REQUESTS",
    "RESOURCE_BROKER",
    "RESOURCE_TOPIC",
    "UNKNOWN_MEMBER_ID",
    "AbortedTransaction",
    "AddOffsetsToTxnRequest",
    "AddOffsetsToTxnResponse",
    "AddPartitionsToTxnPartitionResult",
    "AddPartitionsToTxnRequest",
    "AddPartitionsToTxnResponse",
    "AddPartitionsToTxnTopic",
    "AddPartitionsToTxnTopicResult",
    "AlterConfigsResource",
    "AlterConfigsResourceResponse",
    "AlterableConfig",
    "Api",
    "ApiVersion",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "BatchIndexAndErrorMessage",
    "Coordinator",
    "CreatableReplicaAssignment",
    "CreatableTopic",
    "CreatableTopicConfig",
    "CreatableTopicConfigs",
    "CreatableTopicResult",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeletableGroupResult",
    "DeletableTopicResult",
    "DeleteGroupsRequest",
    "DeleteGroupsResponse",
    "DeleteRecordsPartition",
    "DeleteRecordsPartitionResult",
    "DeleteRecordsRequest",
    "DeleteRecordsResponse",
    "DeleteRecordsTopic",
    "DeleteRecordsTopicResult",
    "DeleteTopicState",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
    "DescribeClusterBroker",
    "DescribeClusterRequest",
    "DescribeClusterResponse",
    "DescribeConfigsRequest",
    "DescribeConfigsResource",
    "DescribeConfigsResourceResult",
    "DescribeConfigsResponse",
    "DescribeConfigsResult",
    "DescribeConfigsSynonym",
    "DescribeGroupsRequest",
    "DescribeGroupsResponse",
    "DescribeProducersRequest",
    "DescribeProducersResponse",
    "DescribeTransactionsRequest",
    "DescribeTransactionsResponse",
    "DescribedGroup",
    "DescribedGroupMember",
    "DescribedTransaction",
    "EndTxnRequest",
    "EndTxnResponse",
    "EpochEndOffset",
    "FetchPartition",
    "FetchRequest",
    "FetchResponse",
    "FetchTopic",
    "FetchableTopicResponse",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "ForgottenTopic",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "IncrementalAlterConfigsRequest",
    "IncrementalAlterConfigsResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "JoinGroupRequest",
    "JoinGroupRequestProtocol",
    "JoinGroupResponse",
    "JoinGroupResponseMember",
    "KafkaRequest",
    "LeaderIdAndEpoch",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "ListTransactionsRequest",
    "ListTransactionsResponse",
    "ListedGroup",
    "ListedTransaction",
    "MemberIdentity",
    "MemberResponse",
    "MetadataRequest",
    "MetadataRequestTopic",
    "MetadataResponse",
    "MetadataResponseBroker",
    "MetadataResponsePartition",
    "MetadataResponseTopic",
    "NodeEndpoint",
    "OffsetCommitRequest",
    "OffsetCommitRequestPartition",
    "OffsetCommitRequestTopic",
    "OffsetCommitResponse",
    "OffsetCommitResponsePartition",
    "OffsetCommitResponseTopic",
    "OffsetDeleteRequest",
    "OffsetDeleteRequestPartition",
    "OffsetDeleteRequestTopic",
    "OffsetDeleteResponse",
    "OffsetDeleteResponsePartition",
    "OffsetDeleteResponseTopic",
    "OffsetFetchRequest",
    "OffsetFetchRequestGroup",
    "OffsetFetchRequestTopic",
    "OffsetFetchResponse",
    "OffsetFetchResponseGroup",
    "OffsetFetchResponsePartition",
    "OffsetFetchResponseTopic",
    "OffsetForLeaderEpochRequest",
    "OffsetForLeaderEpochResponse",
    "OffsetForLeaderPartition",
    "OffsetForLeaderTopic",
    "OffsetForLeaderTopicResult",
    "PartitionData",
    "PartitionProduceData",
    "PartitionProduceResponse",
    "PartitionResponse",
    "ProduceRequest",
    "ProduceResponse",
    "ProducerState",
    "Request",
    "RequestBody",
    "RequestHeader",
    "Response",
    "ResponseBody",
    "SyncGroupRequest",
    "SyncGroupRequestAssignment",
    "SyncGroupResponse",
    "TopicData",
    "TopicProduceData",
    "TopicProduceResponse",
    "TopicRequest",
    "TopicResponse",
    "TxnOffsetCommitRequest",
    "TxnOffsetCommitResponse",
    "VersionRange",
    "WritableTxnMarker",
    "WritableTxnMarkerPartitionResult",
    "WritableTxnMarkerResult",
    "WritableTxnMarkerTopic",
    "WritableTxnMarkerTopicResult",
    "WriteTxnMarkersRequest",
    "WriteTxnMarkersResponse",
    "commit_results",
]
