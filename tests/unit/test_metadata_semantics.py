"""docs/semantics.md's statements for the metadata group: PID blocks, transactional ids, topics.

Statements S15-S21 at the state-machine level, plus topic creation, placement and validation.
Every test applies encoded entries to a real MetadataStateMachine.
"""

from __future__ import annotations

import pytest

from statemachine.commands import (
    UNCHANGED,
    AllocatePidBlock,
    AlterTopicConfigs,
    CreateTopic,
    DeleteTopic,
    ExpireTransactionalIds,
    InitTransactionalProducer,
    RegisterBroker,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import StateLimits
from statemachine.metadata import (
    BrokerRegistered,
    MetadataResult,
    MetadataStateMachine,
    TopicCreated,
    TopicDeleted,
    TransactionalIdsExpired,
    place_replicas,
)
from statemachine.partition import PartitionStateMachine
from statemachine.pid_allocator import PidBlock, PidBlockLease
from statemachine.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from statemachine.txn_registry import EPOCH_ROTATION_THRESHOLD, ProducerIdAndEpoch, TxnEntry
from tests.builders import append

DAY_MS = 86_400_000


def cluster(brokers: int = 3) -> MetadataStateMachine:
    sm = MetadataStateMachine()
    for b in range(1, brokers + 1):
        result = sm.apply(
            RegisterBroker(b, f"127.0.0.{b + 1}:9092", f"127.0.0.{b + 1}:9093").encode()
        )
        assert isinstance(result, BrokerRegistered)
    return sm


def init_txn(
    sm: MetadataStateMachine,
    txn_id: str,
    expected: tuple[int, int] = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH),
    now_ms: int = 1_000,
    timeout_ms: int = 60_000,
) -> MetadataResult:
    return sm.apply(
        InitTransactionalProducer(txn_id, timeout_ms, expected[0], expected[1], now_ms).encode()
    )


def pair(result: MetadataResult) -> ProducerIdAndEpoch:
    assert isinstance(result, ProducerIdAndEpoch), result
    return result


# -- PID blocks ----------------------------------------------------------------------------------


def test_s15_blocks_never_overlap_across_brokers_and_restarts() -> None:
    sm = cluster()
    seen: set[int] = set()
    for round_ in range(20):
        broker = round_ % 3 + 1
        block = sm.apply(AllocatePidBlock(broker, 1_000).encode())
        assert isinstance(block, PidBlock) and block.broker_id == broker
        ids = set(range(block.start, block.end))
        assert not ids & seen
        seen |= ids
        if (
            round_ % 5 == 4
        ):  # a restart from a snapshot (or a new allocator leader) keeps the counter
            sm = MetadataStateMachine.restore(sm.snapshot())
    txn_pid = pair(init_txn(sm, "app-1")).producer_id
    assert txn_pid not in seen


def test_s15_unregistered_broker_and_oversize_block_are_rejected() -> None:
    sm = cluster(1)
    assert sm.apply(AllocatePidBlock(9, 10).encode()) == Rejected(
        ErrorCode.BROKER_ID_NOT_REGISTERED
    )
    too_big = StateLimits().pid_block_size_max + 1
    assert sm.apply(AllocatePidBlock(1, too_big).encode()) == Rejected(ErrorCode.INVALID_REQUEST)
    assert sm.allocator.next_producer_id == 0


def test_s16_lease_hands_out_fresh_ids_with_epoch_zero_semantics() -> None:
    # Without a transactional id, InitProducerId is served from the broker's committed block.
    lease = PidBlockLease()
    assert lease.wants_block()
    lease.add_block(PidBlock(1, 1_000, 1_010))
    ids = [lease.take() for _ in range(5)]
    assert ids == [1_000, 1_001, 1_002, 1_003, 1_004]
    # Each is unknown to every partition, so its first batch at epoch 0 is accepted anywhere.
    partition = PartitionStateMachine()
    for pid in ids:
        assert isinstance(pid, int)
        assert partition.apply(append(pid, 0, 0)).__class__.__name__ == "Appended"


def test_lease_prefetches_at_ninety_percent_and_serves_blocks_in_order() -> None:
    lease = PidBlockLease()
    assert lease.wants_block() and not lease.wants_block()  # one request at a time
    lease.add_block(PidBlock(1, 0, 10))
    for _ in range(8):
        lease.take()
        assert not lease.wants_block()
    lease.take()  # 9 of 10 used
    assert lease.wants_block()
    lease.add_block(PidBlock(1, 50, 60))
    assert [lease.take() for _ in range(2)] == [9, 50]
    assert lease.remaining == 9


def test_s21_exhausted_block_is_a_retriable_error() -> None:
    lease = PidBlockLease()
    assert lease.take() == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    lease.add_block(PidBlock(1, 0, 2))
    assert [lease.take(), lease.take()] == [0, 1]
    exhausted = lease.take()
    assert exhausted == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert isinstance(exhausted, ErrorCode) and exhausted.retriable
    lease.request_failed()
    assert lease.wants_block()


