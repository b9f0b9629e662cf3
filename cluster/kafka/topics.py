"""Topics through Kafka's protocol: CreateTopics, DeleteTopics, creation on first use,
DeleteRecords, DescribeConfigs and IncrementalAlterConfigs.

Role: the topic administration of a node's Kafka listener (its frontend, frontend.py, hands
these requests here), proposing through the broker core (`Broker.create_topic`) as every
topic change is proposed: names, counts and placement are checked once, by the same rules as
the native `topic create`.

Rules:
- `-1` partitions or replication means the node's `[topics]` defaults (`default_partitions`,
  and `default_replication_factor` cut to the brokers registered), as Kafka's `num.partitions`
  and `default.replication.factor`; `validate_only` is honoured; replica assignments are
  refused (raftbroker places replicas); of the topic configs only `retention.ms` and
  `retention.bytes` are taken.
- Creation on first use (`auto_create`): with `[topics] auto_create` on, a Metadata request
  that allows it (`allow_auto_topic_creation`, always so before v4) creates each topic it
  names that does not exist, with the defaults, and answers it LEADER_NOT_AVAILABLE (Kafka's
  answer while a topic's partitions get their leaders: clients ask again). A name that is not a
  valid topic name is answered INVALID_TOPIC_EXCEPTION, and nothing is created.
- A topic's Kafka id (a UUID) is derived from the cluster id and its topic id, the same on
  every node.
- DescribeConfigs shows a topic's configs and a node's as the broker core lists them
  (cluster/broker/configs.py), for topics and brokers (this node: its id, or "" as Kafka's
  default resource); other resource types are INVALID_REQUEST, a topic that does not exist
  UNKNOWN_TOPIC_OR_PARTITION. `configuration_keys` picks some (an unknown key is left out, as
  Kafka leaves it out; null or empty: all, as Kafka's); synonyms and documentation are not
  kept, so none are sent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping

from cluster.broker.configs import (
    NO_RETENTION,
    ConfigChange,
    ConfigEntry,
    ConfigSource,
    node_configs,
    parse_retention,
    topic_configs,
)
from cluster.broker.core import Broker
from cluster.errors import RaftbrokerError, RequestRefusedError, quoted
from cluster.kafka import messages as m
from cluster.kafka.dispatch import Call, serves
from statemachine.errors import ErrorCode
from statemachine.metadata import BrokerInfo, TopicInfo, topic_name_error

RETENTION_CONFIGS = ("retention.ms", "retention.bytes")


def topic_uuid(cluster_id: str, topic_id: int) -> uuid.UUID:
    """The UUID Kafka clients know a topic by (Metadata v10+, CreateTopics v7, DeleteTopics
    v6): derived from the cluster id and the topic's id, so every node gives the same one; a
    name-based UUID, never Kafka's reserved zero or metadata-topic UUIDs."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"raftbroker:{cluster_id}:{topic_id}")


def by_uuid(cluster_id: str, topics: Mapping[str, TopicInfo]) -> dict[uuid.UUID, TopicInfo]:
    return {topic_uuid(cluster_id, t.topic_id): t for t in topics.values()}


