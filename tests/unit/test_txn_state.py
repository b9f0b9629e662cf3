"""The transaction coordinator's replicated state (statemachine/txn_state.py): Kafka's
TransactionCoordinatorTest and TransactionStateManagerTest cases that concern the state machine,
as they translate (the name of Kafka's case in each docstring), and the rules raftbroker adds
(txn sequences, limits). ProducerStateManagerTest's transactional cases are a partition's:
tests/unit/test_partition_txns.py and tests/unit/test_offsets_txns.py.

Kafka's transactional cases that do not translate (Apache Kafka trunk of 2024-10), by reason;
every other one is named in a test's docstring here or in test_partition_txns.py.

TransactionCoordinatorTest: 69 cases, 47 ported, these 22 not:
- no transactional id: served from the node's lease (S16), not by this machine:
    shouldAcceptInitPidAndReturnNextPidWhenTransactionalIdIsNull
- routing and loading are TxnService's (cluster/broker/txns.py), not apply's; a replica that
  loses leadership keeps its state:
    shouldRespondWithNotCoordinatorOnInitPidWhenNotCoordinator
    shouldRespondWithCoordinatorLoadInProgressOnInitPidWhenCoordinatorLoading
    shouldRespondWithNotCoordinatorOnAddPartitionsWhenNotCoordinator
    shouldRespondWithCoordinatorLoadInProgressOnAddPartitionsWhenCoordinatorLoading
    shouldRespondWithNotCoordinatorOnEndTxnWhenIsNotCoordinatorForId
    shouldRespondWithCoordinatorLoadInProgressOnEndTxnWhenCoordinatorIsLoading
    shouldRemoveTransactionsForPartitionOnEmigration
- KIP-890's verify-only AddPartitionsToTxn (a partition holds the coordinator's registration):
    testVerifyPartitionHandling
    shouldRespondWithErrorsNoneOnAddPartitionWhenOngoingVerifyOnlyAndPartitionsTheSame
    shouldRespondWithInvalidTxnStateWhenVerifyOnlyAndPartitionNotPresent
- transaction version 2 (EndTxn v5's epoch bump per transaction) is not served:
    shouldReturnWhenTransactionVersionDowngraded
    shouldReturnCorrectlyWhenTransactionVersionUpgraded
    shouldReturnInvalidTxnRequestOnEndTxnV2IfNotEndTxnV2Retry
    shouldReturnOkOnEndTxnV2IfEndTxnV2RetryEpochOverflow
- a failed log append, or a race between two reads of Kafka's cache: an entry applies whole
  once committed, or not at all:
    shouldFailToAbortTransactionOnHandleInitPidWhenProducerEpochIsSmaller
    shouldNotRepeatedlyBumpEpochDueToInitPidDuringOngoingTxnIfAppendToLogFails
    shouldNotBumpEpochWhenAbortingExpiredTransactionIfAppendToLogFails
- DescribeTransactions is TxnService's, and Dead is never kept (an expired id is gone):
    testDescribeTransactionsWithEmptyTransactionalId
    testDescribeTransactionsWithExpiringTransactionalId
    testDescribeTransactionsWhileCoordinatorLoading
    testDescribeTransactions

TransactionStateManagerTest: 35 cases, 11 ported, these 24 not:
- Kafka's cache of loaded partitions, loading and unloading it (a replica replays its log or
  restores a snapshot: the property test below holds the two equal):
    testAddGetPids
    testDeletePartition
    testDeleteLoadingPartition
    testLoadAndRemoveTransactionsForPartition
    testSuccessfulReimmigration
    testLoadTransactionMetadataWithCorruptedLog
    testPartitionLoadMetric
    shouldReturnNotCoordinatorErrorIfTransactionIdPartitionNotOwned
    testListTransactionsWithCoordinatorLoadingInProgress
- pending states and the outcomes of a log append (an entry applies whole or not at all):
    testCompleteTransitionWhenAppendSucceeded
    testAppendFailToCoordinatorNotAvailableError
    testAppendFailToNotCoordinatorError
    testAppendFailToCoordinatorLoadingError
    testAppendFailToUnknownError
    testPendingStateNotResetOnRetryAppend
    testAppendTransactionToLogWhileProducerFenced
    testAppendTransactionToLogWhilePendingStateChanged
    shouldNotRemoveExpiredTransactionalIdsIfLogAppendFails
- expiry's tombstone batches and log directories (an expiry here is one entry; an id exists
  only once the entry that made it applied):
    testTransactionalExpirationWithTooSmallBatchSize
    testTransactionalExpirationWithOfflineLogDir
    testTransactionExpirationShouldRespectBatchSize
    testTransactionExpirationShouldNotFailWithUninitializedTransactionMetadata
- ListTransactions is TxnService's; transaction versions are not served:
    testListTransactionsFiltering
    testTransactionVersionInTransactionManager

ProducerStateManagerTest: 54 cases, 25 of idempotence or snapshot files only; of the 29 on
transactions 18 are ported (test_partition_txns.py, one in test_offsets_txns.py), these 11 not:
- LogOffsetMetadata's segment positions:
    testTxnFirstOffsetMetadataCached
- the late-transaction check (find-hanging is cluster/client/txn_admin.py's):
    testHasLateTransaction
    testHasLateTransactionInitializedAfterReload
- log truncation (Raft truncates only entries never applied):
    testHasLateTransactionUpdatedAfterPartialTruncation
    testHasLateTransactionUpdatedAfterFullTruncation
    testFirstUnstableOffsetAfterTruncation
- KIP-890's verification entries (the coordinator's registration instead):
    testEntryForVerification
    testSequenceAndEpochInVerificationEntry
    testThrowOutOfOrderSequenceWithVerificationSequenceCheck
    testVerificationStateEntryExpiration
- the snapshot file's format:
    testReadWriteSnapshot
"""

