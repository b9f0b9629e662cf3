"""TxnStateMachine: what every replica of a transaction state partition applies.

Role: the replicated half of the transaction coordinator, as Kafka's `__transaction_state`
partitions hold it: each transactional id that hashes to this partition has its producer (id,
epoch, and what KIP-360 needs to recognise a retry) and its transaction
(statemachine/txn_metadata.py: state, partitions, txn sequence, start time). The coordinator
runs on this partition's leader: it proposes an entry per request, answers from the result,
and carries out what a result asks (registering partitions, writing markers).

Rules (Kafka's TransactionCoordinator, docs/semantics.md "The transaction coordinator"):
- apply decides every transition from the entry and the state alone, so a retried or
  reordered entry is judged as Kafka's coordinator judges the request; the coordinator checks
  the same rules before it proposes, to answer a refusal without an entry;
- a transaction in PrepareCommit or PrepareAbort stays there until `CompleteTxn`: a new leader
  finds it in `preparing()` and writes its markers again (they are harmless to repeat);
- time is the leaders' stamps, kept as a clock that never runs backwards; `timed_out` lists
  the open transactions past their timeout by that clock;
- an id expires only with no transaction open (Empty, CompleteCommit, CompleteAbort).
"""

from __future__ import annotations

from typing import NamedTuple