class KafkaTopics:
    """CreateTopics, DeleteTopics, creation on first use, DeleteRecords, DescribeConfigs and
    IncrementalAlterConfigs, for one node's Kafka listener."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._limits = broker.node.limits
        self._cluster_id = broker.node.config.cluster_id
        self._defaults = broker.node.config.topics

    async def auto_create(
        self,
        names: Iterable[str],
        topics: Mapping[str, TopicInfo],
        registered: Mapping[int, BrokerInfo],
    ) -> list[m.MetadataResponseTopic]:
        """Each of `names` (topics that do not exist) created with the defaults, if this node
        creates topics on first use; else UNKNOWN_TOPIC_OR_PARTITION, as it always was."""
        answers = []
        for name in names:
            if not self._defaults.auto_create:
                answers.append(m.MetadataResponseTopic(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name))
                continue
            created = await self._create(m.CreatableTopic(name, -1, -1), False, topics, registered)
            error = created.error_code
            if error in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):  # made, or by a racer
                error = ErrorCode.LEADER_NOT_AVAILABLE
            answers.append(m.MetadataResponseTopic(error, name, created.topic_id))
        return answers

    @serves(m.CreateTopicsRequest)
    async def create_topics(
        self, request: m.CreateTopicsRequest, _call: Call
    ) -> m.CreateTopicsResponse:
        topics, registered = await self.broker.topics_and_brokers()
        names = [t.name for t in request.topics]
        results = []
        for asked in request.topics:
            if names.count(asked.name) > 1:
                problem = f"topic {quoted(asked.name)} is named more than once in the request"
                results.append(_created(asked.name, ErrorCode.INVALID_REQUEST, problem))
                continue
            results.append(await self._create(asked, request.validate_only, topics, registered))
        return m.CreateTopicsResponse(tuple(results))

    async def _create(
        self,
        asked: m.CreatableTopic,
        validate_only: bool,
        topics: Mapping[str, TopicInfo],
        registered: Mapping[int, BrokerInfo],
    ) -> m.CreatableTopicResult:
        partitions = asked.num_partitions
        if partitions == -1:
            partitions = self._defaults.default_partitions
        replication = asked.replication_factor
        if replication == -1:
            replication = min(self._defaults.default_replication_factor, max(len(registered), 1))
        topic_id: uuid.UUID | None = None
        given = {c.name for c in asked.configs}
        try:
            retention_ms, retention_bytes = _retention(asked.configs)
            self._check_creatable(asked, partitions, replication, topics, registered)
            if not validate_only:
                created = await self.broker.create_topic(
                    asked.name, partitions, replication, retention_ms, retention_bytes
                )
                topic_id = topic_uuid(self._cluster_id, created)
        except RaftbrokerError as exc:
            return _created(asked.name, exc.error, exc.message)
        configs = tuple(
            m.CreatableTopicConfigs(
                name,
                str(value),
                # As DescribeConfigs' sources, which CreateTopics v5+ reports of a new topic.
                config_source=ConfigSource.TOPIC if name in given else ConfigSource.DEFAULT,
            )
            for name, value in zip(RETENTION_CONFIGS, (retention_ms, retention_bytes), strict=True)
        )
        return m.CreatableTopicResult(
            asked.name, ErrorCode.NONE, None, topic_id, partitions, replication, configs
        )

    def _check_creatable(
        self,
        asked: m.CreatableTopic,
        partitions: int,
        replication: int,
        topics: Mapping[str, TopicInfo],
        registered: Mapping[int, BrokerInfo],
    ) -> None:
        """What the metadata machine would refuse, said before anything is proposed (and all a
        validate_only request is answered with)."""
        limits = self._limits
        problem = topic_name_error(asked.name, limits)
        if problem:
            raise RequestRefusedError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if asked.assignments:
            raise RequestRefusedError(
                ErrorCode.INVALID_REQUEST,
                "replica assignments are not supported: raftbroker places replicas itself",
            )
        if asked.name in topics:
            raise RequestRefusedError(
                ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {quoted(asked.name)} already exists"
            )
        if not 1 <= partitions <= limits.partitions_per_topic_max:
            raise RequestRefusedError(
                ErrorCode.INVALID_PARTITIONS,
                f"a topic has 1 to {limits.partitions_per_topic_max} partitions, not {partitions}",
            )
        most = min(len(registered), limits.replication_factor_max)
        if not 1 <= replication <= most:
            raise RequestRefusedError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {replication}: this cluster allows 1 to {most}",
            )

    @serves(m.DeleteTopicsRequest)
    async def delete_topics(
        self, request: m.DeleteTopicsRequest, _call: Call
    ) -> m.DeleteTopicsResponse:
        topics, _registered = await self.broker.topics_and_brokers()
        asked = [m.DeleteTopicState(name) for name in request.topic_names] + list(request.topics)
        ids = by_uuid(self._cluster_id, topics) if any(a.name is None for a in asked) else {}
        results = []
        for one in asked:
            topic = topics.get(one.name) if one.name is not None else None
            if one.name is None and one.topic_id is not None:
                topic = ids.get(one.topic_id)
                if topic is None:
                    results.append(
                        m.DeletableTopicResult(None, ErrorCode.UNKNOWN_TOPIC_ID, one.topic_id)
                    )
                    continue
            results.append(await self._delete(one, topic))
        return m.DeleteTopicsResponse(tuple(results))

    @serves(m.DeleteRecordsRequest)
    async def delete_records(
        self, request: m.DeleteRecordsRequest, _call: Call
    ) -> m.DeleteRecordsResponse:
        """Each partition's log start moved by its leader (`Broker.delete_records`), all of
        them at once, each within the request's timeout."""
        timeout_s = self.broker.timeout_s(request.timeout)
        async with asyncio.TaskGroup() as group:
            tasks = [
                [
                    group.create_task(
                        self.broker.delete_records(t.name, p.partition_index, p.offset, timeout_s)
                    )
                    for p in t.partitions
                ]
                for t in request.topics
            ]
        return m.DeleteRecordsResponse(
            tuple(
                m.DeleteRecordsTopicResult(
                    t.name,
                    tuple(
                        m.DeleteRecordsPartitionResult(p.partition_index, *_low_watermark(task))
                        for p, task in zip(t.partitions, row, strict=True)
                    ),
                )
                for t, row in zip(request.topics, tasks, strict=True)
            )
        )

    @serves(m.IncrementalAlterConfigsRequest)
    async def alter_configs(
        self, request: m.IncrementalAlterConfigsRequest, _call: Call
    ) -> m.IncrementalAlterConfigsResponse:
        """Each resource's changes, one after the other: a topic's through the broker core
        (`Broker.alter_topic_configs`: which configs may change); a node's configs are its
        configuration file's, refused."""
        answers = []
        for resource in request.resources:
            error, message = ErrorCode.NONE, None
            try:
                await self._alter(resource, request.validate_only)
            except RaftbrokerError as exc:
                error, message = exc.error, exc.message
            answers.append(
                m.AlterConfigsResourceResponse(
                    error, message, resource.resource_type, resource.resource_name
                )
            )
        return m.IncrementalAlterConfigsResponse(tuple(answers))

    async def _alter(self, resource: m.AlterConfigsResource, validate_only: bool) -> None:
        if resource.resource_type == m.RESOURCE_BROKER:
            raise RequestRefusedError(
                ErrorCode.INVALID_REQUEST, "a node's configs are set in its configuration file"
            )
        if resource.resource_type != m.RESOURCE_TOPIC:
            raise RequestRefusedError(
                ErrorCode.INVALID_REQUEST, "only topics have configs to alter"
            )
        changes = [ConfigChange(c.name, c.config_operation, c.value) for c in resource.configs]
        await self.broker.alter_topic_configs(
            resource.resource_name, changes, validate_only=validate_only
        )

    @serves(m.DescribeConfigsRequest)
    async def describe_configs(
        self, request: m.DescribeConfigsRequest, _call: Call
    ) -> m.DescribeConfigsResponse:
        topics, _registered = await self.broker.topics_and_brokers()
        return m.DescribeConfigsResponse(tuple(self._configs(r, topics) for r in request.resources))

    def _configs(
        self, resource: m.DescribeConfigsResource, topics: Mapping[str, TopicInfo]
    ) -> m.DescribeConfigsResult:
        batch_bytes_max = self._limits.batch_bytes_max
        name = resource.resource_name
        if resource.resource_type == m.RESOURCE_TOPIC:
            topic = topics.get(name)
            if topic is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                return _undescribed(resource, error, f"topic {quoted(name)} does not exist")
            return _described(resource, topic_configs(topic, batch_bytes_max))
        if resource.resource_type == m.RESOURCE_BROKER:
            node_id = str(self.broker.node.config.node_id)
            if name not in ("", node_id):
                problem = f"this is broker {node_id}: ask broker {quoted(name)} for its configs"
                return _undescribed(resource, ErrorCode.INVALID_REQUEST, problem)
            return _described(resource, node_configs(self._defaults, batch_bytes_max))
        problem = f"configs of resource type {resource.resource_type}: only topics and brokers"
        return _undescribed(resource, ErrorCode.INVALID_REQUEST, problem)

    async def _delete(
        self, asked: m.DeleteTopicState, topic: TopicInfo | None
    ) -> m.DeletableTopicResult:
        if topic is None:
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return m.DeletableTopicResult(asked.name, error, asked.topic_id, "no such topic")
        topic_id = topic_uuid(self._cluster_id, topic.topic_id)
        try:
            await self.broker.delete_topic(topic.name)
        except RaftbrokerError as exc:
            return m.DeletableTopicResult(topic.name, exc.error, topic_id, exc.message)
        return m.DeletableTopicResult(topic.name, ErrorCode.NONE, topic_id)


