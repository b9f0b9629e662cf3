"""The transaction coordinator's replicated state (statemachine/txn_state.py): Kafka's
TransactionCoordinatorTest cases that concern the state machine, as they translate (the name
of Kafka's case in each docstring), and the rules raftbroker adds (txn sequences, limits)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statemachine.codec import pack
from statemachine.commands import (
    AddTxnPartitions,
    CompleteTxn,
    ExpireTransactionalIds,
    FenceTxn,
    InitTxnProducer,
    PrepareTxnEnd,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import StateLimits
from statemachine.metadata import TransactionalIdsExpired
from statemachine.txn_metadata import TxnState
from statemachine.txn_registry import EPOCH_ROTATION_THRESHOLD, ProducerIdAndEpoch
from statemachine.txn_state import (
    TxnAlreadyEnded,
    TxnCompleted,
    TxnEndPrepared,
    TxnPartitionsAdded,
    TxnStateMachine,
)
from tests.property.replica_logs import check_restore_everywhere, check_two_replicas

TXN = "payments"
TIMEOUT_MS = 60_000
ORDERS = ("orders", 0)
AUDIT = ("audit", 2)


class Coordinator:
    """A transaction state partition and a clock, to write the cases as Kafka's tests do."""

    def __init__(self, limits: StateLimits | None = None) -> None:
        self.machine = TxnStateMachine() if limits is None else TxnStateMachine(limits)
        self.now_ms = 1_000
        self.next_pid = 500

    def init(self, expected: tuple[int, int] = (-1, -1), timeout_ms: int = TIMEOUT_MS) -> object:
        self.next_pid += 1
        entry = InitTxnProducer(self.now_ms, TXN, timeout_ms, *expected, self.next_pid)
        return self.machine.apply(entry.encode())

    def add(self, pid: int, epoch: int, *partitions: tuple[str, int]) -> object:
        data = pack([list(p) for p in partitions])
        return self.machine.apply(AddTxnPartitions(self.now_ms, TXN, pid, epoch, data).encode())

    def end(self, pid: int, epoch: int, *, commit: bool) -> object:
        entry = PrepareTxnEnd(self.now_ms, TXN, pid, epoch, int(commit))
        return self.machine.apply(entry.encode())

    def complete(self, pid: int, sequence: int) -> object:
        return self.machine.apply(CompleteTxn(self.now_ms, TXN, pid, sequence).encode())

    def state(self) -> TxnState:
        return self.machine.txns[TXN].state

    def started(self) -> ProducerIdAndEpoch:
        """A producer with an open transaction on ORDERS."""
        producer = self.init()
        assert isinstance(producer, ProducerIdAndEpoch)
        assert isinstance(self.add(*producer, ORDERS), TxnPartitionsAdded)
        return producer

    def ended(self, *, commit: bool) -> ProducerIdAndEpoch:
        producer = self.started()
        prepared = self.end(*producer, commit=commit)
        assert isinstance(prepared, TxnEndPrepared)
        assert isinstance(self.complete(producer.producer_id, prepared.txn_sequence), TxnCompleted)
        return producer


def test_a_new_transactional_id_gets_a_fresh_producer_at_epoch_zero() -> None:
    """shouldInitPidWithEpochZeroForNewTransactionalId"""
    c = Coordinator()
    assert c.init() == ProducerIdAndEpoch(501, 0)
    assert c.state() == TxnState.EMPTY


@pytest.mark.parametrize("commit", [True, False])
def test_init_after_a_completed_transaction_bumps_the_epoch(commit: bool) -> None:
    """shouldIncrementEpochAndUpdateMetadataOnHandleInitPidWhenExistingCompleteTransaction"""
    c = Coordinator()
    producer = c.ended(commit=commit)
    assert c.init() == ProducerIdAndEpoch(producer.producer_id, 1)
    assert c.state() == TxnState.EMPTY


