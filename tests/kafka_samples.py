"""One sample of every Kafka request and response the listener serves, in our message types:
what the codec tests (tests/unit/test_kafka_codec.py) round-trip through every version."""

from __future__ import annotations

import uuid

from cluster.kafka import messages as m
from statemachine.errors import ErrorCode

TOPIC_ID = uuid.UUID("5f1c2b6e-9b1e-4c1e-8a52-6d0a4f0b7e11")

# A consumer's subscription to "orders" and its assignment of partition 0 (ConsumerProtocol v0):
# opaque bytes to the coordinator, carried as they are.
SUBSCRIPTION = b"\x00\x00\x00\x00\x00\x01\x00\x06orders\xff\xff\xff\xff"
ASSIGNMENT = (
    b"\x00\x00\x00\x00\x00\x01\x00\x06orders\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff"
)

_COMMIT_TOPICS = (
    m.OffsetCommitRequestTopic(
        "orders",
        (
            m.OffsetCommitRequestPartition(0, 42, 3, "meta"),
            m.OffsetCommitRequestPartition(1, 7, -1, None),
        ),
    ),
)
REQUESTS: dict[m.Api, m.RequestBody] = {
    m.Api.API_VERSIONS: m.ApiVersionsRequest("librdkafka", "2.16.0"),
    m.Api.METADATA: m.MetadataRequest(
        (m.MetadataRequestTopic("orders", TOPIC_ID), m.MetadataRequestTopic("b", TOPIC_ID)),
        allow_auto_topic_creation=False,
    ),
    m.Api.DESCRIBE_CLUSTER: m.DescribeClusterRequest(True, 1, True),
    m.Api.DESCRIBE_CONFIGS: m.DescribeConfigsRequest(
        (
            m.DescribeConfigsResource(m.RESOURCE_TOPIC, "orders", ("retention.ms",)),
            m.DescribeConfigsResource(m.RESOURCE_BROKER, "1"),
        ),
        True,
        True,
    ),
    m.Api.CREATE_TOPICS: m.CreateTopicsRequest(
        (
            m.CreatableTopic(
                "orders",
                3,
                2,
                (m.CreatableReplicaAssignment(0, (1, 2)),),
                (m.CreatableTopicConfig("retention.ms", "1000"),),
            ),
        ),
        timeout=5_000,
        validate_only=True,
    ),
    m.Api.DELETE_TOPICS: m.DeleteTopicsRequest(
        ("orders", "b"), (m.DeleteTopicState("orders", TOPIC_ID),), timeout=3_000
    ),
    m.Api.LIST_OFFSETS: m.ListOffsetsRequest(
        (m.ListOffsetsTopic("orders", (m.ListOffsetsPartition(0, -2, 5),)),), -1, 1
    ),
    m.Api.OFFSET_FOR_LEADER_EPOCH: m.OffsetForLeaderEpochRequest(
        (m.OffsetForLeaderTopic("orders", (m.OffsetForLeaderPartition(0, 3, 5),)),), -1
    ),
    m.Api.DELETE_RECORDS: m.DeleteRecordsRequest(
        (
            m.DeleteRecordsTopic(
                "orders", (m.DeleteRecordsPartition(0, 42), m.DeleteRecordsPartition(1, -1))
            ),
        ),
        5_000,
    ),
    m.Api.INCREMENTAL_ALTER_CONFIGS: m.IncrementalAlterConfigsRequest(
        (
            m.AlterConfigsResource(
                m.RESOURCE_TOPIC,
                "orders",
                (
                    m.AlterableConfig("retention.ms", 0, "60000"),
                    m.AlterableConfig("retention.bytes", 1, None),
                ),
            ),
        ),
        True,
    ),
    m.Api.OFFSET_DELETE: m.OffsetDeleteRequest(
        "g", (m.OffsetDeleteRequestTopic("orders", (m.OffsetDeleteRequestPartition(0),)),)
    ),
    m.Api.INIT_PRODUCER_ID: m.InitProducerIdRequest("txn", 60_000, 1_000, 3),
    m.Api.DESCRIBE_PRODUCERS: m.DescribeProducersRequest((m.TopicRequest("orders", (0, 1)),)),
    m.Api.ADD_PARTITIONS_TO_TXN: m.AddPartitionsToTxnRequest(
        "txn", 1_000, 3, (m.AddPartitionsToTxnTopic("orders", (0, 2)),)
    ),
    m.Api.ADD_OFFSETS_TO_TXN: m.AddOffsetsToTxnRequest("txn", 1_000, 3, "g"),
    m.Api.END_TXN: m.EndTxnRequest("txn", 1_000, 3, True),
    m.Api.WRITE_TXN_MARKERS: m.WriteTxnMarkersRequest(
        (m.WritableTxnMarker(1_000, 3, False, (m.WritableTxnMarkerTopic("orders", (0, 2)),), 7),)
    ),
    m.Api.DESCRIBE_TRANSACTIONS: m.DescribeTransactionsRequest(("txn", "other")),
    m.Api.LIST_TRANSACTIONS: m.ListTransactionsRequest(("Ongoing",), (1_000,), 60_000),
    m.Api.FIND_COORDINATOR: m.FindCoordinatorRequest("txn", 1, ("txn", "other")),
    m.Api.JOIN_GROUP: m.JoinGroupRequest(
        "g",
        45_000,
        "m-1",
        "consumer",
        (m.JoinGroupRequestProtocol("range", SUBSCRIPTION), m.JoinGroupRequestProtocol("rr", b"")),
        rebalance_timeout=300_000,
        group_instance_id="i-1",
        reason="rebalance",
    ),
    m.Api.SYNC_GROUP: m.SyncGroupRequest(
        "g",
        5,
        "m-1",
        (m.SyncGroupRequestAssignment("m-1", ASSIGNMENT), m.SyncGroupRequestAssignment("m-2", b"")),
        "i-1",
        "consumer",
        "range",
    ),
    m.Api.HEARTBEAT: m.HeartbeatRequest("g", 5, "m-1", "i-1"),
    m.Api.LEAVE_GROUP: m.LeaveGroupRequest(
        "g", "m-1", (m.MemberIdentity("m-1", "i-1", "closing"), m.MemberIdentity("m-2"))
    ),
    m.Api.OFFSET_COMMIT: m.OffsetCommitRequest(
        "g",
        _COMMIT_TOPICS,
        5,
        "m-1",
        "i-1",
        86_400_000,
    ),
    m.Api.TXN_OFFSET_COMMIT: m.TxnOffsetCommitRequest(
        "txn",
        "g",
        1_000,
        3,
        _COMMIT_TOPICS,
        5,
        "m-1",
        "i-1",
    ),
    m.Api.OFFSET_FETCH: m.OffsetFetchRequest(
        "g",
        (m.OffsetFetchRequestTopic("orders", (0, 1)),),
        (
            m.OffsetFetchRequestGroup("g", (m.OffsetFetchRequestTopic("orders", (0, 1)),)),
            m.OffsetFetchRequestGroup("h", None),
        ),
        require_stable=True,
    ),
    m.Api.DESCRIBE_GROUPS: m.DescribeGroupsRequest(("g", "h"), True),
    m.Api.LIST_GROUPS: m.ListGroupsRequest(("Stable", "Empty")),
    m.Api.DELETE_GROUPS: m.DeleteGroupsRequest(("g", "h")),
    m.Api.PRODUCE: m.ProduceRequest(
        -1, 30_000, (m.TopicProduceData("orders", (m.PartitionProduceData(0, b"batch"),)),)
    ),
    m.Api.FETCH: m.FetchRequest(
        500,
        1,
        (m.FetchTopic("orders", (m.FetchPartition(0, 10, 1_048_576, 4, 0),)),),
        max_bytes=4_194_304,
        isolation_level=1,
    ),
}

