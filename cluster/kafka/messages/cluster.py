"""The cluster as clients see it: ApiVersions (18), Metadata (3), DescribeCluster (60),
FindCoordinator (10).

Part of the Kafka messages (cluster/kafka/messages/__init__.py has their rules): each request
class names its API, the versions served, its response and how it is refused whole.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from cluster.kafka.messages.base import NO_TOPIC_ID, Api, Request, Response, VersionRange

# -- ApiVersions (18) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApiVersion:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse(Response):
    error_code: int
    api_keys: tuple[ApiVersion, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest(Request):
    API = Api.API_VERSIONS
    VERSIONS = VersionRange(0, 3)
    RESPONSE = ApiVersionsResponse

    client_software_name: str = ""
    client_software_version: str = ""

    def refusal(self, code: int, message: str) -> ApiVersionsResponse:  # noqa: ARG002
        return ApiVersionsResponse(code, ())


# -- Metadata (3) --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataRequestTopic:
    name: str | None = None
    topic_id: uuid.UUID | None = None


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
class MetadataResponse(Response):
    brokers: tuple[MetadataResponseBroker, ...]
    topics: tuple[MetadataResponseTopic, ...]
    cluster_id: str | None = None
    controller_id: int = -1
    error_code: int = 0
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class MetadataRequest(Request):
    API = Api.METADATA
    VERSIONS = VersionRange(0, 13)
    RESPONSE = MetadataResponse

    # None: every topic (v1+); in v0 an empty list means every topic.
    topics: tuple[MetadataRequestTopic, ...] | None = None
    allow_auto_topic_creation: bool = True
    include_cluster_authorized_operations: bool = False
    include_topic_authorized_operations: bool = False

    def refusal(self, code: int, message: str) -> MetadataResponse:  # noqa: ARG002
        # A name the request left null is answered "", as Kafka's error response does (a null
        # name is allowed in no answer before v12).
        failed = tuple(
            MetadataResponseTopic(code, t.name or "", t.topic_id) for t in self.topics or ()
        )
        return MetadataResponse((), failed, error_code=code)


# -- DescribeCluster (60) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DescribeClusterBroker:
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    is_fenced: bool = False


@dataclass(frozen=True, slots=True)
class DescribeClusterResponse(Response):
    error_code: int
    cluster_id: str
    brokers: tuple[DescribeClusterBroker, ...] = ()
    controller_id: int = -1
    error_message: str | None = None
    endpoint_type: int = 1
    cluster_authorized_operations: int = -(2**31)
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribeClusterRequest(Request):
    API = Api.DESCRIBE_CLUSTER
    VERSIONS = VersionRange(0, 2)
    RESPONSE = DescribeClusterResponse

    include_cluster_authorized_operations: bool = False
    endpoint_type: int = 1
    include_fenced_brokers: bool = False

    def refusal(self, code: int, message: str) -> DescribeClusterResponse:
        return DescribeClusterResponse(code, "", error_message=message)


# -- FindCoordinator (10) ------------------------------------------------------------------------


COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1


@dataclass(frozen=True, slots=True)
class Coordinator:
    key: str
    node_id: int
    host: str
    port: int
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Response):
    # v0-v3 answer one key in these fields; v4+ answer every key in `coordinators`.
    error_code: int = 0
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1
    coordinators: tuple[Coordinator, ...] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest(Request):
    API = Api.FIND_COORDINATOR
    VERSIONS = VersionRange(0, 6)
    RESPONSE = FindCoordinatorResponse

    key: str = ""  # v0-v3: one key
    key_type: int = COORDINATOR_GROUP  # v1+
    coordinator_keys: tuple[str, ...] = ()  # v4+: several keys at once

    def refusal(self, code: int, message: str) -> FindCoordinatorResponse:
        keys = self.coordinator_keys or (self.key,)
        return FindCoordinatorResponse(
            code,
            message,
            coordinators=tuple(Coordinator(k, -1, "", -1, code, message) for k in keys),
        )
