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
- Offsets in a transaction (TxnOffsetCommit) follow the partition's transaction rules
  (statemachine/partition_txns.py, the same code): the coordinator registers this offsets
  partition in the transaction first, a `CommitTxnOffsets` is taken only inside that
  registration, in its producer's epoch, and is kept pending, apart from the committed offsets
  (OffsetFetch does not show it; with RequireStable it answers UNSTABLE_OFFSET_COMMIT), until
  the transaction's marker commits it (Kafka's `completePendingTxnOffsetCommit`) or drops it.
  A group with pending offsets is kept whole: it neither expires nor is deleted, and its
  committed and pending partitions together stay within `group_offsets_max`, so a commit
  marker always has room. A plain commit or an OffsetDelete of a partition after a pending
  offset of it wins: the marker no longer installs that one (Kafka keeps the last written).
  Idle producers' transaction records expire with the offsets' retention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from statemachine.codec import (
    CodecError,
    SnapshotError,
    expect_int,
    pack,
    unpack,
    unpack_versioned_snapshot,
)
from statemachine.commands import (
    CommandDecodeError,
    CommitOffsets,
    CommitTxnOffsets,
    DeleteGroup,
    DeleteOffsets,
    DeleteTopicOffsets,
    ExpireOffsets,
    Noop,
    RegisterTxnPartition,
    StoreGroup,
    WriteTxnMarker,
    decode_command,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.group_records import GroupRecord, RecordError, group_record_of
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.partition import NoopApplied, TxnEnded, TxnRegistered
from statemachine.partition_txns import NO_OFFSET as NO_MARKER_OFFSET
from statemachine.partition_txns import PartitionTxns

SNAPSHOT_VERSION = 2  # 2 added transactions and their pending offsets
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
    # producer id -> the offsets its open transaction committed here (TxnOffsetCommit)
    pending: dict[int, dict[TopicPartition, CommittedOffset]] = field(default_factory=dict)

    @property
    def has_members(self) -> bool:
        return self.record is not None and bool(self.record.members)

    @property
    def removable(self) -> bool:
        """Nothing of the group is left: Kafka's Dead."""
        return not (self.offsets or self.pending or self.has_members)

    def supersede_pending(self, tps: Iterable[TopicPartition]) -> None:
        """A later plain commit (or a deletion) of these partitions wins over a transaction's
        earlier pending offset of them: its marker installs it no more (Kafka's
        `completePendingTxnOffsetCommit` keeps whichever offset was written last)."""
        gone = set(tps)
        for offsets in self.pending.values():
            for tp in gone.intersection(offsets):
                del offsets[tp]

    def is_pending(self, tp: TopicPartition) -> bool:
        """Whether a transaction's offset of `tp` waits for its marker (RequireStable)."""
        return any(tp in offsets for offsets in self.pending.values())

    def room_for(self, tps: Iterable[TopicPartition], limit: int) -> bool:
        """Whether committing `tps` keeps committed and pending partitions within `limit`."""
        known = set(self.offsets).union(*self.pending.values())
        return len(known | set(tps)) <= limit


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
    OffsetsCommitted
    | GroupStored
    | GroupDeleted
    | OffsetsRemoved
    | TxnRegistered
    | TxnEnded
    | NoopApplied
    | Rejected
)
_Offsets = list[tuple[TopicPartition, tuple[int, int, str]]]