from __future__ import annotations

from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statemachine.codec import pack
from statemachine.commands import (
    AddTxnPartitions,
    CompleteTxn,
    ExpireProducers,
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
    """A transaction state partition and a clock, to write the cases as Kafka's tests do. The
    requests are for `txn_id` (TXN unless a case needs several ids on one partition)."""

    def __init__(self, limits: StateLimits | None = None) -> None:
        self.machine = TxnStateMachine() if limits is None else TxnStateMachine(limits)
        self.now_ms = 1_000
        self.next_pid = 500
        self.txn_id = TXN

    def init(self, expected: tuple[int, int] = (-1, -1), timeout_ms: int = TIMEOUT_MS) -> object:
        self.next_pid += 1
        entry = InitTxnProducer(self.now_ms, self.txn_id, timeout_ms, *expected, self.next_pid)
        return self.machine.apply(entry.encode())

    def add(self, pid: int, epoch: int, *partitions: tuple[str, int]) -> object:
        data = pack([list(p) for p in partitions])
        entry = AddTxnPartitions(self.now_ms, self.txn_id, pid, epoch, data)
        return self.machine.apply(entry.encode())

    def end(self, pid: int, epoch: int, *, commit: bool) -> object:
        entry = PrepareTxnEnd(self.now_ms, self.txn_id, pid, epoch, int(commit))
        return self.machine.apply(entry.encode())

    def complete(self, pid: int, sequence: int) -> object:
        return self.machine.apply(CompleteTxn(self.now_ms, self.txn_id, pid, sequence).encode())

    def state(self) -> TxnState:
        return self.machine.txns[self.txn_id].state

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

    def reach(self, state: str) -> ProducerIdAndEpoch:
        """The id's producer, the id in `state` ("empty", "ongoing", "prepare-commit", ...),
        reached by requests (Kafka's tests build the metadata in that state instead)."""
        if state == "empty":
            producer = self.init()
            assert isinstance(producer, ProducerIdAndEpoch)
            return producer
        if state.startswith("complete"):
            return self.ended(commit=state.endswith("commit"))
        producer = self.started()
        if state.startswith("prepare"):
            assert isinstance(self.end(*producer, commit=state.endswith("commit")), TxnEndPrepared)
        return producer


def test_a_new_transactional_id_gets_a_fresh_producer_at_epoch_zero() -> None:
    """Kafka: TransactionCoordinatorTest.shouldInitPidWithEpochZeroForNewTransactionalId"""
    c = Coordinator()
    assert c.init() == ProducerIdAndEpoch(501, 0)
    assert c.state() == TxnState.EMPTY


@pytest.mark.parametrize("commit", [True, False])
def test_init_after_a_completed_transaction_bumps_the_epoch(commit: bool) -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldIncrementEpochAndUpdateMetadataOnHandleInitPidWhenExistingCompleteTransaction (abort),
    shouldIncrementEpochAndUpdateMetadataOnHandleInitPidWhenExistingCompleteCommitTransaction"""
    c = Coordinator()
    producer = c.ended(commit=commit)
    assert c.init() == ProducerIdAndEpoch(producer.producer_id, 1)
    assert c.state() == TxnState.EMPTY


@pytest.mark.parametrize("commit", [True, False])
def test_init_while_markers_go_out_is_concurrent_transactions(commit: bool) -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldWaitForCommitToCompleteOnHandleInitPidAndExistingTransactionInPrepareCommitState,
    shouldWaitForCommitToCompleteOnHandleInitPidAndExistingTransactionInPrepareAbortState"""
    c = Coordinator()
    producer = c.started()
    c.end(*producer, commit=commit)
    assert c.init() == Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)
    stranger = (producer.producer_id + 9, 0)  # Kafka checks the producer id first
    assert c.init(expected=stranger) == Rejected(ErrorCode.PRODUCER_FENCED)


