"""MetadataStateMachine: the controller's replicated state, as KRaft's metadata log holds it.

Brokers and their addresses, topics with their partition-to-replica placement, the producer-id
block allocator and the transactional-id registry. Like every state machine here it is pure:
commands arrive as bytes, results leave as values, and time is only what leaders stamped into
entries (kept as a clock that never runs backwards).

Placement is deterministic: brokers sorted by id, a start position derived from the topic
name's CRC, and partition p's replicas the `replication_factor` brokers that follow it, so the
first replicas (the preferred leaders) spread across brokers, as Kafka's round-robin does.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, replace
from typing import NamedTuple

from statemachine.codec import SnapshotError, expect_int, pack, unpack_snapshot
from statemachine.commands import (
    UNCHANGED,
    AllocatePidBlock,
    AlterTopicConfigs,
    CommandDecodeError,
    CreateTopic,
    DeleteTopic,
    ExpireTransactionalIds,
    InitTransactionalProducer,
    Noop,
    RegisterBroker,
    decode_command,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.partition import NoopApplied
from statemachine.pid_allocator import PidAllocator, PidBlock
from statemachine.txn_registry import ProducerIdAndEpoch, TxnRegistry

SNAPSHOT_VERSION = 2
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]+")
_ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def topic_name_error(name: str, limits: StateLimits = DEFAULT_LIMITS) -> str | None:
    """Why `name` is not a valid topic name (Kafka's rules), or None."""
    if not name:
        return "a topic name must not be empty"
    if len(name) > limits.name_length_max:
        return f"a topic name has at most {limits.name_length_max} characters"
    if name in {".", ".."}:
        return "a topic name must not be '.' or '..'"
    if not _TOPIC_NAME.fullmatch(name):
        return "a topic name uses only ASCII letters, digits, '.', '_' and '-'"
    return None


def transactional_id_error(txn_id: str, limits: StateLimits = DEFAULT_LIMITS) -> str | None:
    """Why `txn_id` is not a valid transactional id, or None."""
    if not txn_id:
        return "a transactional id must not be empty"
    if len(txn_id) > limits.name_length_max:
        return f"a transactional id has at most {limits.name_length_max} characters"
    if not txn_id.isprintable():
        return "a transactional id must be printable"
    return None


def address_error(address: str, limits: StateLimits = DEFAULT_LIMITS) -> str | None:
    """Why `address` is not `host:port`, or None."""
    match = _ADDRESS.fullmatch(address) if len(address) <= limits.address_length_max else None
    if match is None or not 1 <= int(match["port"]) <= 65_535:
        return f"{address[:64]!r} is not host:port"
    return None


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    client_address: str
    raft_address: str


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic; `replicas[p]` lists partition p's brokers, preferred leader first.

    `topic_id` is never reused: a recreated topic's Raft groups are told apart by it, so they can
    never meet a deleted one's stragglers.
    """

    name: str
    topic_id: int
    replicas: tuple[tuple[int, ...], ...]
    retention_ms: int
    retention_bytes: int

    @property
    def partitions(self) -> int:
        return len(self.replicas)


class BrokerRegistered(NamedTuple):
    broker: BrokerInfo


class TopicCreated(NamedTuple):
    topic: TopicInfo


class TopicDeleted(NamedTuple):
    topic: TopicInfo


class TopicAltered(NamedTuple):
    topic: TopicInfo  # as it is now


class TransactionalIdsExpired(NamedTuple):
    transactional_ids: tuple[str, ...]


MetadataResult = (
    BrokerRegistered
    | TopicCreated
    | TopicDeleted
    | TopicAltered
    | PidBlock
    | ProducerIdAndEpoch
    | TransactionalIdsExpired
    | NoopApplied
    | Rejected
)


def place_replicas(
    name: str, broker_ids: list[int], partitions: int, replication_factor: int
) -> tuple[tuple[int, ...], ...]:
    """Deterministic round-robin placement of every partition's replicas."""
    ordered = sorted(broker_ids)
    count = len(ordered)
    start = zlib.crc32(name.encode()) % count
    return tuple(
        tuple(ordered[(start + p + r) % count] for r in range(replication_factor))
        for p in range(partitions)
    )


class MetadataStateMachine:
    """Brokers, topics, the PID allocator and the transactional-id registry."""

    __slots__ = (
        "_clock_ms",
        "_limits",
        "_next_topic_id",
        "allocator",
        "brokers",
        "topics",
        "txns",
    )

    def __init__(self, limits: StateLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._clock_ms = 0
        self._next_topic_id = 1
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.allocator = PidAllocator()
        self.txns = TxnRegistry(limits.transactional_ids_max)

    @property
    def clock_ms(self) -> int:
        return self._clock_ms

    def expiry_due(self, now_ms: int, expiration_ms: int) -> bool:
        """Whether ExpireTransactionalIds stamped `now_ms` would remove an id."""
        return self.txns.expiry_due(max(self._clock_ms, now_ms), expiration_ms)

    def apply(self, entry: bytes | memoryview) -> MetadataResult:
        try:
            command = decode_command(entry, self._limits)
        except CommandDecodeError:
            return Rejected(ErrorCode.INVALID_REQUEST)
        match command:
            case RegisterBroker():
                return self._register_broker(command)
            case CreateTopic():
                return self._create_topic(command)
            case DeleteTopic(name=name):
                topic = self.topics.pop(name, None)
                return (
                    Rejected(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    if topic is None
                    else TopicDeleted(topic)
                )
            case AlterTopicConfigs():
                return self._alter_topic(command)
            case AllocatePidBlock():
                return self._allocate_pid_block(command)
            case InitTransactionalProducer():
                return self._init_transactional_producer(command)
            case ExpireTransactionalIds(now_ms=now_ms, transactional_id_expiration_ms=interval):
                self._clock_ms = max(self._clock_ms, now_ms)
                return TransactionalIdsExpired(self.txns.expire(self._clock_ms, interval))
            case Noop(marker=marker):
                return NoopApplied(marker)
        return Rejected(ErrorCode.INVALID_REQUEST)  # a partition command sent to metadata

    def _register_broker(self, cmd: RegisterBroker) -> MetadataResult:
        if address_error(cmd.client_address, self._limits) or address_error(
            cmd.raft_address, self._limits
        ):
            return Rejected(ErrorCode.INVALID_REQUEST)
        if cmd.broker_id not in self.brokers and len(self.brokers) >= self._limits.brokers_max:
            return Rejected(ErrorCode.POLICY_VIOLATION)
        broker = BrokerInfo(cmd.broker_id, cmd.client_address, cmd.raft_address)
        self.brokers[cmd.broker_id] = broker
        return BrokerRegistered(broker)

    def _create_topic(self, cmd: CreateTopic) -> MetadataResult:
        limits = self._limits
        if topic_name_error(cmd.name, limits):
            return Rejected(ErrorCode.INVALID_TOPIC_EXCEPTION)
        if cmd.name in self.topics:
            return Rejected(ErrorCode.TOPIC_ALREADY_EXISTS)
        if cmd.partitions > limits.partitions_per_topic_max:
            return Rejected(ErrorCode.INVALID_PARTITIONS)
        if cmd.replication_factor > min(len(self.brokers), limits.replication_factor_max):
            return Rejected(ErrorCode.INVALID_REPLICATION_FACTOR)
        if len(self.topics) >= limits.topics_max:
            return Rejected(ErrorCode.POLICY_VIOLATION)
        replicas = place_replicas(
            cmd.name, list(self.brokers), cmd.partitions, cmd.replication_factor
        )
        topic = TopicInfo(
            cmd.name,
            self._next_topic_id,
            replicas,
            cmd.retention_ms,
            cmd.retention_bytes,
        )
        self._next_topic_id += 1
        self.topics[cmd.name] = topic
        return TopicCreated(topic)

    def _alter_topic(self, cmd: AlterTopicConfigs) -> MetadataResult:
        topic = self.topics.get(cmd.name)
        if topic is None or topic.topic_id != cmd.topic_id:  # gone, or made again since
            return Rejected(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        ms, size = cmd.retention_ms, cmd.retention_bytes
        topic = self.topics[cmd.name] = replace(
            topic,
            retention_ms=topic.retention_ms if ms == UNCHANGED else ms,
            retention_bytes=topic.retention_bytes if size == UNCHANGED else size,
        )
        return TopicAltered(topic)

    def _allocate_pid_block(self, cmd: AllocatePidBlock) -> MetadataResult:
        if cmd.broker_id not in self.brokers:
            return Rejected(ErrorCode.BROKER_ID_NOT_REGISTERED)
        if cmd.block_size > self._limits.pid_block_size_max:
            return Rejected(ErrorCode.INVALID_REQUEST)
        block = self.allocator.allocate_block(cmd.broker_id, cmd.block_size)
        return Rejected(block) if isinstance(block, ErrorCode) else block

    def _init_transactional_producer(self, cmd: InitTransactionalProducer) -> MetadataResult:
        if transactional_id_error(cmd.transactional_id, self._limits):
            return Rejected(ErrorCode.INVALID_REQUEST)
        timeout_ms = cmd.transaction_timeout_ms
        if not 0 < timeout_ms <= self._limits.transaction_timeout_ms_max:
            return Rejected(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        self._clock_ms = max(self._clock_ms, cmd.now_ms)
        result = self.txns.init_producer(cmd, self._clock_ms, self.allocator)
        return Rejected(result) if isinstance(result, ErrorCode) else result

    # -- snapshots -------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Canonical bytes of the whole state: equal on replicas that applied equal entries."""
        brokers = [
            [b.broker_id, b.client_address, b.raft_address] for _, b in sorted(self.brokers.items())
        ]
        topics = [
            [
                t.name,
                t.topic_id,
                [list(r) for r in t.replicas],
                t.retention_ms,
                t.retention_bytes,
            ]
            for _, t in sorted(self.topics.items())
        ]
        return pack(
            [
                SNAPSHOT_VERSION,
                self._clock_ms,
                self._next_topic_id,
                self.allocator.next_producer_id,
                brokers,
                topics,
                self.txns.to_data(),
            ]
        )

    @classmethod
    def restore(cls, data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> MetadataStateMachine:
        fields = unpack_snapshot(data, SNAPSHOT_VERSION, 6, "metadata")
        machine = cls(limits)
        machine._clock_ms = expect_int(fields[0], "metadata clock")
        machine._next_topic_id = expect_int(fields[1], "next topic id")
        machine.allocator = PidAllocator(expect_int(fields[2], "next producer id"))
        try:
            for broker_id, client_address, raft_address in fields[3]:
                machine.brokers[broker_id] = BrokerInfo(broker_id, client_address, raft_address)
            for name, topic_id, replicas, retention_ms, retention_bytes in fields[4]:
                machine.topics[name] = TopicInfo(
                    name, topic_id, tuple(replicas), retention_ms, retention_bytes
                )
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"metadata snapshot: {exc}") from exc
        machine.txns = TxnRegistry.from_data(fields[5], limits.transactional_ids_max)
        return machine
