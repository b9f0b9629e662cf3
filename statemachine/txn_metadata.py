"""A transactional id's transaction, as its coordinator keeps it: Kafka's TransactionMetadata.

The states and the moves between them are Kafka's (`TransactionState`): a transaction goes
Empty -> Ongoing (AddPartitionsToTxn) -> PrepareCommit or PrepareAbort (EndTxn, or an abort the
coordinator starts: a timeout, or a successor's InitProducerId fencing this producer) ->
CompleteCommit or CompleteAbort (once every partition holds its marker), and from there a new
transaction goes Ongoing again. `TRANSITIONS` names each state's valid previous states; a move
outside it is a bug (an assert), since every caller checks first and answers with Kafka's
error. Dead (an expired id) is never kept: the id is removed.

Each transaction gets a number, its txn sequence, counted per producer id from 0 (a new
producer id starts again at 0): the partitions' registrations and markers carry it
(statemachine/partition_txns.py), so a stale one names an older transaction and is refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from statemachine.errors import ErrorCode
from statemachine.txn_registry import ProducerIdAndEpoch


class TxnState(enum.IntEnum):
    """Kafka's transaction states, with its ids (DescribeTransactions names them)."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name Kafka's tools print (`kafka-transactions.sh describe`)."""
        return "".join(part.capitalize() for part in self.name.split("_"))


S = TxnState
# Each state and the states it may be entered from (Kafka's TransactionState.validPreviousStates).
TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    # (Empty and CompleteX -> PrepareAbort: Kafka 4's epoch-bumping transactions, KIP-890.)
    S.PREPARE_ABORT: frozenset(
        {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    ),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
PREPARING = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
COMPLETE = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})  # no transaction open

TopicPartition = tuple[str, int]
NO_TXN_SEQUENCE = -1  # no transaction yet under this producer id


@dataclass(slots=True)
class TxnMetadata:
    """One transactional id: its producer, and its transaction (the current or the last)."""

    producer_id: int
    epoch: int
    last_epoch: int  # the epoch before the last bump (-1: none), for KIP-360's retries
    previous_producer_id: int  # before the last rotation (-1: none)
    timeout_ms: int
    state: TxnState
    partitions: tuple[TopicPartition, ...]  # sorted: those of the current transaction
    txn_sequence: int  # the current or last transaction's number under this producer id
    txn_start_ms: int  # when the current transaction went Ongoing (-1: none open)
    last_update_ms: int

    @property
    def current(self) -> ProducerIdAndEpoch:
        return ProducerIdAndEpoch(self.producer_id, self.epoch)

    def move(self, state: TxnState, now_ms: int) -> None:
        """Enter `state`; a move Kafka does not allow is a bug of the caller's checks."""
        assert self.state in TRANSITIONS[state], f"{self.state.name} -> {state.name}"
        self.state = state
        self.last_update_ms = now_ms

    def begin(self, partitions: tuple[TopicPartition, ...], now_ms: int) -> None:
        """Ongoing with these partitions: a new transaction if none was open."""
        if self.state != S.ONGOING:
            self.txn_sequence += 1
            self.txn_start_ms = now_ms
            self.partitions = ()
        self.move(S.ONGOING, now_ms)
        self.partitions = tuple(sorted({*self.partitions, *partitions}))

    def end_complete(self, now_ms: int) -> None:
        """PrepareX -> CompleteX: every marker is written."""
        # The start time stays (Kafka's CompleteX keeps it; only a new epoch clears it).
        self.move(S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT, now_ms)

    def check_producer(self, producer_id: int, epoch: int) -> ErrorCode:
        """The request's producer against this id's (AddPartitionsToTxn, EndTxn): another
        producer id is INVALID_PRODUCER_ID_MAPPING, another epoch PRODUCER_FENCED."""
        if producer_id != self.producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch != self.epoch:
            return ErrorCode.PRODUCER_FENCED
        return ErrorCode.NONE

    def to_data(self) -> list[object]:
        return [
            self.producer_id,
            self.epoch,
            self.last_epoch,
            self.previous_producer_id,
            self.timeout_ms,
            int(self.state),
            [list(tp) for tp in self.partitions],
            self.txn_sequence,
            self.txn_start_ms,
            self.last_update_ms,
        ]

    @classmethod
    def from_data(cls, data: object) -> TxnMetadata:
        """`to_data`'s form; ValueError or TypeError for another."""
        if not isinstance(data, tuple) or len(data) != 10:
            raise ValueError("a transactional id is 10 fields")
        pid, epoch, last_epoch, previous, timeout, state, partitions, seq, start, update = data
        return cls(
            pid,
            epoch,
            last_epoch,
            previous,
            timeout,
            TxnState(state),
            tuple((str(t), int(p)) for t, p in partitions),
            seq,
            start,
            update,
        )
