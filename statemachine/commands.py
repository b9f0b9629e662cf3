"""Every replicated command: frozen, versioned dataclasses encoded to and from `bytes`.

An entry in a Raft log is one encoded command: a msgpack array `[tag, version, *fields]`.
Commands travel through pysyncobj as a single `bytes` value, so pickling them is a memcpy.
Decoding is strict and total: an unknown tag or version, a wrong field count or a field of the
wrong type or range raises `CommandDecodeError` and nothing else. Each field's type and range is
a rule of statemachine/fields.py (the rules the client wire uses too). Meaning (topic name
rules, limits on counts) is checked in apply, where a violation is a committed rejection.

Time enters only here: commands that need the time carry `now_ms`, stamped by the leader that
proposed them, and settings that decide an outcome (expiration intervals, block sizes) travel
in the entry too, so every replica reaches the same result at the same index.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from statemachine.codec import CodecError, pack, unpack
from statemachine.fields import BytesRule, FieldError, IntRule, StrRule, rule, rules_of
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.records import INT64_MAX, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, PRODUCER_EPOCH_MAX

INT32_MAX = 2**31 - 1


class CommandDecodeError(ValueError):
    """Bytes that are not a command this version understands."""


# Strings and bytes are bounded by the entry's size; what a string means (a topic name's
# rules, an address) is apply's to judge, as a committed rejection.
Rule = IntRule | StrRule | BytesRule
_STR = StrRule()
_BYTES = BytesRule()


def _int(lo: int, hi: int) -> Any:
    return rule(IntRule(lo, hi))


def _str() -> Any:
    return rule(_STR)


def _bytes() -> Any:
    return rule(_BYTES)


_TIME_MS = (0, INT64_MAX)
_INTERVAL_MS = (1, INT64_MAX)
_OFFSET = (0, INT64_MAX)
_COUNT = (1, INT32_MAX)
_BROKER_ID = (0, INT32_MAX)


class Command:
    """Base of every command; subclasses set TAG (unique) and VERSION."""

    __slots__ = ()
    TAG: ClassVar[int]
    VERSION: ClassVar[int] = 1

    def encode(self) -> bytes:
        return pack([self.TAG, self.VERSION, *_FIELD_VALUES[self.TAG](self)])


# -- Both kinds of group -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Noop(Command):
    """Appended by a new leader; once it applies, every earlier entry has applied too."""

    TAG: ClassVar[int] = 0
    marker: int = _int(0, INT64_MAX)


# -- Partition groups ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendBatch(Command):
    """Append an encoded RecordBatch; `now_ms` is the leader's append time."""

    TAG: ClassVar[int] = 1
    now_ms: int = _int(*_TIME_MS)
    batch: bytes = _bytes()


@dataclass(frozen=True, slots=True)
class AppendFencedBatch(Command):
    """A part of a streaming sink's micro-batch: appended once, however often it is replayed.

    `(sink, writer, batch_id, part)` is its fence (statemachine/sink_fences.py); the batch is
    checked against the producer table as an AppendBatch's is, first.
    """

    TAG: ClassVar[int] = 4
    now_ms: int = _int(*_TIME_MS)
    batch: bytes = _bytes()
    sink: str = _str()
    writer: int = _int(0, INT32_MAX)
    batch_id: int = _int(0, INT64_MAX)
    part: int = _int(0, INT32_MAX)


@dataclass(frozen=True, slots=True)
class ExpireProducers(Command):
    """Forget producers (and sink writers) idle since `now_ms - producer_id_expiration_ms`."""

    TAG: ClassVar[int] = 2
    now_ms: int = _int(*_TIME_MS)
    producer_id_expiration_ms: int = _int(*_INTERVAL_MS)


@dataclass(frozen=True, slots=True)
class AdvanceLogStart(Command):
    """Retention: records below `log_start_offset` are no longer served and may be deleted."""

    TAG: ClassVar[int] = 3
    log_start_offset: int = _int(*_OFFSET)


@dataclass(frozen=True, slots=True)
class RegisterTxnPartition(Command):
    """The coordinator registers the partition in a producer's transaction `txn_sequence`
    (statemachine/partition_txns.py): only then does the partition take its data."""

    TAG: ClassVar[int] = 5
    now_ms: int = _int(*_TIME_MS)
    producer_id: int = _int(0, INT64_MAX)
    producer_epoch: int = _int(0, PRODUCER_EPOCH_MAX)
    txn_sequence: int = _int(0, INT64_MAX)