# -- transactional ids ---------------------------------------------------------------------------


def test_s17_new_txn_id_gets_epoch_zero_then_bump_fences_old_instance() -> None:
    sm = cluster()
    first = pair(init_txn(sm, "payments"))
    assert first.epoch == 0
    second = pair(init_txn(sm, "payments"))
    assert second == ProducerIdAndEpoch(first.producer_id, 1)
    partition = PartitionStateMachine()
    assert partition.apply(append(second.producer_id, 1, 0)).__class__.__name__ == "Appended"
    assert partition.apply(append(first.producer_id, 0, 1)) == Rejected(
        ErrorCode.INVALID_PRODUCER_EPOCH
    )


def test_s18_expected_epoch_current_bumps_previous_retries_else_fenced() -> None:
    sm = cluster()
    p0 = pair(init_txn(sm, "t"))
    p1 = pair(init_txn(sm, "t", expected=p0))  # == current: bump
    assert p1 == ProducerIdAndEpoch(p0.producer_id, 1)
    assert pair(init_txn(sm, "t", expected=p0)) == p1  # == previous: a retry, unchanged
    assert pair(init_txn(sm, "t", expected=p0)) == p1
    stale = (p0.producer_id, 7)
    assert init_txn(sm, "t", expected=stale) == Rejected(ErrorCode.PRODUCER_FENCED)
    other_pid = (p0.producer_id + 1, 1)
    assert init_txn(sm, "t", expected=other_pid) == Rejected(ErrorCode.PRODUCER_FENCED)
    assert pair(init_txn(sm, "t", expected=p1)) == ProducerIdAndEpoch(p0.producer_id, 2)


def test_expected_pid_and_epoch_come_together() -> None:
    sm = cluster()
    pair(init_txn(sm, "t"))
    assert init_txn(sm, "t", expected=(5, NO_PRODUCER_EPOCH)) == Rejected(ErrorCode.INVALID_REQUEST)


def test_s19_epoch_at_rotation_threshold_moves_to_new_pid() -> None:
    sm = cluster()
    start = pair(init_txn(sm, "t"))
    sm.txns._entries["t"] = TxnEntry(
        start.producer_id, EPOCH_ROTATION_THRESHOLD, EPOCH_ROTATION_THRESHOLD - 1, -1, 60_000, 1
    )
    rotated = pair(init_txn(sm, "t"))
    assert rotated.producer_id != start.producer_id and rotated.epoch == 0
    # A retry of the rotating call (it holds the old pair) gets the new pair back.
    old = (start.producer_id, EPOCH_ROTATION_THRESHOLD)
    assert pair(init_txn(sm, "t", expected=old)) == rotated
    assert pair(init_txn(sm, "t", expected=rotated)) == ProducerIdAndEpoch(rotated.producer_id, 1)


def test_s20_idle_txn_id_expires_then_gets_a_new_pid() -> None:
    sm = cluster()
    first = pair(init_txn(sm, "a", now_ms=1_000))
    pair(init_txn(sm, "b", now_ms=5_000))
    week = 604_800_000
    kept = sm.apply(ExpireTransactionalIds(1_000 + week - 1, week).encode())
    assert kept == TransactionalIdsExpired(())
    gone = sm.apply(ExpireTransactionalIds(1_000 + week, week).encode())
    assert gone == TransactionalIdsExpired(("a",))
    assert sm.txns.get("a") is None and sm.txns.get("b") is not None
    again = pair(init_txn(sm, "a", now_ms=1_000 + week))
    assert again.producer_id != first.producer_id and again.epoch == 0


def test_init_refreshes_last_update_so_active_ids_do_not_expire() -> None:
    sm = cluster()
    pair(init_txn(sm, "a", now_ms=0))
    pair(init_txn(sm, "a", now_ms=DAY_MS))
    assert sm.apply(ExpireTransactionalIds(DAY_MS + 10, DAY_MS).encode()) == (
        TransactionalIdsExpired(())
    )


