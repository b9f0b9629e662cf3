"""Parsing and validation of the data source's options, without PySpark or a network.

Role: turn the option map Spark hands a data source into frozen, picklable records
(`ReadOptions`, `WriteOptions`) and fail early with a message that names the option.

Rules:
- Spark passes options lower-cased in a case-insensitive dict. It is never copied into a plain
  dict; every key is looked up case-insensitively (`option()`), so a plain dict works too.
- Names and meanings follow Spark's Kafka connector: `raftbroker.bootstrap.servers`, exactly
  one of `subscribe` / `subscribePattern` / `assign`, `startingOffsets` / `endingOffsets`
  (`earliest`, `latest`, or JSON `{"topic": {"0": 23, "1": -2}}` with -2 earliest and
  -1 latest), `maxOffsetsPerTrigger`, `minOffsetsPerTrigger`, `maxTriggerDelay`,
  `minPartitions`, `failOnDataLoss`, `includeHeaders`, `raftbroker.isolation.level`
  (`read_committed`, the default, or `read_uncommitted`); for writes, `topic` and
  `raftbroker.transactional.id.prefix` (with `raftbroker.transaction.timeout.ms`).
- As in the Kafka connector, batch reads refuse `latest` as a start and `earliest` as an end,
  and streaming reads refuse `endingOffsets`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from cluster.addresses import parse_address

EARLIEST = -2  # Kafka's (and the native protocol's) markers inside offset JSON
LATEST = -1
BOOTSTRAP = "raftbroker.bootstrap.servers"
# Set by `pipeline.sink.fenced_foreach_batch`, not by hand: a batch write as a stream's batch.
FENCE_SINK = "raftbroker.fence.sinkId"
FENCE_BATCH = "raftbroker.fence.batchId"
REQUEST_TIMEOUT = "raftbroker.request.timeout.ms"
# read_committed (the default): no record of an aborted transaction, none past an open one;
# read_uncommitted: every record (Spark's Kafka connector: `kafka.isolation.level`).
ISOLATION_LEVEL = "raftbroker.isolation.level"
# Writes in transactions: each task's rows one transaction of id PREFIX/[query id/]task
# partition (pipeline/sink.py, "Guarantees").
TXN_PREFIX = "raftbroker.transactional.id.prefix"
TXN_PREFIX_CHARS_MAX = 180  # room left in a transactional id (249) for a query id and a task
# How long a task's prepared transaction may wait for the driver's commit (the broker caps it:
# transaction_timeout_ms_max, 15 min by default).
TXN_TIMEOUT = "raftbroker.transaction.timeout.ms"
DEFAULT_TXN_TIMEOUT_MS = 600_000
SUBSCRIPTIONS = ("subscribe", "subscribePattern", "assign")
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Kafka connector's default

TopicPartition = tuple[str, int]


class OptionError(ValueError):
    """An option is missing, malformed or not allowed here; the message names it."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which topic-partitions to read: named topics, a topic-name regex, or fixed partitions."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None  # Kafka: Matcher.matches()
        if self.kind == "subscribe":
            return topic in self.topics
        return any(t == topic for t, _ in self.assigned)


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """`earliest`, `latest`, or per-partition offsets (which may hold EARLIEST / LATEST)."""

    default: int  # EARLIEST or LATEST, used when `specific` is None
    specific: tuple[tuple[TopicPartition, int], ...] | None = None

    def as_dict(self) -> dict[TopicPartition, int] | None:
        return None if self.specific is None else dict(self.specific)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    bootstrap: tuple[str, ...]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    request_timeout_s: float
    read_committed: bool = True


@dataclass(frozen=True, slots=True)
class WriteOptions:
    bootstrap: tuple[str, ...]
    topic: str | None  # overrides a `topic` column, as in the Kafka connector
    request_timeout_s: float
    linger_ms: float
    # A batch write that is one micro-batch of a stream (`fenced_foreach_batch`): fenced writes.
    fence: tuple[str, int] | None = None  # (sink id, batch id)
    txn_prefix: str | None = None  # TXN_PREFIX: each task's rows in one transaction
    txn_timeout_ms: int = DEFAULT_TXN_TIMEOUT_MS


