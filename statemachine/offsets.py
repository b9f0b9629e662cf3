"""OffsetsStateMachine: what every replica of an offsets partition applies (consumer groups).

Role: the replicated half of consumer groups, as Kafka's `__consumer_offsets` partitions hold
it: each group that hashes to this partition has its committed offsets and the record of its
last rebalance (statemachine/group_records.py). The other half, who is a member right now, is
the coordinator's (cluster/broker/coordinator/), which runs on this partition's leader and
writes here what must outlive it.

Rules:
- Pure and deterministic, like every state machine here: time is what leaders stamped into
  entries, kept as a clock that never runs backwards; equal entries give equal snapshots.
- The leader decides who may commit (generation, member) before it proposes; apply checks
  only what the entry itself must satisfy (names, ranges, sizes, the limits on groups and
  offsets), so a malformed entry is a committed rejection on every replica alike.
- Expiry follows Kafka (KIP-211): a group's offsets expire only while it has no members, each
  `retention_ms` after the later of its commit and the moment the group became empty; a group
  with neither members nor offsets is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from statemachine.codec import CodecError, SnapshotError, expect_int, pack, unpack, unpack_snapshot
from statemachine.commands import (
    CommandDecodeError,
    CommitOffsets,
    DeleteGroup,
    DeleteOffsets,
    DeleteTopicOffsets,
    ExpireOffsets,
    Noop,
    StoreGroup,
    decode_command,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.group_records import GroupRecord, RecordError, group_record_of
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.partition import NoopApplied

SNAPSHOT_VERSION = 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
NO_LEADER_EPOCH = -1
NO_OFFSET = -1  # Kafka stores a commit of -1 as it stores any other: OffsetFetch gives it back

TopicPartition = tuple[str, int]


class CommittedOffset(NamedTuple):
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


@dataclass(slots=True)
class GroupEntry:
    """One group's replicated state."""

    record: GroupRecord | None = None
    empty_since_ms: int = 0
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)

    @property
    def has_members(self) -> bool:
        return self.record is not None and bool(self.record.members)


class OffsetsCommitted(NamedTuple):
    partitions: int


class GroupStored(NamedTuple):
    group_id: str
    generation: int


class GroupDeleted(NamedTuple):
    group_id: str


class OffsetsRemoved(NamedTuple):
    """Expired, or of a deleted topic: per group, how many."""

    removed: tuple[tuple[str, int], ...]


OffsetsResult = (
    OffsetsCommitted | GroupStored | GroupDeleted | OffsetsRemoved | NoopApplied | Rejected
)
_Offsets = list[tuple[TopicPartition, tuple[int, int, str]]]


