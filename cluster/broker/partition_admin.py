"""What a partition's serving leader answers about its records: ListOffsets (and its max
timestamp), OffsetForLeaderEpoch, DescribeProducers and DeleteRecords.

Role: part of the broker core (core.py's `Broker` mixes it in), which both listeners call;
each call asks the partition's serving leader (a replica that has applied every entry of
earlier terms: its log end is the high watermark), and a node that is not it answers
NOT_LEADER_OR_FOLLOWER with where the leader is.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from cluster.broker.calls import (
    EARLIEST,
    LATEST,
    EpochFound,
    EpochWant,
    OffsetFound,
    OffsetWant,
    PartitionProducers,
    ProducerView,
)
from cluster.broker.node import Node, PartitionHandle
from cluster.broker.storage import StoredBatch
from cluster.errors import RaftbrokerError
from statemachine.commands import AdvanceLogStart
from statemachine.errors import ErrorCode
from statemachine.partition import LogStartAdvanced
from statemachine.partition_txns import TxnProducer
from statemachine.records import BatchFormatError, decode_records

HIGH_WATERMARK = -1  # DeleteRecords' offset for "everything committed so far"


def _epoch_error(current_leader_epoch: int, term: int) -> ErrorCode:
    """A reader's view of the leader epoch checked against the serving leader's term, as Kafka
    checks Fetch's, ListOffsets' and OffsetForLeaderEpoch's `current_leader_epoch` (KIP-320):
    -1 is unchecked; an older one FENCED_LEADER_EPOCH (the reader refreshes its metadata), a
    newer one UNKNOWN_LEADER_EPOCH (this leader has not heard of it yet: retriable)."""
    if current_leader_epoch < 0 or current_leader_epoch == term:
        return ErrorCode.NONE
    if current_leader_epoch < term:
        return ErrorCode.FENCED_LEADER_EPOCH
    return ErrorCode.UNKNOWN_LEADER_EPOCH


class PartitionAdmin:
    """Mixed into `Broker`, which gives it where partitions are led."""

    node: Node

    def _leading(self, topic: str, partition: int) -> PartitionHandle | ErrorCode:
        raise NotImplementedError  # Broker's

    def leader_hint(self, error: ErrorCode, topic: str, partition: int) -> str:
        raise NotImplementedError  # Broker's

    def _serving(
        self, found: PartitionHandle | ErrorCode, topic: str, partition: int, current: int
    ) -> PartitionHandle | tuple[ErrorCode, str]:
        """The replica found (`_leading`'s or `_hosting`'s answer) if it may serve a reader
        whose view of the leader epoch is `current`; else why not and where to ask ("")."""
        if isinstance(found, ErrorCode):
            return found, self.leader_hint(found, topic, partition)
        error = _epoch_error(current, found.group.term)
        return found if error == ErrorCode.NONE else (error, "")

    def list_offsets(self, wants: Iterable[OffsetWant]) -> list[OffsetFound]:
        return [self._offset(want) for want in wants]

    def _offset(self, want: OffsetWant) -> OffsetFound:
        topic, partition, spec = want.topic, want.partition, want.spec
        found = self._leading(topic, partition)
        handle = self._serving(found, topic, partition, want.current_leader_epoch)
        if not isinstance(handle, PartitionHandle):
            return OffsetFound(topic, partition, handle[0], -1, handle[1])
        term, replica = handle.group.term, handle.replica
        if spec == LATEST:  # Kafka's leader has recorded its own epoch: the latest
            end = replica.last_stable_offset if want.read_committed else replica.high_watermark
            return OffsetFound(topic, partition, ErrorCode.NONE, end, "", term)
        if spec == EARLIEST:
            offset = replica.log_start_offset
        elif replica.restoring:  # batches below the local log may match: not known yet
            return OffsetFound(topic, partition, ErrorCode.LEADER_NOT_AVAILABLE, -1, "")
        else:
            offset = replica.offset_for_time(spec)
        epoch = replica.machine.epochs.epoch_at(offset) if offset < replica.high_watermark else -1
        return OffsetFound(topic, partition, ErrorCode.NONE, offset, "", epoch)

    def max_timestamp(self, want: OffsetWant) -> tuple[OffsetFound, int]:
        """ListOffsets' max timestamp (-3, KIP-734): the offset of the first record carrying
        the partition's largest producer timestamp and that record's leader epoch (-1s for a
        partition without records), and the timestamp."""
        topic, partition = want.topic, want.partition
        found = self._leading(topic, partition)
        handle = self._serving(found, topic, partition, want.current_leader_epoch)
        if not isinstance(handle, PartitionHandle):
            return OffsetFound(topic, partition, handle[0], -1, handle[1]), -1
        error, timestamp, offset = self._max_timestamp(handle)
        epoch = handle.replica.machine.epochs.epoch_at(offset)
        return OffsetFound(topic, partition, error, offset, "", epoch), timestamp

    def _max_timestamp(self, handle: PartitionHandle) -> tuple[ErrorCode, int, int]:
        """(error, the largest producer timestamp, the offset of the first record carrying
        it). The store names the batch; its records are read for the record (as Kafka's broker
        does since 3.8), and only records from the log start on count (Kafka counts a whole
        segment's)."""
        replica = handle.replica
        if replica.restoring:  # batches below the local log are not known yet
            return ErrorCode.LEADER_NOT_AVAILABLE, -1, -1
        start = replica.log_start_offset
        timestamp, base_offset = replica.store.max_timestamp(start)
        if 0 <= base_offset < start:  # that batch straddles the log start: its records
            straddling = self._largest_record(replica.store.read(start, 0), start)  # from there
            timestamp, base_offset = replica.store.max_timestamp(straddling[2])  # and the rest
            if straddling[0] >= timestamp:
                return ErrorCode.NONE, straddling[0], straddling[1]
        found = self._largest_record(replica.store.read(base_offset, 0), start)
        return ErrorCode.NONE, found[0], found[1]

    def _largest_record(self, read: list[StoredBatch], start: int) -> tuple[int, int, int]:
        """(the largest timestamp of the first batch of `read` from offset `start` on, the
        offset of the first record carrying it, the batch's end): -1s where there is none."""
        if not read:
            return -1, -1, start
        stored = read[0]
        try:
            records = decode_records(stored.batch, self.node.limits)
        except BatchFormatError:  # verified whole when it came: not one to answer with
            return -1, -1, stored.next_offset
        best = (-1, -1)
        for offset, record in enumerate(records, stored.base_offset):
            if offset >= start and record.timestamp_ms > best[0]:
                best = (record.timestamp_ms, offset)
        return best[0], best[1], stored.next_offset

    def epoch_end_offsets(self, wants: Iterable[EpochWant]) -> list[EpochFound]:
        return [self._epoch_end(want) for want in wants]

    def _epoch_end(self, want: EpochWant) -> EpochFound:
        """From the serving leader alone (its log end is the high watermark; a replica that
        has not applied its predecessors' entries yet would answer short), after the asker's
        view of the epoch is checked as Kafka checks it."""
        topic, partition, current, epoch = want
        leading = self._leading(topic, partition)
        if isinstance(leading, PartitionHandle) and epoch > leading.group.term:
            # a client that saw a later leader: this one is stale (retriable)
            return EpochFound(topic, partition, ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1, "")
        handle = self._serving(leading, topic, partition, current)
        if not isinstance(handle, PartitionHandle):
            return EpochFound(topic, partition, handle[0], -1, -1, handle[1])
        term, replica = handle.group.term, handle.replica
        found, end = replica.machine.epochs.end_offset(epoch, term, replica.high_watermark)
        return EpochFound(topic, partition, ErrorCode.NONE, found, end, "")

    async def describe_producers(
        self, topic: str, partitions: Iterable[int]
    ) -> list[PartitionProducers]:
        results = []
        for partition in partitions:
            handle = self._leading(topic, partition)
            if isinstance(handle, ErrorCode):
                hint = self.leader_hint(handle, topic, partition)
                results.append(PartitionProducers(partition, handle, hint, ()))
                continue
            producers = await handle.group.read(partial(_describe, handle))
            results.append(PartitionProducers(partition, ErrorCode.NONE, "", producers))
        return results

    async def delete_records(
        self, topic: str, partition: int, offset: int, timeout_s: float
    ) -> tuple[ErrorCode, int, str]:
        """Move the partition's log start to `offset` (HIGH_WATERMARK: the high watermark),
        as retention moves it: every replica stops serving the records below it and deletes
        the segments wholly below it. (error, the new log start, a leader hint)."""
        handle = self._leading(topic, partition)
        if isinstance(handle, ErrorCode):
            return handle, -1, self.leader_hint(handle, topic, partition)
        high_watermark = handle.replica.high_watermark
        target = high_watermark if offset == HIGH_WATERMARK else offset
        if not 0 <= target <= high_watermark:
            return ErrorCode.OFFSET_OUT_OF_RANGE, -1, ""
        try:
            result = await handle.group.propose(AdvanceLogStart(target).encode(), timeout_s)
        except RaftbrokerError as exc:  # ProposalError among them: this partition's answer
            return exc.error, -1, self.leader_hint(exc.error, topic, partition)
        assert isinstance(result, LogStartAdvanced), result
        return ErrorCode.NONE, result.log_start_offset, ""


def _describe(handle: PartitionHandle) -> tuple[ProducerView, ...]:
    """Between applies: the producer table as DescribeProducers shows it, with each
    producer's open transaction here (Kafka's currentTxnStartOffset)."""
    machine = handle.replica.machine
    return tuple(
        ProducerView(pid, entry.epoch, entry.last_sequence, entry.last_timestamp_ms,
                     tuple(entry.window), *_txn_of(machine.txns.producers.get(pid)))
        for pid, entry in machine.producers
    )  # fmt: skip


def _txn_of(entry: TxnProducer | None) -> tuple[int, int]:
    """(coordinator epoch, first offset of the open transaction), -1 for what is not there."""
    if entry is None:
        return -1, -1
    first = -1 if entry.open is None else entry.open.first_offset
    return entry.coordinator_epoch, first
