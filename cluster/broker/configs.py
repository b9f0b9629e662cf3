"""A topic's and a node's configuration, by Kafka's names: what a client that describes configs
is shown, whichever listener it asks.

Role: the broker core's one list of the configs a topic has, each a value as text, where the
value comes from and whether it can be changed; the Kafka listener's DescribeConfigs only
translates it. The rules:
- `retention.ms` and `retention.bytes` are the topic's own (set when it was created) or the
  default, -1: keep everything (Kafka's `retention.ms` defaults to 7 days; raftbroker keeps
  a topic's records unless it is given a retention).
- The rest is what raftbroker does for every topic, shown so that tools which read them see
  the truth, and read-only: `cleanup.policy` is `delete` (no compaction); `min.insync.replicas`
  is a majority of the topic's replicas (a write is acknowledged once a Raft majority holds
  it: 2 of 3, 3 of 5); `max.message.bytes` is the largest record batch a node takes
  (`batch_bytes_max`); `message.timestamp.type` is CreateTime (records keep the producer's
  timestamps; the store indexes its own append time besides); `compression.type` is
  `producer` (batches are stored as they come).
- A node's own: the topic defaults of its `[topics]` table and the same batch limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from cluster.config import Topics
from statemachine.metadata import TopicInfo

NO_RETENTION = -1


class ConfigSource(IntEnum):
    """Where a value comes from (Kafka's DescribeConfigs ConfigSource numbers)."""

    TOPIC = 1  # set on the topic
    STATIC_BROKER = 4  # the node's configuration file
    DEFAULT = 5  # the default


class ConfigType(IntEnum):
    """A value's type (Kafka's DescribeConfigs ConfigType numbers)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    LIST = 7


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str
    source: ConfigSource
    read_only: bool
    type: ConfigType


def topic_configs(topic: TopicInfo, batch_bytes_max: int) -> tuple[ConfigEntry, ...]:
    """Every config of `topic`, in Kafka's names (see the module's rules)."""

    def retention(name: str, value: int) -> ConfigEntry:
        source = ConfigSource.DEFAULT if value == NO_RETENTION else ConfigSource.TOPIC
        # Read-only until a topic's configs can be altered after its creation.
        return ConfigEntry(name, str(value), source, True, ConfigType.LONG)

    majority = len(topic.replicas[0]) // 2 + 1 if topic.replicas else 1
    fixed = ConfigSource.DEFAULT
    return (
        retention("retention.ms", topic.retention_ms),
        retention("retention.bytes", topic.retention_bytes),
        ConfigEntry("cleanup.policy", "delete", fixed, True, ConfigType.LIST),
        ConfigEntry("min.insync.replicas", str(majority), fixed, True, ConfigType.INT),
        ConfigEntry(
            "max.message.bytes",
            str(batch_bytes_max),
            ConfigSource.STATIC_BROKER,
            True,
            ConfigType.INT,
        ),
        ConfigEntry("message.timestamp.type", "CreateTime", fixed, True, ConfigType.STRING),
        ConfigEntry("compression.type", "producer", fixed, True, ConfigType.STRING),
    )


def node_configs(topics: Topics, batch_bytes_max: int) -> tuple[ConfigEntry, ...]:
    """A node's configs that Kafka's clients know by name (its `[topics]` table, its limits)."""
    static = ConfigSource.STATIC_BROKER
    return (
        ConfigEntry(
            "auto.create.topics.enable",
            str(topics.auto_create).lower(),
            static,
            True,
            ConfigType.BOOLEAN,
        ),
        ConfigEntry("num.partitions", str(topics.default_partitions), static, True, ConfigType.INT),
        ConfigEntry(
            "default.replication.factor",
            str(topics.default_replication_factor),
            static,
            True,
            ConfigType.INT,
        ),
        ConfigEntry("message.max.bytes", str(batch_bytes_max), static, True, ConfigType.INT),
        ConfigEntry("log.cleanup.policy", "delete", ConfigSource.DEFAULT, True, ConfigType.LIST),
    )