class OffsetsStateMachine:
    """The groups of one offsets partition: committed offsets and rebalance records."""

    __slots__ = ("_clock_ms", "_limits", "_pending_groups", "groups", "txns")

    def __init__(self, limits: StateLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._clock_ms = 0
        self.groups: dict[str, GroupEntry] = {}
        self.txns = PartitionTxns.bounded_by(limits)
        self._pending_groups: dict[int, set[str]] = {}  # producer id -> its groups' ids

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
            case CommitTxnOffsets():
                return self._commit_in_txn(command)
            case StoreGroup():
                return self._store(command)
            case DeleteGroup(group_id=group_id):
                return self._delete_group(group_id)
            case ExpireOffsets(now_ms=now_ms, retention_ms=retention_ms):
                self._tick(now_ms)
                self.txns.expire(self._clock_ms, retention_ms)
                return self._expire(retention_ms)
            case DeleteTopicOffsets(topic=topic):
                return self._delete_topic(topic)
            case DeleteOffsets(group_id=group_id, partitions=data):
                return self._delete_offsets(group_id, data)
            case RegisterTxnPartition() | WriteTxnMarker():
                return self._txn_entry(command)
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
        found = self._commit_target(cmd.group_id, cmd.offsets, cmd.now_ms)
        if isinstance(found, Rejected):
            return found
        entry, offsets = found
        for tp, (offset, epoch, metadata) in offsets:
            entry.offsets[tp] = CommittedOffset(*tp, offset, epoch, metadata, self._clock_ms)
        entry.supersede_pending(tp for tp, _ in offsets)
        self._drop_if_removable(cmd.group_id, entry)  # (a commit of nothing)
        return OffsetsCommitted(len(offsets))

    def _commit_target(
        self, group_id: str, data: bytes, now_ms: int
    ) -> tuple[GroupEntry, _Offsets] | Rejected:
        """The group and the offsets a commit (plain or transactional) writes, or why not."""
        if group_id_error(group_id, self._limits):
            return Rejected(ErrorCode.INVALID_GROUP_ID)
        offsets = self._decode_offsets(data)
        if offsets is None:
            return Rejected(ErrorCode.INVALID_REQUEST)
        self._tick(now_ms)
        entry = self._entry(group_id)
        if entry is None:
            return Rejected(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not entry.room_for((tp for tp, _ in offsets), self._limits.group_offsets_max):
            self._drop_if_removable(group_id, entry)
            return Rejected(ErrorCode.POLICY_VIOLATION)
        return entry, offsets

    def _drop_if_removable(self, group_id: str, entry: GroupEntry) -> None:
        """A group known only by offsets goes with its last one (one with a record stays, as
        Kafka's Empty group, until its offsets expire)."""
        if entry.record is None and entry.removable:
            del self.groups[group_id]

    # -- offsets in a transaction ----------------------------------------------------------------

    def _commit_in_txn(self, cmd: CommitTxnOffsets) -> OffsetsResult:
        """TxnOffsetCommit: pending in the producer's transaction registered here."""
        error = self.txns.check_data(cmd.producer_id, cmd.producer_epoch)
        if error != ErrorCode.NONE:
            return Rejected(error)
        found = self._commit_target(cmd.group_id, cmd.offsets, cmd.now_ms)
        if isinstance(found, Rejected):
            return found
        entry, offsets = found
        if offsets:
            pending = entry.pending.setdefault(cmd.producer_id, {})
            for tp, (offset, epoch, metadata) in offsets:
                pending[tp] = CommittedOffset(*tp, offset, epoch, metadata, self._clock_ms)
            self._pending_groups.setdefault(cmd.producer_id, set()).add(cmd.group_id)
        self._drop_if_removable(cmd.group_id, entry)
        return OffsetsCommitted(len(offsets))

    def _txn_entry(self, command: RegisterTxnPartition | WriteTxnMarker) -> OffsetsResult:
        """The coordinator's registration of this partition in a transaction, or its marker."""
        self._tick(command.now_ms)
        if isinstance(command, WriteTxnMarker):
            marker = (command.producer_epoch, bool(command.commit), command.coordinator_epoch)
            return self._end_txn(command.producer_id, command.txn_sequence, marker)
        pid, sequence = command.producer_id, command.txn_sequence
        error = self.txns.register(pid, command.producer_epoch, sequence, self._clock_ms)
        return TxnRegistered(pid, sequence) if error == ErrorCode.NONE else Rejected(error)

    def _end_txn(
        self, producer_id: int, txn_sequence: int, marker: tuple[int, bool, int]
    ) -> OffsetsResult:
        """A WriteTxnMarker: the transaction's pending offsets are committed or dropped."""
        epoch, commit, coordinator_epoch = marker
        was_open = self.txns.in_transaction(producer_id)
        verdict = self.txns.check_end(producer_id, epoch, txn_sequence, commit, coordinator_epoch)
        if isinstance(verdict, ErrorCode):
            return Rejected(verdict)
        self.txns.end(producer_id, txn_sequence, marker, NO_MARKER_OFFSET, self._clock_ms)
        if was_open:  # (check_end accepts an open transaction only where the marker names it)
            for group_id in sorted(self._pending_groups.pop(producer_id, ())):
                entry = self.groups[group_id]
                for tp, c in entry.pending.pop(producer_id).items():
                    if commit:
                        entry.offsets[tp] = c._replace(commit_ms=self._clock_ms)
                self._drop_if_removable(group_id, entry)
        return TxnEnded(producer_id, txn_sequence)

    def _delete_topic(self, topic: str) -> OffsetsResult:
        """Every group's offsets of a deleted topic, committed and pending."""
        for entry in self.groups.values():
            pending = set[TopicPartition]().union(*entry.pending.values())
            entry.supersede_pending(tp for tp in pending if tp[0] == topic)
        return self._remove(lambda _entry, c: c.topic == topic)

    def _delete_group(self, group_id: str) -> OffsetsResult:
        entry = self.groups.get(group_id)
        if entry is None:
            return Rejected(ErrorCode.GROUP_ID_NOT_FOUND)
        if entry.pending:
            return Rejected(ErrorCode.NON_EMPTY_GROUP)  # an open transaction still commits here
        del self.groups[group_id]
        return GroupDeleted(group_id)

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
        entry.supersede_pending(doomed)
        if entry.removable:
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
            if entry.removable:
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
                [
                    [pid, [list(c) for _, c in sorted(offsets.items())]]
                    for pid, offsets in sorted(entry.pending.items())
                ],
            ]
            for group_id, entry in sorted(self.groups.items())
        ]
        return pack([SNAPSHOT_VERSION, self._clock_ms, groups, self.txns.to_data()])

    @classmethod
    def restore(cls, data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> OffsetsStateMachine:
        fields = _snapshot_fields(data)
        machine = cls(limits)
        machine._clock_ms = expect_int(fields[0], "offsets clock")
        try:
            for group_id, record, empty_since_ms, offsets, *pending in fields[1]:
                entry = GroupEntry(
                    None if record is None else group_record_of(record),
                    expect_int(empty_since_ms, "empty since"),
                )
                entry.offsets = _committed(offsets)
                for pid, txn_offsets in pending[0] if pending else ():
                    entry.pending[expect_int(pid, "producer id")] = _committed(txn_offsets)
                    machine._pending_groups.setdefault(pid, set()).add(group_id)
                machine.groups[group_id] = entry
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"offsets snapshot: {exc}") from exc
        if fields[2] is not None:
            machine.txns = PartitionTxns.from_data(fields[2], limits)
        if any(not machine.txns.in_transaction(pid) for pid in machine._pending_groups):
            raise SnapshotError("offsets snapshot: pending offsets outside a transaction")
        return machine


def _snapshot_fields(data: bytes) -> tuple[Any, ...]:
    """A snapshot's fields; version 1's with None for no transactions."""
    version, fields = unpack_versioned_snapshot(data, {1: 2, SNAPSHOT_VERSION: 3}, "offsets")
    return (*fields, None) if version == 1 else fields


def _committed(rows: Any) -> dict[TopicPartition, CommittedOffset]:
    return {
        (topic, partition): CommittedOffset(topic, partition, offset, epoch, metadata, commit_ms)
        for topic, partition, offset, epoch, metadata, commit_ms in rows
    }


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