def option(options: Mapping[str, str], name: str) -> str | None:
    """The value of `name`, whatever the case of the key in `options`."""
    value = options.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    return next((v for k, v in options.items() if k.lower() == lowered), None)


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    starting = _offset_spec(options, "startingOffsets", LATEST if streaming else EARLIEST)
    if streaming and option(options, "endingOffsets") is not None:
        raise OptionError("endingOffsets is not allowed in a streaming read (batch reads only)")
    ending = _offset_spec(options, "endingOffsets", LATEST)
    if not streaming:
        _refuse_marker(starting, LATEST, "startingOffsets", "latest")
        _refuse_marker(ending, EARLIEST, "endingOffsets", "earliest")
    subscription = _subscription(options)
    for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        _check_covered(name, spec, subscription)
    max_per_trigger = _positive_int(options, "maxOffsetsPerTrigger")
    min_per_trigger = _positive_int(options, "minOffsetsPerTrigger")
    if max_per_trigger and min_per_trigger and min_per_trigger > max_per_trigger:
        raise OptionError(
            f"minOffsetsPerTrigger ({min_per_trigger}) is larger than "
            f"maxOffsetsPerTrigger ({max_per_trigger})"
        )
    return ReadOptions(
        bootstrap=_bootstrap(options),
        subscription=subscription,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=_positive_int(options, "minPartitions"),
        fail_on_data_loss=_bool(options, "failOnDataLoss", default=True),
        include_headers=_bool(options, "includeHeaders", default=False),
        request_timeout_s=_request_timeout_s(options),
        read_committed=_read_committed(options),
    )


def _read_committed(options: Mapping[str, str]) -> bool:
    raw = (option(options, ISOLATION_LEVEL) or "read_committed").strip().lower()
    if raw not in ("read_committed", "read_uncommitted"):
        raise OptionError(
            f"{ISOLATION_LEVEL}: expected read_committed or read_uncommitted, got '{raw}'"
        )
    return raw == "read_committed"


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    topic = option(options, "topic")
    if topic is not None and not topic.strip():
        raise OptionError("topic must not be empty")
    linger = option(options, "raftbroker.linger.ms")
    return WriteOptions(
        bootstrap=_bootstrap(options),
        topic=topic.strip() if topic is not None else None,
        request_timeout_s=_request_timeout_s(options),
        linger_ms=_number(linger, "raftbroker.linger.ms") if linger is not None else 5.0,
        fence=_fence(options),
        txn_prefix=_txn_prefix(options),
        txn_timeout_ms=_positive_int(options, TXN_TIMEOUT) or DEFAULT_TXN_TIMEOUT_MS,
    )


def _txn_prefix(options: Mapping[str, str]) -> str | None:
    raw = option(options, TXN_PREFIX)
    if raw is None:
        return None
    if not raw.strip() or len(raw) > TXN_PREFIX_CHARS_MAX:
        raise OptionError(f"{TXN_PREFIX}: 1 to {TXN_PREFIX_CHARS_MAX} characters, got {raw!r}")
    return raw.strip()


def _fence(options: Mapping[str, str]) -> tuple[str, int] | None:
    sink, batch = option(options, FENCE_SINK), option(options, FENCE_BATCH)
    if sink is None and batch is None:
        return None
    if not sink or batch is None or not batch.strip().isdigit():
        raise OptionError(
            f"{FENCE_SINK} and {FENCE_BATCH} go together: a sink id and a batch id (>= 0)"
        )
    return sink, int(batch)


# -- pieces ----------------------------------------------------------------------------------


def _bootstrap(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = option(options, BOOTSTRAP)
    if raw is None or not raw.strip():
        raise OptionError(f"option '{BOOTSTRAP}' is required (comma-separated host:port)")
    addresses = tuple(a.strip() for a in raw.split(",") if a.strip())
    for address in addresses:
        try:
            parse_address(address)
        except ValueError:
            raise OptionError(f"option '{BOOTSTRAP}': '{address}' is not host:port") from None
    return addresses


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = {name: option(options, name) for name in SUBSCRIPTIONS}
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) != 1:
        found = ", ".join(chosen) or "none"
        raise OptionError(f"exactly one of subscribe, subscribePattern, assign is needed ({found})")
    kind, raw = chosen[0], given[chosen[0]] or ""
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError("subscribe: give a comma-separated list of topic names")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(
                f"subscribePattern: '{raw}' is not a regular expression: {exc}"
            ) from None
        return Subscription("subscribePattern", pattern=raw)
    return Subscription("assign", assigned=_assigned(raw))