from statemachine.codec import CodecError, SnapshotError, expect_int, pack, unpack, unpack_snapshot
from statemachine.commands import (
    AddTxnPartitions,
    CommandDecodeError,
    CompleteTxn,
    ExpireTransactionalIds,
    FenceTxn,
    InitTxnProducer,
    Noop,
    PrepareTxnEnd,
    decode_command,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.metadata import TransactionalIdsExpired, topic_name_error, transactional_id_error
from statemachine.partition import NoopApplied
from statemachine.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, PRODUCER_EPOCH_MAX
from statemachine.txn_metadata import (
    COMPLETE,
    NO_TXN_SEQUENCE,
    PREPARING,
    TopicPartition,
    TxnMetadata,
    TxnState,
)
from statemachine.txn_registry import EPOCH_ROTATION_THRESHOLD, ProducerIdAndEpoch

SNAPSHOT_VERSION = 1
INT32_MAX = 2**31 - 1
_TXN_COMMANDS = (InitTxnProducer, AddTxnPartitions, PrepareTxnEnd, CompleteTxn, FenceTxn)


class TxnPartitionsAdded(NamedTuple):
    """The transaction holds these partitions now: `added` must be registered with their
    leaders before AddPartitionsToTxn is answered (none: nothing new)."""

    transactional_id: str
    producer_id: int
    epoch: int
    txn_sequence: int
    added: tuple[TopicPartition, ...]


class TxnEndPrepared(NamedTuple):
    """PrepareCommit or PrepareAbort is committed: every partition gets its marker, then
    `CompleteTxn`. From InitProducerId's fencing of an open transaction too (`epoch` bumped)."""

    transactional_id: str
    producer_id: int
    epoch: int
    txn_sequence: int
    commit: bool
    partitions: tuple[TopicPartition, ...]


class TxnAlreadyEnded(NamedTuple):
    """EndTxn retried after its transaction completed as asked: answered NONE."""

    transactional_id: str


class TxnCompleted(NamedTuple):
    transactional_id: str
    commit: bool


TxnStateResult = (
    ProducerIdAndEpoch
    | TxnPartitionsAdded
    | TxnEndPrepared
    | TxnAlreadyEnded
    | TxnCompleted
    | TransactionalIdsExpired
    | NoopApplied
    | Rejected
)


class TxnStateMachine:
    """Transactional id -> TxnMetadata, for the ids of one transaction state partition."""

    __slots__ = ("_clock_ms", "_limits", "txns")

    def __init__(self, limits: StateLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._clock_ms = 0
        self.txns: dict[str, TxnMetadata] = {}

    @property
    def clock_ms(self) -> int:
        return self._clock_ms

    def apply(self, entry: bytes | memoryview) -> TxnStateResult:
        try:
            command = decode_command(entry, self._limits)
        except CommandDecodeError:
            return Rejected(ErrorCode.INVALID_REQUEST)
        if isinstance(command, Noop):
            return NoopApplied(command.marker)
        if isinstance(command, ExpireTransactionalIds):
            self._clock_ms = max(self._clock_ms, command.now_ms)
            return self._expire(command.transactional_id_expiration_ms)
        if not isinstance(command, _TXN_COMMANDS):
            return Rejected(ErrorCode.INVALID_REQUEST)  # another group's command
        self._clock_ms = max(self._clock_ms, command.now_ms)
        if transactional_id_error(command.transactional_id, self._limits):
            return Rejected(ErrorCode.INVALID_REQUEST)
        match command:
            case InitTxnProducer():
                return self._init_producer(command)
            case AddTxnPartitions():
                return self._add_partitions(command)
            case PrepareTxnEnd():
                return self._prepare_end(command)
            case CompleteTxn():
                return self._complete(command)
            case FenceTxn():
                return self._fence(command)
        raise AssertionError(f"unhandled {command!r}")

    # -- InitProducerId ----------------------------------------------------------------------

    def _init_producer(self, cmd: InitTxnProducer) -> TxnStateResult:
        """Kafka's `prepareInitProducerIdTransit`, its checks in its order."""
        if not 0 < cmd.transaction_timeout_ms <= self._limits.transaction_timeout_ms_max:
            return Rejected(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        expected = ProducerIdAndEpoch(cmd.expected_producer_id, cmd.expected_epoch)
        if (expected.producer_id == NO_PRODUCER_ID) != (expected.epoch == NO_PRODUCER_EPOCH):
            return Rejected(ErrorCode.INVALID_REQUEST)
        given = expected.producer_id != NO_PRODUCER_ID
        txn = self.txns.get(cmd.transactional_id)
        if txn is None:
            if len(self.txns) >= self._limits.transactional_ids_max:
                return Rejected(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
            return self._fresh(cmd, None, NO_PRODUCER_EPOCH)
        if given and not _valid_producer(txn, expected):
            return Rejected(ErrorCode.PRODUCER_FENCED)
        if txn.state in PREPARING:
            return Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)  # retried once it completes
        if txn.state == TxnState.ONGOING:
            # A successor: the open transaction is aborted under a bumped epoch first (the
            # caller answers CONCURRENT_TRANSACTIONS; the client's retry bumps again).
            txn.timeout_ms = cmd.transaction_timeout_ms
            return self._abort_fencing(cmd.transactional_id, txn)
        if txn.epoch >= EPOCH_ROTATION_THRESHOLD and (not given or expected.epoch == txn.epoch):
            return self._fresh(cmd, txn, txn.epoch if given else NO_PRODUCER_EPOCH)
        if given and expected.epoch != txn.epoch:
            if expected.epoch != txn.last_epoch:
                return Rejected(ErrorCode.PRODUCER_FENCED)  # refused: touches nothing
            txn.timeout_ms, txn.last_update_ms = cmd.transaction_timeout_ms, self._clock_ms
            return txn.current  # a retry of the call that bumped: no second bump
        txn.timeout_ms, txn.txn_start_ms, txn.partitions = cmd.transaction_timeout_ms, -1, ()
        txn.last_epoch = txn.epoch if given else NO_PRODUCER_EPOCH
        txn.epoch += 1
        txn.move(TxnState.EMPTY, self._clock_ms)
        return txn.current

    def _fresh(
        self, cmd: InitTxnProducer, old: TxnMetadata | None, last_epoch: int
    ) -> ProducerIdAndEpoch:
        """A new producer id at epoch 0 (a new id, or one whose epochs ran out)."""
        txn = TxnMetadata(
            cmd.fresh_producer_id,
            0,
            last_epoch,
            NO_PRODUCER_ID if old is None else old.producer_id,
            cmd.transaction_timeout_ms,
            TxnState.EMPTY,
            (),
            NO_TXN_SEQUENCE,
            -1,
            self._clock_ms,
        )
        self.txns[cmd.transactional_id] = txn
        return txn.current

    def _abort_fencing(self, txn_id: str, txn: TxnMetadata) -> TxnEndPrepared:
        # As Kafka's fence: the next epoch, unless the last one is reached (a forged request
        # may hold it); InitProducerId rotates from there.
        txn.last_epoch, txn.epoch = NO_PRODUCER_EPOCH, min(txn.epoch + 1, PRODUCER_EPOCH_MAX)
        txn.move(TxnState.PREPARE_EPOCH_FENCE, self._clock_ms)
        txn.move(TxnState.PREPARE_ABORT, self._clock_ms)
        return _prepared(txn_id, txn)

    # -- AddPartitionsToTxn, EndTxn ------------------------------------------------------------

    def _add_partitions(self, cmd: AddTxnPartitions) -> TxnStateResult:
        partitions = self._partitions(cmd.partitions)
        if partitions is None:
            return Rejected(ErrorCode.INVALID_REQUEST)
        txn = self._of_producer(cmd.transactional_id, cmd.producer_id, cmd.producer_epoch)
        if isinstance(txn, Rejected):
            return txn
        if txn.state in PREPARING:
            return Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)
        if txn.epoch == PRODUCER_EPOCH_MAX:
            return Rejected(ErrorCode.PRODUCER_FENCED)  # the fence's epoch, never handed out
        open_now = txn.state == TxnState.ONGOING
        added = tuple(tp for tp in partitions if not open_now or tp not in txn.partitions)
        if not added:
            return TxnPartitionsAdded(cmd.transactional_id, *txn.current, txn.txn_sequence, ())
        kept = len(txn.partitions) if open_now else 0
        if kept + len(added) > self._limits.txn_partitions_max:
            return Rejected(ErrorCode.POLICY_VIOLATION)
        txn.begin(added, self._clock_ms)
        return TxnPartitionsAdded(cmd.transactional_id, *txn.current, txn.txn_sequence, added)

    def _of_producer(self, txn_id: str, producer_id: int, epoch: int) -> TxnMetadata | Rejected:
        """The id's metadata if the request's producer is its current one (AddPartitionsToTxn,
        EndTxn): an unknown id or another producer id is INVALID_PRODUCER_ID_MAPPING, another
        epoch PRODUCER_FENCED."""
        txn = self.txns.get(txn_id)
        if txn is None:
            return Rejected(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        error = txn.check_producer(producer_id, epoch)
        return txn if error == ErrorCode.NONE else Rejected(error)

    def _partitions(self, data: bytes) -> tuple[TopicPartition, ...] | None:
        """An entry's non-empty msgpack list of `[topic, partition]`, sorted, no repeats."""
        try:
            value = unpack(data, size_max=self._limits.entry_bytes_max)
        except CodecError:
            return None
        if not isinstance(value, tuple) or not 0 < len(value) <= self._limits.txn_partitions_max:
            return None
        found: set[TopicPartition] = set()
        for item in value:
            if not (isinstance(item, tuple) and len(item) == 2):
                return None
            topic, partition = item
            if type(topic) is not str or topic_name_error(topic, self._limits):
                return None
            if not (type(partition) is int and 0 <= partition <= INT32_MAX):
                return None
            found.add((topic, partition))
        return tuple(sorted(found))

    def _prepare_end(self, cmd: PrepareTxnEnd) -> TxnStateResult:
        txn = self._of_producer(cmd.transactional_id, cmd.producer_id, cmd.producer_epoch)
        if isinstance(txn, Rejected):
            return txn
        commit = bool(cmd.commit)
        asked = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if txn.state == TxnState.ONGOING:
            txn.move(asked, self._clock_ms)
            return _prepared(cmd.transactional_id, txn)
        if txn.state == done:
            return TxnAlreadyEnded(cmd.transactional_id)  # a retry of an answered EndTxn
        if txn.state == asked:
            return Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)  # a retry while markers go out
        return Rejected(ErrorCode.INVALID_TXN_STATE)  # Empty, or the other outcome

    def _complete(self, cmd: CompleteTxn) -> TxnStateResult:
        txn = self.txns.get(cmd.transactional_id)
        if (
            txn is None
            or txn.producer_id != cmd.producer_id
            or txn.txn_sequence != cmd.txn_sequence
            or txn.state not in PREPARING
        ):
            return Rejected(ErrorCode.INVALID_TXN_STATE)  # completed already, or stale
        commit = txn.state == TxnState.PREPARE_COMMIT
        txn.end_complete(self._clock_ms)
        return TxnCompleted(cmd.transactional_id, commit)

    def _fence(self, cmd: FenceTxn) -> TxnStateResult:
        txn = self.txns.get(cmd.transactional_id)
        if txn is None or txn.state != TxnState.ONGOING:
            return Rejected(ErrorCode.INVALID_TXN_STATE)  # it ended meanwhile
        error = txn.check_producer(cmd.producer_id, cmd.producer_epoch)
        if error != ErrorCode.NONE:
            return Rejected(error)
        return self._abort_fencing(cmd.transactional_id, txn)

    # -- what the coordinator asks of the state ----------------------------------------------

    def preparing(self) -> list[TxnEndPrepared]:
        """The transactions whose markers are due: a new leader writes them again."""
        return [
            _prepared(txn_id, txn)
            for txn_id, txn in sorted(self.txns.items())
            if txn.state in PREPARING
        ]

    def timed_out(self, now_ms: int) -> list[tuple[str, int, int]]:
        """(transactional id, producer id, epoch) of each open transaction past its timeout
        at `now_ms` (or the group clock, if later): the coordinator fences and aborts them."""
        now_ms = max(now_ms, self._clock_ms)
        return [
            (txn_id, txn.producer_id, txn.epoch)
            for txn_id, txn in sorted(self.txns.items())
            if txn.state == TxnState.ONGOING and now_ms - txn.txn_start_ms > txn.timeout_ms
        ]

    def expiry_due(self, now_ms: int, expiration_ms: int) -> bool:
        now_ms = max(now_ms, self._clock_ms)
        return any(self._idle(now_ms, expiration_ms))

    def _idle(self, now_ms: int, expiration_ms: int) -> list[str]:
        return [
            txn_id
            for txn_id, txn in self.txns.items()
            if txn.state in COMPLETE and now_ms - txn.last_update_ms >= expiration_ms
        ]

    def _expire(self, expiration_ms: int) -> TransactionalIdsExpired:
        expired = sorted(self._idle(self._clock_ms, expiration_ms))
        for txn_id in expired:
            del self.txns[txn_id]
        return TransactionalIdsExpired(tuple(expired))

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Canonical bytes of the whole state: equal on replicas that applied equal entries."""
        txns = [[txn_id, *txn.to_data()] for txn_id, txn in sorted(self.txns.items())]
        return pack([SNAPSHOT_VERSION, self._clock_ms, txns])

    @classmethod
    def restore(cls, data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> TxnStateMachine:
        clock_ms, txns = unpack_snapshot(data, SNAPSHOT_VERSION, 2, "transaction state")
        machine = cls(limits)
        machine._clock_ms = expect_int(clock_ms, "transaction state clock")
        try:
            if len(txns) > limits.transactional_ids_max:
                raise SnapshotError("transaction state: more ids than the limit")
            for txn_id, *fields in txns:
                machine.txns[str(txn_id)] = TxnMetadata.from_data(tuple(fields))
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"transaction state snapshot: {exc}") from exc
        return machine


def _valid_producer(txn: TxnMetadata, expected: ProducerIdAndEpoch) -> bool:
    """Kafka's `isValidProducerId`: the caller's producer id is this id's, or the one before a
    rotation that the caller's exhausted epoch explains."""
    if expected.producer_id == txn.producer_id:
        return True
    rotated_from = expected.producer_id == txn.previous_producer_id
    return rotated_from and expected.epoch >= EPOCH_ROTATION_THRESHOLD


def _prepared(txn_id: str, txn: TxnMetadata) -> TxnEndPrepared:
    commit = txn.state == TxnState.PREPARE_COMMIT
    return TxnEndPrepared(txn_id, *txn.current, txn.txn_sequence, commit, txn.partitions)