@dataclass(frozen=True, slots=True)
class WriteTxnMarker(Command):
    """End a producer's transaction `txn_sequence` here: commit (1) or abort (0). Where it wrote
    data, a control batch goes into the log; `coordinator_epoch` fences an older coordinator."""

    TAG: ClassVar[int] = 6
    now_ms: int = _int(*_TIME_MS)
    producer_id: int = _int(0, INT64_MAX)
    producer_epoch: int = _int(0, PRODUCER_EPOCH_MAX)
    txn_sequence: int = _int(0, INT64_MAX)
    commit: int = _int(0, 1)
    coordinator_epoch: int = _int(0, INT32_MAX)


# -- The metadata group --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterBroker(Command):
    """A broker announces itself and where it listens (`host:port` each)."""

    TAG: ClassVar[int] = 10
    broker_id: int = _int(*_BROKER_ID)
    client_address: str = _str()
    raft_address: str = _str()


@dataclass(frozen=True, slots=True)
class CreateTopic(Command):
    """Create a topic; replicas are placed deterministically across registered brokers."""

    TAG: ClassVar[int] = 11
    name: str = _str()
    partitions: int = _int(*_COUNT)
    replication_factor: int = _int(*_COUNT)
    retention_ms: int = _int(-1, INT64_MAX)
    retention_bytes: int = _int(-1, INT64_MAX)


@dataclass(frozen=True, slots=True)
class DeleteTopic(Command):
    TAG: ClassVar[int] = 12
    name: str = _str()


UNCHANGED = -2  # AlterTopicConfigs: this config keeps the value it has when the entry applies


@dataclass(frozen=True, slots=True)
class AlterTopicConfigs(Command):
    """A topic's retention changed after its creation (the configs a topic may change): only
    the configs given (UNCHANGED: not this one), of the topic of that id, so that changes
    made through different nodes at once never undo each other."""

    TAG: ClassVar[int] = 16
    name: str = _str()
    topic_id: int = _int(0, INT64_MAX)
    retention_ms: int = _int(UNCHANGED, INT64_MAX)
    retention_bytes: int = _int(UNCHANGED, INT64_MAX)


@dataclass(frozen=True, slots=True)
class AllocatePidBlock(Command):
    """Reserve the next `block_size` producer ids for one broker, before any is handed out."""

    TAG: ClassVar[int] = 13
    broker_id: int = _int(*_BROKER_ID)
    block_size: int = _int(*_COUNT)


@dataclass(frozen=True, slots=True)
class InitTransactionalProducer(Command):
    """InitProducerId with a transactional id; `expected_*` is -1 when the caller has none."""

    TAG: ClassVar[int] = 14
    transactional_id: str = _str()
    transaction_timeout_ms: int = _int(0, INT32_MAX)
    expected_producer_id: int = _int(NO_PRODUCER_ID, INT64_MAX)
    expected_epoch: int = _int(NO_PRODUCER_EPOCH, PRODUCER_EPOCH_MAX)
    now_ms: int = _int(*_TIME_MS)


@dataclass(frozen=True, slots=True)
class ExpireTransactionalIds(Command):
    """Forget transactional ids not updated within `transactional_id_expiration_ms`."""

    TAG: ClassVar[int] = 15
    now_ms: int = _int(*_TIME_MS)
    transactional_id_expiration_ms: int = _int(*_INTERVAL_MS)


# -- Offsets partitions (consumer groups) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitOffsets(Command):
    """A group's committed offsets. `offsets` is the msgpack list of
    `[topic, partition, offset, leader_epoch, metadata]` (statemachine/offsets.py checks it);
    the coordinator checked the committer's membership before proposing."""

    TAG: ClassVar[int] = 20
    group_id: str = _str()
    now_ms: int = _int(*_TIME_MS)
    offsets: bytes = _bytes()


@dataclass(frozen=True, slots=True)
class StoreGroup(Command):
    """A group's membership at the end of a rebalance (statemachine/group_records.py)."""

    TAG: ClassVar[int] = 21
    group_id: str = _str()
    now_ms: int = _int(*_TIME_MS)
    record: bytes = _bytes()


@dataclass(frozen=True, slots=True)
class DeleteGroup(Command):
    """DeleteGroups, or a reset's end: the group and its offsets go (the coordinator checked
    that it has no members)."""

    TAG: ClassVar[int] = 22
    group_id: str = _str()


