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

Changes (IncrementalAlterConfigs, `altered`): a topic's retention may be set or deleted (back
to the default, -1); every other config may be "set" to the value it has or deleted (no
change), and any other value is INVALID_CONFIG naming what raftbroker does instead (e.g.
`cleanup.policy=compact`: no compaction). APPEND and SUBTRACT apply to `cleanup.policy`, the
one list, on the same terms. A config named twice, or one unknown, refuses the whole change.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

from cluster.config import Topics
from statemachine.errors import ErrorCode
from statemachine.metadata import TopicInfo

NO_RETENTION = -1
INT64_MAX = 2**63 - 1
_INTEGER = re.compile(r"-?[0-9]{1,19}")  # Java's Long.parseLong, less its leading "+"


class ConfigSource(IntEnum):
    """Where a value comes from (Kafka's DescribeConfigs ConfigSource numbers)."""

    TOPIC = 1  # set on the topic
    STATIC_BROKER = 4  # the node's configuration file
    DEFAULT = 5  # the default


class ConfigOperation(IntEnum):
    """IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType numbers)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


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
        return ConfigEntry(name, str(value), source, False, ConfigType.LONG)

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


@dataclass(frozen=True, slots=True)
class ConfigChange:
    name: str
    operation: int  # a ConfigOperation, as the client sent it
    value: str | None


def altered(
    topic: TopicInfo, changes: Sequence[ConfigChange], batch_bytes_max: int
) -> TopicInfo | tuple[ErrorCode, str]:
    """`topic` with `changes` made (see the module's rules), or why not."""
    names = [c.name for c in changes]
    if len(set(names)) != len(names):
        return ErrorCode.INVALID_REQUEST, "a config is named more than once"
    current = {e.name: e for e in topic_configs(topic, batch_bytes_max)}
    retention = {"retention.ms": topic.retention_ms, "retention.bytes": topic.retention_bytes}
    for change in changes:
        entry = current.get(change.name)
        if change.operation not in tuple(ConfigOperation):
            return ErrorCode.INVALID_REQUEST, f"unknown config operation {change.operation}"
        if entry is None:
            return ErrorCode.INVALID_CONFIG, f"unknown topic config {change.name!r}"
        value = _changed(entry, change)
        if isinstance(value, str):  # why not
            return ErrorCode.INVALID_CONFIG, value
        if value is not None:  # only a retention has a new value
            retention[change.name] = value
    return replace(
        topic, retention_ms=retention["retention.ms"], retention_bytes=retention["retention.bytes"]
    )


def parse_retention(name: str, text: str | None) -> int | str:
    """A retention config's value (-1: no limit), or why it is not one: the one rule for
    CreateTopics and IncrementalAlterConfigs alike."""
    if text is None or not _INTEGER.fullmatch(text) or int(text) > INT64_MAX:
        return f"{name} must be an integer from -1 to {INT64_MAX} (-1: no limit), got {text!r}"
    value = int(text)
    return value if value >= NO_RETENTION else f"{name} must be -1 or more, got {value}"


def _changed(entry: ConfigEntry, change: ConfigChange) -> int | str | None:
    """A retention's new value (an int), None for a config left as it is, or why not (a
    str)."""
    op, value, name = change.operation, change.value, entry.name
    if op in (ConfigOperation.APPEND, ConfigOperation.SUBTRACT) and entry.type != ConfigType.LIST:
        return f"{name} is not a list: APPEND and SUBTRACT apply to lists only"
    if not entry.read_only:  # a retention
        return NO_RETENTION if op == ConfigOperation.DELETE else parse_retention(name, value)
    if op == ConfigOperation.DELETE or (value == entry.value) != (op == ConfigOperation.SUBTRACT):
        return None  # what raftbroker does already (a SUBTRACT of another value: nothing)
    return f"{name} is always {entry.value} in raftbroker: {_WHY.get(name, 'fixed')}"


_WHY = {
    "cleanup.policy": "records are deleted by retention, never compacted",
    "min.insync.replicas": "a write is acknowledged once a Raft majority of the replicas holds it",
    "max.message.bytes": "the nodes' batch_bytes_max limit",
    "message.timestamp.type": "records keep their producers' timestamps",
    "compression.type": "batches are stored as their producers compressed them",
}
