"""Topics: CreateTopics (19) and DeleteTopics (20).

Part of the Kafka messages (cluster/kafka/messages/__init__.py has their rules): each request
class names its API, the versions served, its response and how it is refused whole.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from cluster.kafka.messages.base import NO_TOPIC_ID, Api, Request, Response, VersionRange

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
class CreateTopicsResponse(Response):
    topics: tuple[CreatableTopicResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeleteTopicState:
    name: str | None = None
    topic_id: uuid.UUID | None = NO_TOPIC_ID


@dataclass(frozen=True, slots=True)
class DeletableTopicResult:
    name: str | None
    error_code: int
    topic_id: uuid.UUID | None = NO_TOPIC_ID
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse(Response):
    responses: tuple[DeletableTopicResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest(Request):
    API = Api.CREATE_TOPICS
    VERSIONS = VersionRange(2, 7)
    RESPONSE = CreateTopicsResponse

    topics: tuple[CreatableTopic, ...]
    timeout: int = 60_000
    validate_only: bool = False

    def refusal(self, code: int, message: str) -> CreateTopicsResponse:
        return CreateTopicsResponse(
            tuple(CreatableTopicResult(t.name, code, message) for t in self.topics)
        )


@dataclass(frozen=True, slots=True)
class DeleteTopicsRequest(Request):
    API = Api.DELETE_TOPICS
    VERSIONS = VersionRange(1, 6)
    RESPONSE = DeleteTopicsResponse

    topic_names: tuple[str, ...] = ()  # v1-v5
    topics: tuple[DeleteTopicState, ...] = ()  # v6: by name or by topic id
    timeout: int = 0

    def refusal(self, code: int, message: str) -> DeleteTopicsResponse:
        named = [DeleteTopicState(n) for n in self.topic_names] + list(self.topics)
        return DeleteTopicsResponse(
            tuple(DeletableTopicResult(t.name, code, t.topic_id, message) for t in named)
        )