@dataclass(frozen=True, slots=True)
class ExpireOffsets(Command):
    """Offsets of groups without members, committed and left alone for `retention_ms`."""

    TAG: ClassVar[int] = 23
    now_ms: int = _int(*_TIME_MS)
    retention_ms: int = _int(*_INTERVAL_MS)


@dataclass(frozen=True, slots=True)
class DeleteTopicOffsets(Command):
    """Every group's offsets of a deleted topic."""

    TAG: ClassVar[int] = 24
    topic: str = _str()


@dataclass(frozen=True, slots=True)
class DeleteOffsets(Command):
    """OffsetDelete: some of a group's committed offsets go. `partitions` is the msgpack list
    of `[topic, partition]`; the coordinator checked that the group does not read them."""

    TAG: ClassVar[int] = 25
    group_id: str = _str()
    partitions: bytes = _bytes()


@dataclass(frozen=True, slots=True)
class CommitTxnOffsets(Command):
    """TxnOffsetCommit: a group's offsets, pending in producer `producer_id`'s open transaction
    on this offsets partition until its marker commits or drops them. `offsets` as
    CommitOffsets'; the coordinator checked the committer's membership before proposing."""

    TAG: ClassVar[int] = 26
    group_id: str = _str()
    now_ms: int = _int(*_TIME_MS)
    producer_id: int = _int(0, INT64_MAX)
    producer_epoch: int = _int(0, PRODUCER_EPOCH_MAX)
    offsets: bytes = _bytes()


# -- Transaction state partitions (the transaction coordinator) ----------------------------------


@dataclass(frozen=True, slots=True)
class InitTxnProducer(Command):
    """InitProducerId for a transactional id at its coordinator; `expected_*` is -1 when the
    caller has none. `fresh_producer_id` comes from the coordinator's lease of producer ids
    and is taken only where the id needs a new one (a new id, or an exhausted epoch)."""

    TAG: ClassVar[int] = 30
    now_ms: int = _int(*_TIME_MS)
    transactional_id: str = _str()
    transaction_timeout_ms: int = _int(0, INT32_MAX)
    expected_producer_id: int = _int(NO_PRODUCER_ID, INT64_MAX)
    expected_epoch: int = _int(NO_PRODUCER_EPOCH, PRODUCER_EPOCH_MAX)
    fresh_producer_id: int = _int(0, INT64_MAX)


@dataclass(frozen=True, slots=True)
class AddTxnPartitions(Command):
    """AddPartitionsToTxn (and AddOffsetsToTxn's offsets partition): `partitions` is the
    msgpack list of `[topic, partition]`."""

    TAG: ClassVar[int] = 31
    now_ms: int = _int(*_TIME_MS)
    transactional_id: str = _str()
    producer_id: int = _int(0, INT64_MAX)
    producer_epoch: int = _int(0, PRODUCER_EPOCH_MAX)
    partitions: bytes = _bytes()


@dataclass(frozen=True, slots=True)
class PrepareTxnEnd(Command):
    """EndTxn: the transaction goes PrepareCommit (commit 1) or PrepareAbort (0)."""

    TAG: ClassVar[int] = 32
    now_ms: int = _int(*_TIME_MS)
    transactional_id: str = _str()
    producer_id: int = _int(0, INT64_MAX)
    producer_epoch: int = _int(0, PRODUCER_EPOCH_MAX)
    commit: int = _int(0, 1)


@dataclass(frozen=True, slots=True)
class CompleteTxn(Command):
    """Every partition of transaction `txn_sequence` holds its marker: CompleteCommit or
    CompleteAbort."""

    TAG: ClassVar[int] = 33
    now_ms: int = _int(*_TIME_MS)
    transactional_id: str = _str()
    producer_id: int = _int(0, INT64_MAX)
    txn_sequence: int = _int(0, INT64_MAX)


@dataclass(frozen=True, slots=True)
class FenceTxn(Command):
    """The coordinator aborts the open transaction of this producer session (its timeout
    passed, or an operator's abort), bumping the epoch so the producer is fenced."""

    TAG: ClassVar[int] = 34
    now_ms: int = _int(*_TIME_MS)
    transactional_id: str = _str()
    producer_id: int = _int(0, INT64_MAX)
    producer_epoch: int = _int(0, PRODUCER_EPOCH_MAX)


