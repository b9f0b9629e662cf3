"""Configs: DescribeConfigs (32), IncrementalAlterConfigs (44).

Part of the Kafka messages (cluster/kafka/messages/__init__.py has their rules): each request
class names its API, the versions served, its response and how it is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.kafka.messages.base import Api, Request, Response, VersionRange

# DescribeConfigs' resource types (Kafka's ConfigResource.Type).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


@dataclass(frozen=True, slots=True)
class DescribeConfigsResource:
    resource_type: int
    resource_name: str
    configuration_keys: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class DescribeConfigsSynonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class DescribeConfigsResourceResult:
    name: str
    value: str | None
    read_only: bool
    config_source: int = -1
    is_sensitive: bool = False
    synonyms: tuple[DescribeConfigsSynonym, ...] = ()
    config_type: int = 0
    documentation: str | None = None


@dataclass(frozen=True, slots=True)
class DescribeConfigsResult:
    error_code: int
    error_message: str | None
    resource_type: int
    resource_name: str
    configs: tuple[DescribeConfigsResourceResult, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeConfigsResponse(Response):
    results: tuple[DescribeConfigsResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribeConfigsRequest(Request):
    API = Api.DESCRIBE_CONFIGS
    VERSIONS = VersionRange(1, 4)
    RESPONSE = DescribeConfigsResponse

    resources: tuple[DescribeConfigsResource, ...] = ()
    include_synonyms: bool = False
    include_documentation: bool = False

    def refusal(self, code: int, message: str) -> DescribeConfigsResponse:
        return DescribeConfigsResponse(
            tuple(
                DescribeConfigsResult(code, message, r.resource_type, r.resource_name)
                for r in self.resources
            )
        )


# -- IncrementalAlterConfigs (44) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlterableConfig:
    name: str
    config_operation: int
    value: str | None


@dataclass(frozen=True, slots=True)
class AlterConfigsResource:
    resource_type: int
    resource_name: str
    configs: tuple[AlterableConfig, ...]


@dataclass(frozen=True, slots=True)
class AlterConfigsResourceResponse:
    error_code: int
    error_message: str | None
    resource_type: int
    resource_name: str


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsResponse(Response):
    responses: tuple[AlterConfigsResourceResponse, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsRequest(Request):
    API = Api.INCREMENTAL_ALTER_CONFIGS
    VERSIONS = VersionRange(0, 1)
    RESPONSE = IncrementalAlterConfigsResponse

    resources: tuple[AlterConfigsResource, ...] = ()
    validate_only: bool = False

    def refusal(self, code: int, message: str) -> IncrementalAlterConfigsResponse:
        return IncrementalAlterConfigsResponse(
            tuple(
                AlterConfigsResourceResponse(code, message, r.resource_type, r.resource_name)
                for r in self.resources
            )
        )