@pytest.mark.parametrize(
    ("txn_id", "timeout_ms", "error"),
    [
        ("", 60_000, ErrorCode.INVALID_REQUEST),
        ("x" * 250, 60_000, ErrorCode.INVALID_REQUEST),
        ("ok", 900_001, ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        ("ok", 0, ErrorCode.INVALID_TRANSACTION_TIMEOUT),
    ],
)
def test_invalid_init_requests_are_rejected(txn_id: str, timeout_ms: int, error: ErrorCode) -> None:
    sm = cluster()
    assert init_txn(sm, txn_id, timeout_ms=timeout_ms) == Rejected(error)
    assert len(sm.txns) == 0 and sm.allocator.next_producer_id == 0


# -- topics and brokers --------------------------------------------------------------------------


def test_create_topic_places_replicas_deterministically_across_brokers() -> None:
    a, b = cluster(5), cluster(5)
    entry = CreateTopic("orders", 10, 3, -1, -1).encode()
    created_a, created_b = a.apply(entry), b.apply(entry)
    assert created_a == created_b
    assert isinstance(created_a, TopicCreated)
    topic = created_a.topic
    assert topic.partitions == 10 and all(len(set(r)) == 3 for r in topic.replicas)
    leaders = [r[0] for r in topic.replicas]
    assert set(leaders) == {1, 2, 3, 4, 5}  # preferred leaders spread over every broker
    assert topic.replicas == place_replicas("orders", [5, 4, 3, 2, 1], 10, 3)


@pytest.mark.parametrize(
    ("name", "partitions", "rf", "error"),
    [
        ("bad name", 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("", 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("..", 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("t" * 250, 1, 1, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("ok", 1, 4, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("ok", 1_025, 1, ErrorCode.INVALID_PARTITIONS),
    ],
)
def test_create_topic_validates(name: str, partitions: int, rf: int, error: ErrorCode) -> None:
    sm = cluster(3)
    assert sm.apply(CreateTopic(name, partitions, rf, -1, -1).encode()) == Rejected(error)
    assert not sm.topics


def test_topic_lifecycle_and_ids_are_never_reused() -> None:
    sm = cluster()
    first = sm.apply(CreateTopic("t", 1, 1, -1, -1).encode())
    assert isinstance(first, TopicCreated)
    dup = sm.apply(CreateTopic("t", 1, 1, -1, -1).encode())
    assert dup == Rejected(ErrorCode.TOPIC_ALREADY_EXISTS)
    assert sm.apply(DeleteTopic("t").encode()) == TopicDeleted(first.topic)
    assert sm.apply(DeleteTopic("t").encode()) == Rejected(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    again = sm.apply(CreateTopic("t", 1, 1, -1, -1).encode())
    assert isinstance(again, TopicCreated) and again.topic.topic_id > first.topic.topic_id


def test_broker_registration_validates_addresses_and_updates() -> None:
    sm = MetadataStateMachine()
    bad = sm.apply(RegisterBroker(1, "no-port", "127.0.0.2:1").encode())
    assert bad == Rejected(ErrorCode.INVALID_REQUEST)
    assert sm.apply(RegisterBroker(1, "127.0.0.2:70000", "127.0.0.2:1").encode()) == bad
    sm.apply(RegisterBroker(1, "127.0.0.2:9092", "127.0.0.2:9093").encode())
    sm.apply(RegisterBroker(1, "host-a:9092", "[::1]:9093").encode())
    assert sm.brokers[1].client_address == "host-a:9092"
    assert len(sm.brokers) == 1


def test_metadata_snapshot_round_trip_is_byte_identical() -> None:
    sm = cluster()
    sm.apply(CreateTopic("t", 4, 3, 1_000, -1).encode())
    sm.apply(AllocatePidBlock(2, 1_000).encode())
    pair(init_txn(sm, "x"))
    restored = MetadataStateMachine.restore(sm.snapshot())
    assert restored.snapshot() == sm.snapshot()
    assert restored.topics == sm.topics and restored.brokers == sm.brokers


def test_topic_ids_are_never_reused() -> None:
    # A recreated topic's Raft groups are named by its id: a straggler of the deleted one must
    # never share a name with them (cluster/node.py).
    sm = cluster()
    a = sm.apply(CreateTopic("a", 3, 1, -1, -1).encode())
    sm.apply(DeleteTopic("a").encode())
    b = sm.apply(CreateTopic("a", 2, 1, -1, -1).encode())
    assert isinstance(a, TopicCreated) and isinstance(b, TopicCreated)
    assert b.topic.topic_id > a.topic.topic_id


def test_metadata_expiry_due_agrees_with_expire() -> None:
    sm = cluster()
    pair(init_txn(sm, "a", now_ms=1_000))
    assert not sm.expiry_due(1_999, 1_000)
    assert sm.expiry_due(2_000, 1_000)
    expired = sm.apply(ExpireTransactionalIds(2_000, 1_000).encode())
    assert expired == TransactionalIdsExpired(("a",))
    assert not sm.expiry_due(10**12, 1)


def test_config_changes_through_different_nodes_never_undo_each_other() -> None:
    """Each AlterTopicConfigs carries only what it changes, of the topic of that id: two
    alters decided on nodes that had not yet applied each other's both hold, and an alter of
    a topic deleted and made again since is refused."""
    sm = cluster()
    created = sm.apply(CreateTopic("t", 1, 3, -1, -1).encode())
    assert isinstance(created, TopicCreated)
    topic_id = created.topic.topic_id
    sm.apply(AlterTopicConfigs("t", topic_id, 60_000, UNCHANGED).encode())
    sm.apply(AlterTopicConfigs("t", topic_id, UNCHANGED, 1_000).encode())
    assert (sm.topics["t"].retention_ms, sm.topics["t"].retention_bytes) == (60_000, 1_000)
    sm.apply(DeleteTopic("t").encode())
    sm.apply(CreateTopic("t", 1, 3, -1, -1).encode())
    stale = sm.apply(AlterTopicConfigs("t", topic_id, 5, UNCHANGED).encode())
    assert stale == Rejected(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert sm.topics["t"].retention_ms == -1