@pytest.mark.parametrize("commit", [True, False])
def test_init_while_markers_go_out_is_concurrent_transactions(commit: bool) -> None:
    """shouldRespondWithConcurrentTransactionsOnInitPidWhenInPrepareCommitState, and Abort"""
    c = Coordinator()
    producer = c.started()
    c.end(*producer, commit=commit)
    assert c.init() == Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)
    stranger = (producer.producer_id + 9, 0)  # Kafka checks the producer id first
    assert c.init(expected=stranger) == Rejected(ErrorCode.PRODUCER_FENCED)


def test_init_of_a_successor_aborts_the_open_transaction_under_a_bumped_epoch() -> None:
    """shouldAbortTransactionOnHandleInitPidWhenExistingTransactionInOngoingState: the epoch
    is bumped for the abort's markers, the caller retries, and its retry bumps again."""
    c = Coordinator()
    producer = c.started()
    prepared = c.init()
    assert prepared == TxnEndPrepared(TXN, producer.producer_id, 1, 0, False, (ORDERS,))
    assert c.state() == TxnState.PREPARE_ABORT
    assert c.init() == Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)
    assert c.end(*producer, commit=True) == Rejected(ErrorCode.PRODUCER_FENCED)  # the zombie
    c.complete(producer.producer_id, 0)
    assert c.state() == TxnState.COMPLETE_ABORT
    assert c.init() == ProducerIdAndEpoch(producer.producer_id, 2)


def test_kip_360_a_retry_gets_its_pair_again_and_a_stranger_is_fenced() -> None:
    """shouldNotBumpEpochOnRetryOfInitPidWithExpectedEpoch... (a retry answered with the pair
    it got), and fenced: another producer id, or an epoch that is neither current nor last."""
    c = Coordinator()
    first = c.init()
    assert isinstance(first, ProducerIdAndEpoch)
    second = c.init(expected=first)  # bumps: first is current
    assert second == ProducerIdAndEpoch(first.producer_id, 1)
    assert c.init(expected=first) == second  # a retry of that call: no second bump
    assert c.init(expected=(first.producer_id, 7)) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.init(expected=(first.producer_id + 9, 1)) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.init(expected=(first.producer_id, -1)) == Rejected(ErrorCode.INVALID_REQUEST)
    # Without an expected pair Kafka keeps no last epoch: the pair before is fenced after it.
    third = c.init()
    assert third == ProducerIdAndEpoch(first.producer_id, 2)
    assert c.init(expected=second) == Rejected(ErrorCode.PRODUCER_FENCED)


def test_an_exhausted_epoch_rotates_to_a_new_producer_id() -> None:
    """shouldGenerateNewProducerIdIfEpochsExhausted"""
    c = Coordinator()
    first = c.init()
    assert isinstance(first, ProducerIdAndEpoch)
    c.machine.txns[TXN].epoch = EPOCH_ROTATION_THRESHOLD
    exhausted = ProducerIdAndEpoch(first.producer_id, EPOCH_ROTATION_THRESHOLD)
    rotated = c.init(expected=exhausted)
    assert rotated == ProducerIdAndEpoch(c.next_pid, 0)
    assert c.init(expected=exhausted) == rotated  # the retry is recognised across it


def test_add_partitions_needs_the_ids_producer_and_epoch() -> None:
    """shouldRespondWithInvalidPidMappingOnAddPartitionsToTransactionWhenTransactionalId
    NotPresent, ...WhenProducerIdDiffers, and with PRODUCER_FENCED when the epochs differ"""
    c = Coordinator()
    assert c.add(1, 0, ORDERS) == Rejected(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    producer = c.init()
    assert isinstance(producer, ProducerIdAndEpoch)
    assert c.add(producer.producer_id + 1, 0, ORDERS) == Rejected(
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )
    assert c.add(producer.producer_id, 1, ORDERS) == Rejected(ErrorCode.PRODUCER_FENCED)


@pytest.mark.parametrize("commit", [True, False])
def test_add_partitions_while_markers_go_out_is_concurrent_transactions(commit: bool) -> None:
    """shouldRespondWithConcurrentTransactionsOnAddPartitionsWhenStateIsPrepareCommit/Abort"""
    c = Coordinator()
    producer = c.started()
    c.end(*producer, commit=commit)
    assert c.add(*producer, AUDIT) == Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)