def _described(
    resource: m.DescribeConfigsResource, entries: tuple[ConfigEntry, ...]
) -> m.DescribeConfigsResult:
    keys = resource.configuration_keys
    chosen = tuple(e for e in entries if e.name in keys) if keys else entries  # none: all
    configs = tuple(
        m.DescribeConfigsResourceResult(
            e.name, e.value, e.read_only, int(e.source), config_type=int(e.type)
        )
        for e in chosen
    )
    return m.DescribeConfigsResult(
        ErrorCode.NONE, None, resource.resource_type, resource.resource_name, configs
    )


def _undescribed(
    resource: m.DescribeConfigsResource, error: ErrorCode, message: str
) -> m.DescribeConfigsResult:
    return m.DescribeConfigsResult(error, message, resource.resource_type, resource.resource_name)


def _created(name: str, error: ErrorCode, message: str) -> m.CreatableTopicResult:
    return m.CreatableTopicResult(name, error, message)


def _retention(configs: tuple[m.CreatableTopicConfig, ...]) -> tuple[int, int]:
    """retention.ms and retention.bytes of a new topic (-1: none); any other config refused."""
    values = dict.fromkeys(RETENTION_CONFIGS, NO_RETENTION)
    for config in configs:
        if config.name not in values:
            raise RequestRefusedError(
                ErrorCode.INVALID_CONFIG,
                f"config {quoted(config.name)} is not supported "
                f"(only {', '.join(RETENTION_CONFIGS)})",
            )
        value = parse_retention(config.name, config.value)
        if isinstance(value, str):
            raise RequestRefusedError(ErrorCode.INVALID_CONFIG, value)
        values[config.name] = value
    return values["retention.ms"], values["retention.bytes"]


def _low_watermark(task: asyncio.Task[tuple[ErrorCode, int, str]]) -> tuple[int, ErrorCode]:
    """A DeleteRecords partition's new log start and error (Kafka sends no leader hint)."""
    error, log_start, _hint = task.result()
    return log_start, error