class OffsetsStateMachine:
    """The groups of one offsets partition: committed offsets and rebalance records."""

    __slots__ = ("_clock_ms", "_limits", "groups")

    def __init__(self, limits: StateLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._clock_ms = 0
        self.groups: dict[str, GroupEntry] = {}

    @property
    def clock_ms(self) -> int:
        return self._clock_ms

    def apply(self, entry: bytes | memoryview) -> OffsetsResult:
        try:
            command = decode_command(entry, self._limits)
        except CommandDecodeError:
            return Rejected(ErrorCode.INVALID_REQUEST)
        match command:
            case CommitOffsets():
                return self._commit(command)
            case StoreGroup():
                return self._store(command)
            case DeleteGroup(group_id=group_id):
                if self.groups.pop(group_id, None) is None:
                    return Rejected(ErrorCode.GROUP_ID_NOT_FOUND)
                return GroupDeleted(group_id)
            case ExpireOffsets(now_ms=now_ms, retention_ms=retention_ms):
                self._tick(now_ms)
                return self._expire(retention_ms)
            case DeleteTopicOffsets(topic=topic):
                return self._remove(lambda _entry, c: c.topic == topic)
            case DeleteOffsets(group_id=group_id, partitions=data):
                return self._delete_offsets(group_id, data)
            case Noop(marker=marker):
                return NoopApplied(marker)
        return Rejected(ErrorCode.INVALID_REQUEST)  # another group kind's command

    def _tick(self, now_ms: int) -> None:
        self._clock_ms = max(self._clock_ms, now_ms)

    def _entry(self, group_id: str) -> GroupEntry | None:
        """The group's entry, made if there is room; None when the partition is full."""
        entry = self.groups.get(group_id)
        if entry is None:
            if len(self.groups) >= self._limits.groups_per_partition_max:
                return None
            entry = self.groups[group_id] = GroupEntry(empty_since_ms=self._clock_ms)
        return entry

    def _commit(self, cmd: CommitOffsets) -> OffsetsResult:
        if group_id_error(cmd.group_id, self._limits):
            return Rejected(ErrorCode.INVALID_GROUP_ID)
        offsets = self._decode_offsets(cmd.offsets)
        if offsets is None:
            return Rejected(ErrorCode.INVALID_REQUEST)
        self._tick(cmd.now_ms)
        entry = self._entry(cmd.group_id)
        if entry is None:
            return Rejected(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        new = {tp for tp, _ in offsets if tp not in entry.offsets}
        if len(entry.offsets) + len(new) > self._limits.group_offsets_max:
            return Rejected(ErrorCode.POLICY_VIOLATION)
        for tp, (offset, epoch, metadata) in offsets:
            entry.offsets[tp] = CommittedOffset(*tp, offset, epoch, metadata, self._clock_ms)
        return OffsetsCommitted(len(offsets))

    def _listed(self, data: bytes) -> tuple[object, ...] | None:
        """An entry's msgpack list of offsets or partitions, at most `group_offsets_max`."""
        try:
            value = unpack(data, size_max=self._limits.entry_bytes_max)
        except CodecError:
            return None
        if not isinstance(value, tuple) or len(value) > self._limits.group_offsets_max:
            return None
        return value

    def _decode_offsets(self, data: bytes) -> _Offsets | None:
        value = self._listed(data)
        if value is None:
            return None
        decoded: _Offsets = []
        for item in value:
            if not (isinstance(item, tuple) and len(item) == 5):
                return None
            topic, partition, offset, epoch, metadata = item
            if not (
                type(topic) is str
                and 0 < len(topic) <= self._limits.name_length_max
                and type(partition) is int
                and 0 <= partition <= INT32_MAX
                and type(offset) is int
                and NO_OFFSET <= offset <= INT64_MAX
                and type(epoch) is int
                and NO_LEADER_EPOCH <= epoch <= INT32_MAX
                and type(metadata) is str
                and len(metadata.encode()) <= self._limits.offset_metadata_bytes_max
            ):
                return None
            decoded.append(((topic, partition), (offset, epoch, metadata)))
        return decoded

    def _delete_offsets(self, group_id: str, data: bytes) -> OffsetsResult:
        """The listed offsets of one group go (and the group, if nothing of it is left)."""
        doomed = self._decode_partitions(data)
        if doomed is None:
            return Rejected(ErrorCode.INVALID_REQUEST)
        entry = self.groups.get(group_id)
        if entry is None:
            return OffsetsRemoved(())
        gone = [tp for tp in sorted(doomed) if entry.offsets.pop(tp, None) is not None]
        if not entry.offsets and not entry.has_members:
            del self.groups[group_id]
        return OffsetsRemoved(((group_id, len(gone)),) if gone else ())

    def _decode_partitions(self, data: bytes) -> frozenset[TopicPartition] | None:
        value = self._listed(data)
        if value is None:
            return None
        found: set[TopicPartition] = set()
        for item in value:
            if not (isinstance(item, tuple) and len(item) == 2):
                return None
            topic, partition = item
            if not (type(topic) is str and type(partition) is int and 0 <= partition <= INT32_MAX):
                return None
            found.add((topic, partition))
        return frozenset(found)

    def _store(self, cmd: StoreGroup) -> OffsetsResult:
        if group_id_error(cmd.group_id, self._limits):
            return Rejected(ErrorCode.INVALID_GROUP_ID)
        try:
            record = group_record_of(unpack(cmd.record, size_max=self._limits.entry_bytes_max))
        except (CodecError, RecordError):
            return Rejected(ErrorCode.INVALID_REQUEST)
        self._tick(cmd.now_ms)
        entry = self._entry(cmd.group_id)
        if entry is None:
            return Rejected(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if entry.has_members and not record.members:
            entry.empty_since_ms = self._clock_ms
        entry.record = record
        return GroupStored(cmd.group_id, record.generation)

    def _expire(self, retention_ms: int) -> OffsetsResult:
        now = self._clock_ms
        return self._remove(
            lambda entry, c: (
                not entry.has_members
                and now - max(c.commit_ms, entry.empty_since_ms) >= retention_ms
            )
        )

    def _remove(self, doomed: Callable[[GroupEntry, CommittedOffset], bool]) -> OffsetsRemoved:
        """Remove the offsets `doomed` picks, then the groups left with neither members nor
        offsets (Kafka's Dead groups)."""
        removed: list[tuple[str, int]] = []
        for group_id in sorted(self.groups):
            entry = self.groups[group_id]
            gone = [tp for tp, c in entry.offsets.items() if doomed(entry, c)]
            for tp in gone:
                del entry.offsets[tp]
            if gone:
                removed.append((group_id, len(gone)))
            if not entry.offsets and not entry.has_members:
                del self.groups[group_id]
        return OffsetsRemoved(tuple(removed))

    # -- snapshots -------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Canonical bytes of the whole state: equal on replicas that applied equal entries."""
        groups = [
            [
                group_id,
                None if entry.record is None else entry.record.as_value(),
                entry.empty_since_ms,
                [list(c) for _, c in sorted(entry.offsets.items())],
            ]
            for group_id, entry in sorted(self.groups.items())
        ]
        return pack([SNAPSHOT_VERSION, self._clock_ms, groups])

    @classmethod
    def restore(cls, data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> OffsetsStateMachine:
        fields = unpack_snapshot(data, SNAPSHOT_VERSION, 2, "offsets")
        machine = cls(limits)
        machine._clock_ms = expect_int(fields[0], "offsets clock")
        try:
            for group_id, record, empty_since_ms, offsets in fields[1]:
                entry = GroupEntry(
                    None if record is None else group_record_of(record),
                    expect_int(empty_since_ms, "empty since"),
                )
                for topic, partition, offset, epoch, metadata, commit_ms in offsets:
                    entry.offsets[(topic, partition)] = CommittedOffset(
                        topic, partition, offset, epoch, metadata, commit_ms
                    )
                machine.groups[group_id] = entry
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"offsets snapshot: {exc}") from exc
        return machine


def group_id_error(group_id: str, limits: StateLimits = DEFAULT_LIMITS) -> str | None:
    """Why `group_id` is not a group id we keep, or None. Kafka takes any non-empty string; we
    bound its length as every name's and refuse unprintable ones (they break every listing)."""
    if not group_id:
        return "a group id must not be empty"
    if len(group_id) > limits.name_length_max:
        return f"a group id has at most {limits.name_length_max} characters"
    if not group_id.isprintable():
        return "a group id must be printable"
    return None