def test_init_of_a_successor_aborts_the_open_transaction_under_a_bumped_epoch() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldAbortTransactionOnHandleInitPidWhenExistingTransactionInOngoingState: the epoch is
    bumped for the abort's markers, the caller retries, and its retry bumps again."""
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
    """Kafka: TransactionCoordinatorTest.
    testInitProducerIdWithCurrentEpochProvided (a retry answered with the pair it got); fenced:
    another producer id, or an epoch that is neither current nor last, and without an expected
    pair no last epoch is kept (testInitProducerIdStaleCurrentEpochProvided,
    testInitProducerIdWithNoLastProducerData)."""
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
    """Kafka: TransactionCoordinatorTest.
    shouldGenerateNewProducerIdIfEpochsExhausted, testRetryInitProducerIdAfterProducerIdRotation"""
    c = Coordinator()
    first = c.init()
    assert isinstance(first, ProducerIdAndEpoch)
    c.machine.txns[TXN].epoch = EPOCH_ROTATION_THRESHOLD
    exhausted = ProducerIdAndEpoch(first.producer_id, EPOCH_ROTATION_THRESHOLD)
    rotated = c.init(expected=exhausted)
    assert rotated == ProducerIdAndEpoch(c.next_pid, 0)
    assert c.init(expected=exhausted) == rotated  # the retry is recognised across it


def test_add_partitions_needs_the_ids_producer_and_epoch() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldRespondWithInvalidPidMappingOnAddPartitionsToTransactionWhenTransactionalIdNotPresent
    (another producer id alike),
    shouldRespondWithProducerFencedOnAddPartitionsWhenEpochsAreDifferent"""
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
    """Kafka: TransactionCoordinatorTest.
    shouldRespondWithConcurrentTransactionsOnAddPartitionsWhenStateIsPrepareCommit,
    shouldRespondWithConcurrentTransactionOnAddPartitionsWhenStateIsPrepareAbort"""
    c = Coordinator()
    producer = c.started()
    c.end(*producer, commit=commit)
    assert c.add(*producer, AUDIT) == Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)


def test_each_transaction_gets_the_next_txn_sequence_and_its_own_partitions() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldAppendNewMetadataToLogOnAddPartitionsWhenPartitionsAdded,
    shouldRespondWithSuccessOnAddPartitionsWhenStateIsCompleteCommit,
    shouldAppendPrepareCommitToLogOnEndTxnWhenStatusIsOngoingAndResultIsCommit: a new transaction
    begins, with only its own partitions; partitions already in it write nothing new
    (shouldRespondWithErrorsNoneOnAddPartitionWhenNoErrorsAndPartitionsTheSame, which Kafka sets
    up in Empty with partitions: here a settled id's last partitions count for nothing, as the
    last assertion shows)."""
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
        ("complete-commit", True, "done"),  # a retry of the EndTxn that completed
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
    """Kafka: TransactionCoordinatorTest.
    shouldReturnOkOnEndTxnWhenStatusIsCompleteCommitAndResultIsCommit,
    shouldReturnOkOnEndTxnWhenStatusIsCompleteAbortAndResultIsAbort,
    shouldReturnInvalidTxnRequestOnEndTxnRequestWhenStatusIsCompleteAbortAndResultIsNotAbort,
    shouldReturnInvalidTxnRequestOnEndTxnRequestWhenStatusIsCompleteCommitAndResultIsNotCommit,
    shouldReturnConcurrentTransactionsOnEndTxnRequestWhenStatusIsPrepareCommit,
    shouldReturnInvalidTxnRequestOnEndTxnRequestWhenStatusIsPrepareAbort"""
    c = Coordinator()
    producer = c.reach(setup)
    result = c.end(*producer, commit=commit)
    expected = TxnAlreadyEnded(TXN) if isinstance(answer, str) else Rejected(answer)
    assert result == expected