_COMMITTED = m.OffsetFetchResponseTopic(
    "orders",
    (
        m.OffsetFetchResponsePartition(0, 0, 42, 3, "meta"),
        m.OffsetFetchResponsePartition(1, 0),  # nothing committed
        m.OffsetFetchResponsePartition(2, ErrorCode.UNSTABLE_OFFSET_COMMIT, metadata=None),
    ),
)
_PARTITION = m.MetadataResponsePartition(0, 0, 2, 7, (2, 1, 3), (2, 1), (3,))
RESPONSES: dict[m.Api, m.ResponseBody] = {
    m.Api.API_VERSIONS: m.ApiVersionsResponse(0, (m.ApiVersion(3, 0, 13),), 0),
    m.Api.METADATA: m.MetadataResponse(
        (m.MetadataResponseBroker(1, "127.0.0.2", 9092), m.MetadataResponseBroker(2, "h", 1)),
        (m.MetadataResponseTopic(0, "orders", TOPIC_ID, False, (_PARTITION,)),),
        "raftbroker",
        1,
    ),
    m.Api.DESCRIBE_CLUSTER: m.DescribeClusterResponse(
        0, "raftbroker", (m.DescribeClusterBroker(1, "127.0.0.2", 9092),), 1
    ),
    m.Api.DESCRIBE_CONFIGS: m.DescribeConfigsResponse(
        (
            m.DescribeConfigsResult(
                0,
                None,
                m.RESOURCE_TOPIC,
                "orders",
                (m.DescribeConfigsResourceResult("retention.ms", "60000", False, 1, False, (), 5),),
            ),
            m.DescribeConfigsResult(3, "no such topic", m.RESOURCE_TOPIC, "gone"),
        ),
        7,
    ),
    m.Api.CREATE_TOPICS: m.CreateTopicsResponse(
        (
            m.CreatableTopicResult(
                "orders", 36, "exists", TOPIC_ID, 3, 2, (m.CreatableTopicConfigs("a", "b"),)
            ),
        )
    ),
    m.Api.DELETE_TOPICS: m.DeleteTopicsResponse((m.DeletableTopicResult("orders", 0, TOPIC_ID),)),
    m.Api.LIST_OFFSETS: m.ListOffsetsResponse(
        (
            m.ListOffsetsTopicResponse(
                "orders", (m.ListOffsetsPartitionResponse(0, 0, 1_700_000_000_000, 42, 3),)
            ),
        )
    ),
    m.Api.OFFSET_FOR_LEADER_EPOCH: m.OffsetForLeaderEpochResponse(
        (
            m.OffsetForLeaderTopicResult(
                "orders",
                (
                    m.EpochEndOffset(0, 0, 3, 120),
                    m.EpochEndOffset(ErrorCode.FENCED_LEADER_EPOCH, 1),
                ),
            ),
        )
    ),
    m.Api.DELETE_RECORDS: m.DeleteRecordsResponse(
        (
            m.DeleteRecordsTopicResult(
                "orders",
                (
                    m.DeleteRecordsPartitionResult(0, 42, 0),
                    m.DeleteRecordsPartitionResult(1, -1, ErrorCode.OFFSET_OUT_OF_RANGE),
                ),
            ),
        )
    ),
    m.Api.INCREMENTAL_ALTER_CONFIGS: m.IncrementalAlterConfigsResponse(
        (
            m.AlterConfigsResourceResponse(0, None, m.RESOURCE_TOPIC, "orders"),
            m.AlterConfigsResourceResponse(ErrorCode.INVALID_CONFIG, "no", m.RESOURCE_TOPIC, "b"),
        )
    ),
    m.Api.OFFSET_DELETE: m.OffsetDeleteResponse(
        0,
        (
            m.OffsetDeleteResponseTopic(
                "orders",
                (m.OffsetDeleteResponsePartition(0, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC),),
            ),
        ),
    ),
    m.Api.INIT_PRODUCER_ID: m.InitProducerIdResponse(0, 1_000, 4),
    m.Api.DESCRIBE_PRODUCERS: m.DescribeProducersResponse(
        (
            m.TopicResponse(
                "orders", (m.PartitionResponse(0, 0, None, (m.ProducerState(7, 1, 9, 1_000),)),)
            ),
        )
    ),
    m.Api.ADD_PARTITIONS_TO_TXN: m.AddPartitionsToTxnResponse(
        (
            m.AddPartitionsToTxnTopicResult(
                "orders", (m.AddPartitionsToTxnPartitionResult(0, ErrorCode.INVALID_TXN_STATE),)
            ),
        ),
        10,
    ),
    m.Api.ADD_OFFSETS_TO_TXN: m.AddOffsetsToTxnResponse(ErrorCode.CONCURRENT_TRANSACTIONS, 10),
    m.Api.END_TXN: m.EndTxnResponse(ErrorCode.CONCURRENT_TRANSACTIONS, 10),
    m.Api.WRITE_TXN_MARKERS: m.WriteTxnMarkersResponse(
        (
            m.WritableTxnMarkerResult(
                1_000,
                (
                    m.WritableTxnMarkerTopicResult(
                        "orders",
                        (
                            m.WritableTxnMarkerPartitionResult(0, 0),
                            m.WritableTxnMarkerPartitionResult(2, ErrorCode.NOT_LEADER_OR_FOLLOWER),
                        ),
                    ),
                ),
            ),
        )
    ),
    m.Api.DESCRIBE_TRANSACTIONS: m.DescribeTransactionsResponse(
        (
            m.DescribedTransaction(
                0,
                "txn",
                "Ongoing",
                60_000,
                1_700_000_000_000,
                1_000,
                3,
                (m.TopicData("orders", (0, 2)),),
            ),
            m.DescribedTransaction(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, "other"),
        ),
        10,
    ),
    m.Api.LIST_TRANSACTIONS: m.ListTransactionsResponse(
        0, ("Nope",), (m.ListedTransaction("txn", 1_000, "Ongoing"),), 10
    ),
    m.Api.FIND_COORDINATOR: m.FindCoordinatorResponse(
        0, None, 1, "127.0.0.2", 9092, (m.Coordinator("txn", 1, "127.0.0.2", 9092, 0),)
    ),
    m.Api.JOIN_GROUP: m.JoinGroupResponse(
        0,
        5,
        "consumer",
        "range",
        "m-1",
        True,
        "m-1",
        (
            m.JoinGroupResponseMember("m-1", SUBSCRIPTION, "i-1"),
            m.JoinGroupResponseMember("m-2", b"\x00\x01", None),
        ),
        throttle_time=10,
    ),
    m.Api.SYNC_GROUP: m.SyncGroupResponse(0, ASSIGNMENT, "consumer", "range", 10),
    m.Api.HEARTBEAT: m.HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS, 10),
    m.Api.LEAVE_GROUP: m.LeaveGroupResponse(
        0,
        (
            m.MemberResponse("m-1", "i-1", 0),
            m.MemberResponse("m-2", None, ErrorCode.UNKNOWN_MEMBER_ID),
        ),
        10,
    ),
    m.Api.OFFSET_COMMIT: m.OffsetCommitResponse(
        (
            m.OffsetCommitResponseTopic(
                "orders",
                (
                    m.OffsetCommitResponsePartition(0, 0),
                    m.OffsetCommitResponsePartition(1, ErrorCode.OFFSET_METADATA_TOO_LARGE),
                ),
            ),
        ),
        10,
    ),
    m.Api.TXN_OFFSET_COMMIT: m.TxnOffsetCommitResponse(
        (
            m.OffsetCommitResponseTopic(
                "orders",
                (
                    m.OffsetCommitResponsePartition(0, 0),
                    m.OffsetCommitResponsePartition(1, ErrorCode.INVALID_PRODUCER_EPOCH),
                ),
            ),
        ),
        10,
    ),
    m.Api.OFFSET_FETCH: m.OffsetFetchResponse(
        (_COMMITTED,),
        ErrorCode.NONE,
        (
            m.OffsetFetchResponseGroup("g", 0, (_COMMITTED,)),
            m.OffsetFetchResponseGroup("h", ErrorCode.GROUP_ID_NOT_FOUND),
        ),
        10,
    ),
    m.Api.DESCRIBE_GROUPS: m.DescribeGroupsResponse(
        (
            m.DescribedGroup(
                "g",
                0,
                "Stable",
                "consumer",
                "range",
                (
                    m.DescribedGroupMember(
                        "m-1", "rdkafka", "/127.0.0.1", SUBSCRIPTION, ASSIGNMENT, "i-1"
                    ),
                    m.DescribedGroupMember("m-2", "kafka-python", "/127.0.0.2"),
                ),
                0b1_1000,
            ),
            m.DescribedGroup("h", ErrorCode.GROUP_ID_NOT_FOUND, "Dead"),
        ),
        10,
    ),
    m.Api.LIST_GROUPS: m.ListGroupsResponse(
        0, (m.ListedGroup("g", "consumer", "Stable"), m.ListedGroup("h", "", "Empty")), 10
    ),
    m.Api.DELETE_GROUPS: m.DeleteGroupsResponse(
        (m.DeletableGroupResult("g", 0), m.DeletableGroupResult("h", ErrorCode.NON_EMPTY_GROUP)),
        10,
    ),
    m.Api.PRODUCE: m.ProduceResponse(
        (
            m.TopicProduceResponse(
                "orders", (m.PartitionProduceResponse(0, 0, 17, 1_700_000_000_123, 0),)
            ),
        )
    ),
    m.Api.FETCH: m.FetchResponse(
        (m.FetchableTopicResponse("orders", (m.PartitionData(0, 0, 20, 20, 0, records=b"r"),)),)
    ),
}