def test_each_transaction_gets_the_next_txn_sequence_and_its_own_partitions() -> None:
    """shouldUpdateMetadataOnAddPartitionsWhenStateIsComplete*: a new transaction begins, with
    only its own partitions; partitions already in it write nothing new."""
    c = Coordinator()
    producer = c.init()
    assert isinstance(producer, ProducerIdAndEpoch)
    added = c.add(*producer, ORDERS, AUDIT)
    assert added == TxnPartitionsAdded(TXN, *producer, 0, (AUDIT, ORDERS))
    assert c.add(*producer, ORDERS) == TxnPartitionsAdded(TXN, *producer, 0, ())
    c.now_ms += 5
    prepared = c.end(*producer, commit=True)
    assert prepared == TxnEndPrepared(TXN, *producer, 0, True, (AUDIT, ORDERS))
    c.complete(producer.producer_id, 0)
    assert c.add(*producer, ORDERS) == TxnPartitionsAdded(TXN, *producer, 1, (ORDERS,))
    assert c.machine.txns[TXN].txn_start_ms == c.now_ms


@pytest.mark.parametrize(
    ("setup", "commit", "answer"),
    [
        ("complete-commit", True, "done"),  # shouldReplyWithNoneOnEndTxn..CompleteCommit
        ("complete-commit", False, ErrorCode.INVALID_TXN_STATE),
        ("complete-abort", False, "done"),
        ("complete-abort", True, ErrorCode.INVALID_TXN_STATE),
        ("prepare-commit", True, ErrorCode.CONCURRENT_TRANSACTIONS),
        ("prepare-commit", False, ErrorCode.INVALID_TXN_STATE),
        ("prepare-abort", False, ErrorCode.CONCURRENT_TRANSACTIONS),
        ("prepare-abort", True, ErrorCode.INVALID_TXN_STATE),
        ("empty", True, ErrorCode.INVALID_TXN_STATE),
        ("empty", False, ErrorCode.INVALID_TXN_STATE),
    ],
)
def test_end_txn_in_each_state_answers_as_kafka(
    setup: str, commit: bool, answer: ErrorCode | str
) -> None:
    c = Coordinator()
    if setup.startswith("complete"):
        producer = c.ended(commit=setup.endswith("commit"))
    elif setup.startswith("prepare"):
        producer = c.started()
        c.end(*producer, commit=setup.endswith("commit"))
    else:
        first = c.init()
        assert isinstance(first, ProducerIdAndEpoch)
        producer = first
    result = c.end(*producer, commit=commit)
    expected = TxnAlreadyEnded(TXN) if isinstance(answer, str) else Rejected(answer)
    assert result == expected