def test_end_txn_of_an_unknown_id_or_another_producer_is_refused() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldReplyWithInvalidPidMappingOnEndTxnWhenTxnIdDoesntExist,
    shouldReplyWithInvalidPidMappingOnEndTxnWhenPidDosentMatchMapped,
    shouldReplyWithProducerFencedOnEndTxnWhenEpochIsNotSameAsTransaction"""
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
    """Kafka: TransactionCoordinatorTest.
    shouldAbortExpiredTransactionsInOngoingStateAndBumpEpoch"""
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
    """Kafka: TransactionStateManagerTest.
    shouldNotRemoveOngoingTransactionalIds, shouldNotRemovePrepareCommitTransactionalIds,
    shouldRemoveCompleteCommitExpiredTransactionalIds, along one id's life (every state:
    test_an_idle_id_expires_in_a_settled_state_only)"""
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


@pytest.mark.parametrize("commit", [True, False])
def test_a_new_leader_finds_the_markers_still_due(commit: bool) -> None:
    """Kafka: TransactionStateManagerTest.
    shouldWriteTxnMarkersForTransactionInPreparedCommitState,
    shouldWriteTxnMarkersForTransactionInPreparedAbortState (Kafka's load hands them to its
    marker channel; here a new leader finds them in `preparing()`)"""
    c = Coordinator()
    producer = c.started()
    prepared = c.end(*producer, commit=commit)
    restored = TxnStateMachine.restore(c.machine.snapshot())
    assert restored.snapshot() == c.machine.snapshot()
    assert restored.preparing() == [prepared]


def test_bounds_and_bad_input_are_refused() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldReturnInvalidRequestWhenTransactionalIdIsEmpty (the last assertion), and raftbroker's
    bounds"""
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


# -- InitProducerId ----------------------------------------------------------------------------


def test_a_new_id_gets_a_fresh_producer_whatever_pair_the_caller_expects() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldGenerateNewProducerIdIfNoStateAndProducerIdAndEpochProvided: a producer whose id expired,
    or that takes up a transactional id, still holds a pair; nothing here knows it."""
    c = Coordinator()
    assert c.init(expected=(42, 7)) == ProducerIdAndEpoch(c.next_pid, 0)
    assert c.machine.txns[TXN].last_epoch == -1  # so that pair is no retry of this one


@pytest.mark.parametrize("setup", ["empty", "complete-commit", "complete-abort"])
def test_init_with_no_transaction_open_bumps_the_epoch_and_takes_the_new_timeout(
    setup: str,
) -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldIncrementEpochAndUpdateMetadataOnHandleInitPidWhenExistingEmptyTransaction (and the two
    Complete ones, which test_init_after_a_completed_transaction_bumps_the_epoch checks for the
    epoch only)"""
    c = Coordinator()
    producer = c.reach(setup)
    c.now_ms += 7
    assert c.init(timeout_ms=10) == ProducerIdAndEpoch(producer.producer_id, producer.epoch + 1)
    txn = c.machine.txns[TXN]
    assert (txn.state, txn.timeout_ms, txn.last_update_ms) == (TxnState.EMPTY, 10, c.now_ms)