COMMAND_TYPES: tuple[type[Command], ...] = (
    Noop,
    AppendBatch,
    AppendFencedBatch,
    ExpireProducers,
    AdvanceLogStart,
    RegisterTxnPartition,
    WriteTxnMarker,
    RegisterBroker,
    CreateTopic,
    DeleteTopic,
    AllocatePidBlock,
    InitTransactionalProducer,
    ExpireTransactionalIds,
    AlterTopicConfigs,
    CommitOffsets,
    StoreGroup,
    DeleteGroup,
    ExpireOffsets,
    DeleteTopicOffsets,
    DeleteOffsets,
    CommitTxnOffsets,
    InitTxnProducer,
    AddTxnPartitions,
    PrepareTxnEnd,
    CompleteTxn,
    FenceTxn,
)


def field_rules(cls: type[Command]) -> tuple[tuple[str, Rule], ...]:
    """The (name, rule) of each field of a command class, in encoding order."""
    return rules_of(cls)


def _schemas() -> dict[int, tuple[type[Command], tuple[tuple[str, Rule], ...]]]:
    schemas = {cls.TAG: (cls, field_rules(cls)) for cls in COMMAND_TYPES}
    assert len(schemas) == len(COMMAND_TYPES), "command tags must be unique"
    return schemas


_SCHEMAS = _schemas()


def _field_values(names: tuple[str, ...]) -> Callable[[Command], tuple[Any, ...]]:
    """A command's field values in encoding order, read by one C call (a command is encoded
    on the write path of every produce)."""
    if len(names) == 1:
        name = names[0]
        return lambda command: (getattr(command, name),)
    if not names:
        return lambda _command: ()
    return operator.attrgetter(*names)


_FIELD_VALUES = {
    tag: _field_values(tuple(name for name, _ in rules)) for tag, (_cls, rules) in _SCHEMAS.items()
}


def encode_append(
    now_ms: int, batch: bytes | memoryview, fence: tuple[str, int, int, int] | None = None
) -> bytes:
    """`AppendBatch(now_ms, batch).encode()`, or with `fence` (sink, writer, batch id, part)
    `AppendFencedBatch`'s, the batch given as bytes or as a view of them: the same entry,
    without a copy of a batch of up to a frame's size before it is packed."""
    if fence is None:
        return pack([AppendBatch.TAG, AppendBatch.VERSION, now_ms, batch])
    return pack([AppendFencedBatch.TAG, AppendFencedBatch.VERSION, now_ms, batch, *fence])


def decode_fields(
    data: bytes | memoryview, limits: StateLimits = DEFAULT_LIMITS
) -> tuple[type[Command], tuple[Any, ...]]:
    """Decode and check one entry without building the command: its class and field values.

    Apply's hot path: it dispatches on the class and skips the frozen dataclass's __init__.
    """
    try:
        raw = unpack(data, size_max=limits.entry_bytes_max)
    except CodecError as exc:
        raise CommandDecodeError(str(exc)) from exc
    if not isinstance(raw, tuple) or len(raw) < 2:
        raise CommandDecodeError("an entry is [tag, version, *fields]")
    tag = raw[0]
    schema = _SCHEMAS.get(tag) if type(tag) is int else None
    if schema is None:
        raise CommandDecodeError(f"unknown command tag {tag!r}")
    cls, rules = schema
    version = raw[1]
    if type(version) is not int or version != cls.VERSION:
        raise CommandDecodeError(f"{cls.__name__}: unsupported version {version!r}")
    values = raw[2:]
    if len(values) != len(rules):
        raise CommandDecodeError(f"{cls.__name__}: expected {len(rules)} fields")
    _check_fields(cls, rules, values)
    return cls, values


def _check_fields(
    cls: type[Command], rules: tuple[tuple[str, Rule], ...], values: tuple[Any, ...]
) -> None:
    """Each value under its field's rule. The checks are inline (no method frame per field on
    the apply path); a value that fails one goes through the rule's `load` for the reason."""
    for (name, field_rule), value in zip(rules, values, strict=True):
        if type(field_rule) is IntRule:
            ok = type(value) is int and field_rule.lo <= value <= field_rule.hi
        elif type(field_rule) is StrRule:
            ok = type(value) is str and len(value) <= field_rule.chars_max
        else:
            ok = type(value) is bytes
        if not ok:
            try:
                field_rule.load(value)
            except FieldError as exc:
                raise CommandDecodeError(f"{cls.__name__}.{name}: {exc.reason}") from None
            raise AssertionError(f"{field_rule!r} loads {value!r}, which its inline check refused")


def decode_command(data: bytes | memoryview, limits: StateLimits = DEFAULT_LIMITS) -> Command:
    """Decode one entry; anything but a valid, known command raises CommandDecodeError."""
    cls, values = decode_fields(data, limits)
    return cls(*values)