def test_end_txn_of_an_unknown_id_or_another_producer_is_refused() -> None:
    c = Coordinator()
    assert c.end(1, 0, commit=True) == Rejected(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    producer = c.started()
    assert c.end(producer.producer_id + 1, 0, commit=True) == Rejected(
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )
    assert c.end(producer.producer_id, 3, commit=True) == Rejected(ErrorCode.PRODUCER_FENCED)


def test_completion_is_for_the_prepared_transaction_only() -> None:
    c = Coordinator()
    producer = c.started()
    assert c.complete(producer.producer_id, 0) == Rejected(ErrorCode.INVALID_TXN_STATE)
    c.end(*producer, commit=False)
    assert c.complete(producer.producer_id, 1) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert c.complete(producer.producer_id, 0) == TxnCompleted(TXN, False)
    assert c.complete(producer.producer_id, 0) == Rejected(ErrorCode.INVALID_TXN_STATE)


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced() -> None:
    """shouldAbortExpiredTransactionsInOngoingStateAndBumpEpoch"""
    c = Coordinator()
    producer = c.started()
    assert c.machine.timed_out(c.now_ms + TIMEOUT_MS) == []  # Kafka: start + timeout < now
    due = c.machine.timed_out(c.now_ms + TIMEOUT_MS + 1)
    assert due == [(TXN, *producer)]
    fence = FenceTxn(c.now_ms + TIMEOUT_MS + 1, TXN, *producer)
    prepared = c.machine.apply(fence.encode())
    assert prepared == TxnEndPrepared(TXN, producer.producer_id, 1, 0, False, (ORDERS,))
    assert c.machine.apply(fence.encode()) == Rejected(ErrorCode.INVALID_TXN_STATE)  # ended
    assert c.end(*producer, commit=True) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.machine.timed_out(c.now_ms + 10 * TIMEOUT_MS) == []


def test_an_id_expires_only_with_no_transaction_open() -> None:
    """shouldRemoveTransactionsForPartitionOnEmigration is the partition's; here: Kafka's
    TransactionStateManagerTest shouldOnlyConsiderTransactionsInTheEmptyStateForExpiry and
    ...CompleteCommit/CompleteAbort"""
    c = Coordinator()
    c.started()
    later = ExpireTransactionalIds(c.now_ms + 10**9, 1_000).encode()
    assert c.machine.apply(later) == TransactionalIdsExpired(())
    producer = c.machine.txns[TXN].current
    c.end(*producer, commit=True)
    assert c.machine.apply(later) == TransactionalIdsExpired(())  # PrepareCommit stays
    c.complete(producer.producer_id, 0)
    even_later = ExpireTransactionalIds(c.now_ms + 2 * 10**9, 1_000).encode()
    assert c.machine.apply(even_later) == TransactionalIdsExpired((TXN,))


def test_a_new_leader_finds_the_markers_still_due() -> None:
    c = Coordinator()
    producer = c.started()
    prepared = c.end(*producer, commit=True)
    restored = TxnStateMachine.restore(c.machine.snapshot())
    assert restored.snapshot() == c.machine.snapshot()
    assert restored.preparing() == [prepared]


def test_bounds_and_bad_input_are_refused() -> None:
    limits = StateLimits(transactional_ids_max=1, txn_partitions_max=2)
    c = Coordinator(limits)
    assert c.init(timeout_ms=0) == Rejected(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    assert c.init(timeout_ms=900_001) == Rejected(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    producer = c.init()
    assert isinstance(producer, ProducerIdAndEpoch)
    other = InitTxnProducer(c.now_ms, "other", TIMEOUT_MS, -1, -1, 9).encode()
    assert c.machine.apply(other) == Rejected(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
    assert c.add(*producer, ORDERS, AUDIT, ("more", 0)) == Rejected(ErrorCode.INVALID_REQUEST)
    c.add(*producer, ORDERS, AUDIT)
    assert c.add(*producer, ("more", 0)) == Rejected(ErrorCode.POLICY_VIOLATION)
    assert c.add(*producer) == Rejected(ErrorCode.INVALID_REQUEST)  # no partition
    assert c.add(*producer, ("bad name", 0)) == Rejected(ErrorCode.INVALID_REQUEST)
    assert c.add(*producer, ("orders", -1)) == Rejected(ErrorCode.INVALID_REQUEST)
    empty_id = InitTxnProducer(c.now_ms, "", TIMEOUT_MS, -1, -1, 9).encode()
    assert c.machine.apply(empty_id) == Rejected(ErrorCode.INVALID_REQUEST)


# -- replicas converge, snapshots are as good as replay ----------------------------------------

IDS = st.sampled_from(["a", "b"])
PIDS = st.integers(500, 503)
EPOCHS = st.integers(0, 2)
PARTITION_LISTS = st.lists(st.sampled_from([ORDERS, AUDIT, ("x", 1)]), max_size=3).map(
    lambda ps: pack([list(p) for p in ps])
)
ENTRIES = st.one_of(
    st.builds(
        InitTxnProducer,
        st.integers(0, 5_000),
        IDS,
        st.sampled_from([1_000, TIMEOUT_MS]),
        st.sampled_from([-1, 500, 501]),
        st.sampled_from([-1, 0, 1]),
        PIDS,
    ),
    st.builds(AddTxnPartitions, st.integers(0, 5_000), IDS, PIDS, EPOCHS, PARTITION_LISTS),
    st.builds(PrepareTxnEnd, st.integers(0, 5_000), IDS, PIDS, EPOCHS, st.integers(0, 1)),
    st.builds(CompleteTxn, st.integers(0, 5_000), IDS, PIDS, st.integers(0, 2)),
    st.builds(FenceTxn, st.integers(0, 5_000), IDS, PIDS, EPOCHS),
    st.builds(ExpireTransactionalIds, st.integers(0, 10_000), st.integers(1, 3_000)),
).map(lambda command: command.encode())


@settings(max_examples=150, deadline=None)
@given(st.lists(ENTRIES, max_size=40))
def test_txn_state_replicas_converge_and_restore_anywhere(entries: list[bytes]) -> None:
    check_two_replicas(entries, TxnStateMachine)
    check_restore_everywhere(entries, TxnStateMachine, TxnStateMachine.restore)


def test_the_producer_id_before_a_rotation_counts_only_with_its_exhausted_epoch() -> None:
    c = Coordinator()
    first = c.init()
    assert isinstance(first, ProducerIdAndEpoch)
    c.machine.txns[TXN].epoch = EPOCH_ROTATION_THRESHOLD
    rotated = c.init()  # no expected pair: rotates, and keeps no last epoch
    assert rotated == ProducerIdAndEpoch(c.next_pid, 0)
    assert c.machine.txns[TXN].last_epoch == -1
    assert c.init(expected=(first.producer_id, 0)) == Rejected(ErrorCode.PRODUCER_FENCED)


def test_a_fence_for_another_session_aborts_nothing_and_init_keeps_the_new_timeout() -> None:
    c = Coordinator()
    producer = c.started()
    stale = FenceTxn(c.now_ms + 10 * TIMEOUT_MS, TXN, producer.producer_id, producer.epoch + 1)
    assert c.machine.apply(stale.encode()) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.state() == TxnState.ONGOING
    c.end(*producer, commit=True)
    c.complete(producer.producer_id, 0)
    c.init(timeout_ms=5_000)
    assert c.machine.txns[TXN].timeout_ms == 5_000


def test_the_last_epoch_fences_without_overflowing() -> None:
    """A forged request at the last epoch may open a transaction; fencing it stays at 32767
    (no assert on a replicated apply), and that epoch adds no partition."""
    c = Coordinator()
    producer = c.init()
    assert isinstance(producer, ProducerIdAndEpoch)
    c.machine.txns[TXN].epoch = 32_767
    assert c.add(producer.producer_id, 32_767, ORDERS) == Rejected(ErrorCode.PRODUCER_FENCED)
    c.machine.txns[TXN].epoch = 32_766
    c.add(producer.producer_id, 32_766, ORDERS)
    prepared = c.init()
    assert isinstance(prepared, TxnEndPrepared)
    assert prepared.epoch == 32_767
    c.complete(producer.producer_id, prepared.txn_sequence)
    assert c.add(producer.producer_id, 32_767, ORDERS) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.init() == ProducerIdAndEpoch(c.next_pid, 0)  # rotates


def test_a_refused_init_touches_nothing_so_the_idle_id_still_expires() -> None:
    c = Coordinator()
    producer = c.init()
    assert isinstance(producer, ProducerIdAndEpoch)
    c.now_ms += 5_000
    assert c.init(expected=(producer.producer_id, 9)) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.machine.txns[TXN].last_update_ms == 1_000
    expiry = ExpireTransactionalIds(c.now_ms, 5_000).encode()
    assert c.machine.apply(expiry) == TransactionalIdsExpired((TXN,))
