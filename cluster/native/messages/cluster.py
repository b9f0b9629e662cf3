"""The cluster's requests: Metadata (brokers, topics, partition leaders), CreateTopic,
DeleteTopic, and ClusterStatus (raftbroker's own: each node's Raft groups and their health).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cluster.native.messages.base import Op, Request, Response
from cluster.native.schema import (
    COUNT_RULE,
    LEADER_ID_RULE,
    NAME_RULE,
    NODE_ID_RULE,
    OFFSET_OR_NONE_RULE,
    OFFSET_RULE,
    TEXT_RULE,
    Struct,
    address_field,
    at_most,
    error_field,
    field_of,
    flag_field,
    int_field,
    many_field,
    name_field,
    partition_field,
    per_frame,
    per_request,
)
from statemachine.limits import DEFAULT_LIMITS
from statemachine.records import INT64_MAX

# Metadata


@dataclass(frozen=True, slots=True)
class BrokerAddress(Struct):
    node_id: int = field_of(NODE_ID_RULE)
    address: str = address_field()


@dataclass(frozen=True, slots=True)
class PartitionMetadata(Struct):
    partition: int = partition_field()
    leader_id: int = field_of(LEADER_ID_RULE)
    replicas: tuple[int, ...] = many_field(
        NODE_ID_RULE, at_most(DEFAULT_LIMITS.replication_factor_max)
    )
    term: int = int_field(-1, INT64_MAX)


@dataclass(frozen=True, slots=True)
class TopicMetadata(Struct):
    name: str = name_field()
    error: int = error_field()
    topic_id: int = int_field(-1, INT64_MAX)
    partitions: tuple[PartitionMetadata, ...] = many_field(
        PartitionMetadata, at_most(DEFAULT_LIMITS.partitions_per_topic_max)
    )


@dataclass(frozen=True, slots=True)
class MetadataResponse(Response):
    cluster_id: str = name_field()
    controller_id: int = field_of(LEADER_ID_RULE)
    brokers: tuple[BrokerAddress, ...] = many_field(
        BrokerAddress, at_most(DEFAULT_LIMITS.brokers_max)
    )
    topics: tuple[TopicMetadata, ...] = many_field(
        TopicMetadata, at_most(DEFAULT_LIMITS.topics_max)
    )


@dataclass(frozen=True, slots=True)
class Metadata(Request):
    """Brokers, the controller and the named topics (every topic when `topics` is empty)."""

    OP: ClassVar[Op] = Op.METADATA
    RESPONSE: ClassVar[type[Response]] = MetadataResponse
    topics: tuple[str, ...] = many_field(NAME_RULE, per_request)


# Topics


@dataclass(frozen=True, slots=True)
class CreateTopicResponse(Response):
    topic_id: int = field_of(OFFSET_RULE)


@dataclass(frozen=True, slots=True)
class CreateTopic(Request):
    """Retention of -1 keeps records forever (by time) or without a size bound."""

    OP: ClassVar[Op] = Op.CREATE_TOPIC
    RESPONSE: ClassVar[type[Response]] = CreateTopicResponse
    name: str = name_field()
    partitions: int = field_of(COUNT_RULE)
    replication_factor: int = field_of(COUNT_RULE)
    retention_ms: int = int_field(-1, INT64_MAX)
    retention_bytes: int = int_field(-1, INT64_MAX)


@dataclass(frozen=True, slots=True)
class DeleteTopicResponse(Response):
    pass


@dataclass(frozen=True, slots=True)
class DeleteTopic(Request):
    OP: ClassVar[Op] = Op.DELETE_TOPIC
    RESPONSE: ClassVar[type[Response]] = DeleteTopicResponse
    name: str = name_field()


# ClusterStatus


@dataclass(frozen=True, slots=True)
class NodeStatus(Struct):
    node_id: int = field_of(NODE_ID_RULE)
    address: str = address_field()
    reachable: bool = flag_field()


@dataclass(frozen=True, slots=True)
class RaftGroupReport(Struct):
    """One Raft group as this node sees it (`leader_id` -1 when unknown). `in_sync`: on its
    leader, the nodes whose replicas are in sync (Kafka's ISR), the leader first; empty
    elsewhere. The offsets are this replica's partition's (-1 for the metadata group)."""

    group: str = name_field()
    leader_id: int = field_of(LEADER_ID_RULE)
    term: int = int_field(0, INT64_MAX)
    commit_index: int = int_field(0, INT64_MAX)
    last_applied: int = int_field(0, INT64_MAX)
    is_leader: bool = flag_field()
    healthy: bool = flag_field()
    detail: str = field_of(TEXT_RULE)
    in_sync: tuple[int, ...] = many_field(NODE_ID_RULE, at_most(DEFAULT_LIMITS.brokers_max))
    log_start_offset: int = field_of(OFFSET_OR_NONE_RULE)
    high_watermark: int = field_of(OFFSET_OR_NONE_RULE)


@dataclass(frozen=True, slots=True)
class ClusterStatusResponse(Response):
    node_id: int = field_of(NODE_ID_RULE)
    nodes: tuple[NodeStatus, ...] = many_field(NodeStatus, at_most(DEFAULT_LIMITS.brokers_max))
    groups: tuple[RaftGroupReport, ...] = many_field(RaftGroupReport, per_frame)


@dataclass(frozen=True, slots=True)
class ClusterStatus(Request):
    OP: ClassVar[Op] = Op.CLUSTER_STATUS
    RESPONSE: ClassVar[type[Response]] = ClusterStatusResponse
