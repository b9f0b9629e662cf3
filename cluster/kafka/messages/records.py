"""Records: Produce (0), Fetch (1), ListOffsets (2), DeleteRecords (21), OffsetForLeaderEpoch (23).

Part of the Kafka messages (cluster/kafka/messages/__init__.py has their rules): each request
class names its API, the versions served, its response and how it is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.kafka.messages.base import Api, Request, Response, VersionRange

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
class ProduceResponse(Response):
    responses: tuple[TopicProduceResponse, ...]
    throttle_time: int = 0
    node_endpoints: tuple[NodeEndpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class ProduceRequest(Request):
    # From v3: record batch v2 only (magic 2, the log's one format); up to v12, the last
    # version that names topics (v13 names them by topic id).
    API = Api.PRODUCE
    VERSIONS = VersionRange(3, 12)
    RESPONSE = ProduceResponse

    acks: int
    timeout: int
    topic_data: tuple[TopicProduceData, ...]
    transactional_id: str | None = None

    def refusal(self, code: int, message: str) -> ProduceResponse:
        return ProduceResponse(
            tuple(
                TopicProduceResponse(
                    t.name,
                    tuple(
                        PartitionProduceResponse(p.index, code, error_message=message)
                        for p in t.partition_data
                    ),
                )
                for t in self.topic_data
            )
        )


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
class FetchResponse(Response):
    responses: tuple[FetchableTopicResponse, ...]
    error_code: int = 0
    session_id: int = 0
    throttle_time: int = 0
    node_endpoints: tuple[NodeEndpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class FetchRequest(Request):
    # From v4, record batch v2; up to v12, the last version that names topics.
    API = Api.FETCH
    VERSIONS = VersionRange(4, 12)
    RESPONSE = FetchResponse

    max_wait: int
    min_bytes: int
    topics: tuple[FetchTopic, ...]
    max_bytes: int = 2**31 - 1
    isolation_level: int = 0
    session_id: int = 0
    session_epoch: int = -1
    replica_id: int = -1
    forgotten_topics_data: tuple[ForgottenTopic, ...] = ()  # sessions only: not kept here

    def refusal(self, code: int, message: str) -> FetchResponse:  # noqa: ARG002
        return FetchResponse(
            tuple(
                FetchableTopicResponse(
                    t.topic, tuple(PartitionData(p.partition, code) for p in t.partitions)
                )
                for t in self.topics
            ),
            error_code=code,
        )


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
class ListOffsetsResponse(Response):
    topics: tuple[ListOffsetsTopicResponse, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(Request):
    API = Api.LIST_OFFSETS
    VERSIONS = VersionRange(1, 7)  # v7: the max timestamp spec (-3)
    RESPONSE = ListOffsetsResponse

    topics: tuple[ListOffsetsTopic, ...]
    replica_id: int = -1
    isolation_level: int = 0

    def refusal(self, code: int, message: str) -> ListOffsetsResponse:  # noqa: ARG002
        return ListOffsetsResponse(
            tuple(
                ListOffsetsTopicResponse(
                    t.name,
                    tuple(
                        ListOffsetsPartitionResponse(p.partition_index, code) for p in t.partitions
                    ),
                )
                for t in self.topics
            )
        )


# -- OffsetForLeaderEpoch (23) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetForLeaderPartition:
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class OffsetForLeaderTopic:
    topic: str
    partitions: tuple[OffsetForLeaderPartition, ...]


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    error_code: int
    partition: int
    leader_epoch: int = -1
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class OffsetForLeaderTopicResult:
    topic: str
    partitions: tuple[EpochEndOffset, ...]


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochResponse(Response):
    topics: tuple[OffsetForLeaderTopicResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochRequest(Request):
    """v2-v4 (Kafka 4 removed v0-v1); `replica_id` -1 is a consumer, -2 (v2's) too."""

    API = Api.OFFSET_FOR_LEADER_EPOCH
    VERSIONS = VersionRange(2, 4)
    RESPONSE = OffsetForLeaderEpochResponse

    topics: tuple[OffsetForLeaderTopic, ...]
    replica_id: int = -2

    def refusal(self, code: int, message: str) -> OffsetForLeaderEpochResponse:  # noqa: ARG002
        return OffsetForLeaderEpochResponse(
            tuple(
                OffsetForLeaderTopicResult(
                    t.topic, tuple(EpochEndOffset(code, p.partition) for p in t.partitions)
                )
                for t in self.topics
            )
        )


# -- DeleteRecords (21) --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeleteRecordsPartition:
    partition_index: int
    offset: int  # the new log start; -1: the high watermark


@dataclass(frozen=True, slots=True)
class DeleteRecordsTopic:
    name: str
    partitions: tuple[DeleteRecordsPartition, ...]


@dataclass(frozen=True, slots=True)
class DeleteRecordsPartitionResult:
    partition_index: int
    low_watermark: int
    error_code: int


@dataclass(frozen=True, slots=True)
class DeleteRecordsTopicResult:
    name: str
    partitions: tuple[DeleteRecordsPartitionResult, ...]


@dataclass(frozen=True, slots=True)
class DeleteRecordsResponse(Response):
    topics: tuple[DeleteRecordsTopicResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeleteRecordsRequest(Request):
    API = Api.DELETE_RECORDS
    VERSIONS = VersionRange(0, 2)
    RESPONSE = DeleteRecordsResponse

    topics: tuple[DeleteRecordsTopic, ...]
    timeout: int = 0

    def refusal(self, code: int, message: str) -> DeleteRecordsResponse:  # noqa: ARG002
        return DeleteRecordsResponse(
            tuple(
                DeleteRecordsTopicResult(
                    t.name,
                    tuple(
                        DeleteRecordsPartitionResult(p.partition_index, -1, code)
                        for p in t.partitions
                    ),
                )
                for t in self.topics
            )
        )