def _assigned(raw: str) -> tuple[TopicPartition, ...]:
    example = '{"topicA": [0, 1], "topicB": [2]}'
    parsed = _json(raw, "assign", example)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"assign: expected a JSON object like {example}, got {raw!r}")
    pairs: list[TopicPartition] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not partitions:
            raise OptionError(f"assign: topic '{topic}' needs a non-empty list of partitions")
        for partition in partitions:
            if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
                raise OptionError(f"assign: '{topic}' partition {partition!r} is not an int >= 0")
            pairs.append((topic, partition))
    return tuple(sorted(set(pairs)))


def _offset_spec(options: Mapping[str, str], name: str, default: int) -> OffsetSpec:
    raw = option(options, name)
    if raw is None:
        return OffsetSpec(default)
    word = raw.strip().lower()
    if word in ("earliest", "latest"):
        return OffsetSpec(EARLIEST if word == "earliest" else LATEST)
    example = '{"topic": {"0": 23, "1": -2}}'
    parsed = _json(raw, name, example)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"{name}: expected earliest, latest or JSON like {example}, got {raw!r}")
    offsets: list[tuple[TopicPartition, int]] = []
    for topic, per_partition in parsed.items():
        if not isinstance(per_partition, dict) or not per_partition:
            raise OptionError(f"{name}: topic '{topic}' needs an object of partition -> offset")
        for partition, offset in per_partition.items():
            offsets.append(((topic, _partition_key(name, topic, partition)), _offset(name, offset)))
    return OffsetSpec(default, tuple(sorted(offsets)))


def _partition_key(name: str, topic: str, key: str) -> int:
    if not key.isdigit():
        raise OptionError(f"{name}: '{topic}' partition '{key}' is not an int >= 0")
    return int(key)


def _offset(name: str, offset: object) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
        raise OptionError(
            f"{name}: offset {offset!r} is not an int >= 0 (or -2 earliest, -1 latest)"
        )
    return offset


def _refuse_marker(spec: OffsetSpec, marker: int, name: str, word: str) -> None:
    specific = spec.as_dict()
    if spec.default == marker and specific is None:
        raise OptionError(f"{name}='{word}' is not allowed in a batch read")
    if specific and marker in specific.values():
        raise OptionError(f"{name}: offset {marker} ({word}) is not allowed in a batch read")


def _check_covered(name: str, spec: OffsetSpec, subscription: Subscription) -> None:
    """Per-partition offsets may only name topics the read subscribes to."""
    specific = spec.as_dict() or {}
    strays = sorted({t for t, _ in specific if not subscription.matches(t)})
    if strays:
        raise OptionError(f"{name} names topics that are not read: {', '.join(strays)}")
    if subscription.kind == "assign" and specific:
        extra = sorted(set(specific) - set(subscription.assigned))
        if extra:
            raise OptionError(f"{name} names partitions that are not assigned: {extra}")


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = option(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"{name}: '{raw}' is not an integer") from None
    if value <= 0:
        raise OptionError(f"{name}: must be a positive integer, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = option(options, name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word not in ("true", "false"):
        raise OptionError(f"{name}: expected true or false, got '{raw}'")
    return word == "true"


_DURATION = re.compile(r"(\d+)\s*(ms|s|m|min|h|d)?")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(options: Mapping[str, str], name: str, default: int) -> int:
    """Spark's time strings: `500ms`, `30s`, `15m`, `1h`; a bare number is milliseconds."""
    raw = option(options, name)
    if raw is None:
        return default
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None:
        raise OptionError(f"{name}: '{raw}' is not a duration such as 500ms, 30s, 15m or 1h")
    return int(match.group(1)) * _UNIT_MS[match.group(2) or "ms"]


def _request_timeout_s(options: Mapping[str, str]) -> float:
    raw = option(options, REQUEST_TIMEOUT)
    return 30.0 if raw is None else _number(raw, REQUEST_TIMEOUT) / 1000


def _number(raw: str, name: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"{name}: '{raw}' is not a number") from None
    if value < 0:
        raise OptionError(f"{name}: must not be negative, got {raw}")
    return value


def _json(raw: str, name: str, example: str) -> object:
    try:
        parsed: object = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name}: not valid JSON ({exc.msg}); expected e.g. {example}") from None
    return parsed