def test_init_waits_while_markers_go_out_before_it_looks_at_the_expected_epoch() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldNotBumpEpochWithPendingTransaction: the state is checked before the epoch, so a stale
    epoch of the id's producer is told to retry, and nothing is bumped."""
    c = Coordinator()
    producer = c.reach("prepare-commit")
    before = c.machine.snapshot()
    busy = Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)
    assert c.init(expected=(producer.producer_id, producer.epoch + 10)) == busy
    assert c.machine.snapshot() == before


def test_after_a_rotation_the_old_producer_id_with_a_stale_epoch_is_fenced() -> None:
    """Kafka: TransactionCoordinatorTest.
    testInitProducerIdWithInvalidEpochAfterProducerIdRotation: only the exhausted epoch explains
    the old producer id (a retry of the call that rotated)."""
    c = Coordinator()
    first = c.init()
    assert isinstance(first, ProducerIdAndEpoch)
    c.machine.txns[TXN].epoch = EPOCH_ROTATION_THRESHOLD
    rotated = c.init(expected=(first.producer_id, EPOCH_ROTATION_THRESHOLD))
    assert rotated == ProducerIdAndEpoch(c.next_pid, 0)
    stale = (first.producer_id, EPOCH_ROTATION_THRESHOLD - 1)
    assert c.init(expected=stale) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.machine.txns[TXN].current == rotated


@pytest.mark.parametrize(
    ("timeout_ms", "answer"),
    [
        (1, ErrorCode.NONE),
        (900_000, ErrorCode.NONE),  # transaction_timeout_ms_max
        (0, ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        (900_001, ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        (-1, ErrorCode.INVALID_REQUEST),  # no entry carries it
    ],
)
def test_a_transaction_timeout_is_valid_from_1_ms_to_the_maximum(
    timeout_ms: int, answer: ErrorCode
) -> None:
    """Kafka: TransactionStateManagerTest.
    testValidateTransactionTimeout. A negative timeout, which Kafka answers
    INVALID_TRANSACTION_TIMEOUT, never reaches an entry here: the Kafka listener answers it so
    before proposing (cluster/kafka/producer_ids.py), and the native protocol cannot carry it."""
    result = Coordinator().init(timeout_ms=timeout_ms)
    if answer == ErrorCode.NONE:
        assert isinstance(result, ProducerIdAndEpoch)
    else:
        assert result == Rejected(answer)


@pytest.mark.parametrize("txn_id", ["", None])
def test_an_empty_or_null_transactional_id_is_refused_by_every_request(
    txn_id: str | None,
) -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldReturnInvalidRequestWhenTransactionalIdIsEmpty,
    shouldRespondWithInvalidRequestAddPartitionsToTransactionWhenTransactionalIdIsEmpty,
    shouldRespondWithInvalidRequestAddPartitionsToTransactionWhenTransactionalIdIsNull,
    shouldRespondWithInvalidRequestOnEndTxnWhenTransactionalIdIsEmpty,
    shouldRespondWithInvalidRequestOnEndTxnWhenTransactionalIdIsNull. Kafka's null is an entry
    with nil for the id here."""
    c = Coordinator()
    producer = c.started()  # the refusals are for the request's id, whatever else is here
    before = c.machine.snapshot()
    id_ = cast(str, txn_id)  # None: the entry holds nil where its id belongs
    entries = (
        InitTxnProducer(c.now_ms, id_, TIMEOUT_MS, -1, -1, 9),
        AddTxnPartitions(c.now_ms, id_, *producer, pack([list(AUDIT)])),
        PrepareTxnEnd(c.now_ms, id_, *producer, 1),
    )
    for entry in entries:
        assert c.machine.apply(entry.encode()) == Rejected(ErrorCode.INVALID_REQUEST)
    assert c.machine.snapshot() == before


# -- AddPartitionsToTxn, EndTxn ----------------------------------------------------------------


@pytest.mark.parametrize("setup", ["empty", "ongoing", "complete-commit", "complete-abort"])
def test_add_partitions_begins_a_transaction_or_extends_the_open_one(setup: str) -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldRespondWithSuccessOnAddPartitionsWhenStateIsOngoing,
    shouldRespondWithSuccessOnAddPartitionsWhenStateIsCompleteAbort (Empty and CompleteCommit
    too): the new partition is written, here as the result's `added`, which the coordinator
    registers."""
    c = Coordinator()
    producer = c.reach(setup)
    before = c.machine.txns[TXN].txn_sequence
    began = c.now_ms
    c.now_ms += 5
    was_open = setup == "ongoing"
    sequence = before if was_open else before + 1
    assert c.add(*producer, AUDIT) == TxnPartitionsAdded(TXN, *producer, sequence, (AUDIT,))
    txn = c.machine.txns[TXN]
    assert txn.state == TxnState.ONGOING
    # An open transaction keeps its partitions and its start; a new one has only its own.
    assert txn.partitions == ((AUDIT, ORDERS) if was_open else (AUDIT,))
    assert txn.txn_start_ms == (began if was_open else c.now_ms)


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_of_an_open_transaction_prepares_the_outcome_asked(commit: bool) -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldAppendPrepareAbortToLogOnEndTxnWhenStatusIsOngoingAndResultIsAbort (and the commit):
    PrepareX, with every partition of the transaction, its markers due."""
    c = Coordinator()
    producer = c.started()
    c.add(*producer, AUDIT)
    prepared = c.end(*producer, commit=commit)
    assert prepared == TxnEndPrepared(TXN, *producer, 0, commit, (AUDIT, ORDERS))
    assert c.state() == (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
    assert c.machine.preparing() == [prepared]


@pytest.mark.parametrize("shift", [1, -1])
def test_end_txn_after_completion_with_another_epoch_is_fenced(shift: int) -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldReturnInvalidEpochOnEndTxnWhenEpochIsLarger,
    shouldReturnInvalidEpochOnEndTxnWhenEpochIsSmaller: another epoch's commit is no retry of the
    one that completed (the producer is checked before the state)."""
    c = Coordinator()
    c.init()  # epoch 0, so that the producer below (epoch 1) has a smaller one
    producer = c.ended(commit=True)
    epoch = producer.epoch + shift
    assert c.end(producer.producer_id, epoch, commit=True) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.state() == TxnState.COMPLETE_COMMIT


# -- timeouts ----------------------------------------------------------------------------------

SETTLED = ("empty", "complete-commit", "complete-abort")  # no transaction open
STATES = (*SETTLED, "ongoing", "prepare-commit", "prepare-abort")


def test_only_ongoing_transactions_past_their_timeout_are_due_to_abort() -> None:
    """Kafka: TransactionStateManagerTest.
    shouldOnlyConsiderTransactionsInTheOngoingStateToAbort: ids in every state with a 1 s timeout,
    and one Ongoing with 10 s; 2 s later."""
    c = Coordinator()
    for state in STATES:
        c.txn_id = state
        c.reach(state)
        c.machine.txns[state].timeout_ms = 1_000
    c.txn_id = "not-expiring"
    c.reach("ongoing")
    c.machine.txns["not-expiring"].timeout_ms = 10_000
    due = c.machine.timed_out(c.now_ms + 2_000)
    assert due == [("ongoing", *c.machine.txns["ongoing"].current)]


def test_a_timeout_fence_of_an_older_epoch_leaves_the_newer_transaction_open() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldNotAcceptSmallerEpochDuringTransactionExpiration: the timeout was found at one epoch;
    before its fence applied, a successor took the id and opened a transaction of its own."""
    c = Coordinator()
    old = c.started()
    late = c.now_ms + TIMEOUT_MS + 1
    assert c.machine.timed_out(late) == [(TXN, *old)]
    aborted = c.init()  # the successor: the old transaction aborts under the next epoch
    assert isinstance(aborted, TxnEndPrepared)
    c.complete(old.producer_id, aborted.txn_sequence)
    new = c.started()
    fence = FenceTxn(late, TXN, *old).encode()
    assert c.machine.apply(fence) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert (c.state(), c.machine.txns[TXN].current) == (TxnState.ONGOING, new)


def test_a_transaction_whose_end_applied_first_is_not_aborted_at_its_timeout() -> None:
    """Kafka: TransactionCoordinatorTest.
    shouldNotAbortExpiredTransactionsThatHaveAPendingStateTransition: the producer's commit won
    the race with the timeout's fence."""
    c = Coordinator()
    producer = c.started()
    late = c.now_ms + TIMEOUT_MS + 1
    assert c.machine.timed_out(late) == [(TXN, *producer)]
    prepared = c.end(*producer, commit=True)
    fence = FenceTxn(late, TXN, *producer).encode()
    assert c.machine.apply(fence) == Rejected(ErrorCode.INVALID_TXN_STATE)
    assert c.machine.timed_out(late) == []
    assert c.machine.preparing() == [prepared]  # the commit's markers still go out


# -- expiry, and what apply refuses -------------------------------------------------------------

DAY_MS = 86_400_000


@pytest.mark.parametrize("state", STATES)
def test_an_idle_id_expires_in_a_settled_state_only(state: str) -> None:
    """Kafka: TransactionStateManagerTest.
    shouldRemoveEmptyExpiredTransactionalIds, shouldRemoveCompleteCommitExpiredTransactionalIds,
    shouldRemoveCompleteAbortExpiredTransactionalIds, shouldNotRemoveOngoingTransactionalIds,
    shouldNotRemovePrepareCommitTransactionalIds, shouldNotRemovePrepareAbortTransactionalIds:
    idle for exactly the interval (Kafka's >=), beside an id updated just now, which stays."""
    c = Coordinator()
    c.txn_id = "idle"
    c.reach(state)
    c.now_ms += DAY_MS
    c.txn_id = "recent"
    c.reach("empty")
    expired = c.machine.apply(ExpireTransactionalIds(c.now_ms, DAY_MS).encode())
    assert expired == TransactionalIdsExpired(("idle",) if state in SETTLED else ())
    assert "recent" in c.machine.txns


def test_an_entry_of_an_unknown_kind_is_refused_and_changes_nothing() -> None:
    """Kafka: TransactionStateManagerTest.
    testIgnoreUnknownRecordType: Kafka's load skips a record of a type it does not know; here such
    an entry is a committed no-op, and the transaction whose markers were due still is."""
    c = Coordinator()
    producer = c.started()
    prepared = c.end(*producer, commit=True)
    before = c.machine.snapshot()
    unknown_tag = pack([250, 1, c.now_ms])
    partitions_command = ExpireProducers(c.now_ms, 1_000).encode()
    for entry in (unknown_tag, partitions_command, b"\xc1"):
        assert c.machine.apply(entry) == Rejected(ErrorCode.INVALID_REQUEST)
    assert c.machine.snapshot() == before
    assert c.machine.preparing() == [prepared]


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
    """Kafka: TransactionCoordinatorTest.
    testFenceProducerWhenMappingExistsWithDifferentProducerId"""
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
    """Kafka: TransactionCoordinatorTest.
    shouldUseLastEpochToFenceWhenEpochsAreExhausted (the abort from 32766 goes out under 32767).
    A forged request at the last epoch may open a transaction; fencing it stays at 32767 (no
    assert on a replicated apply), and that epoch adds no partition."""
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
    """Kafka: TransactionStateManagerTest.
    shouldRemoveEmptyExpiredTransactionalIds (an Empty id), and a refusal is no update."""
    c = Coordinator()
    producer = c.init()
    assert isinstance(producer, ProducerIdAndEpoch)
    c.now_ms += 5_000
    assert c.init(expected=(producer.producer_id, 9)) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert c.machine.txns[TXN].last_update_ms == 1_000
    expiry = ExpireTransactionalIds(c.now_ms, 5_000).encode()
    assert c.machine.apply(expiry) == TransactionalIdsExpired((TXN,))
