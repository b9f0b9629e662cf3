"""Transactions on this node: the coordinator of each transaction state partition it hosts.

Role: a transactional id lives in one partition of the internal topic `__transaction_state`
(`partition_of`), whose replicas apply statemachine/txn_state.py; its coordinator is that
partition's Raft leader, as in Kafka. `TxnService` turns the transaction APIs into that
partition's entries and answers from their results (InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn), and on the leader it carries out what the results ask: it registers
a transaction's partitions with their Raft groups before AddPartitionsToTxn is answered, writes
the markers of every prepared transaction, then completes it, and fences and aborts the
transactions past their timeout (`run`). Both client listeners reach it through the broker core.

Rules (docs/semantics.md, "The transaction coordinator"):
- Requests may arrive at any node hosting a replica of the id's partition: their entries are
  forwarded to its leader (`propose(forward=True)`); a node hosting none answers
  NOT_COORDINATOR, and FindCoordinator names the leader.
- EndTxn is answered once PrepareCommit or PrepareAbort is committed, as Kafka answers it; the
  markers follow, and until CompleteTxn the id answers CONCURRENT_TRANSACTIONS. A new leader
  writes the markers of every prepared transaction again (a partition takes a replay
  harmlessly), with its own term as the coordinator epoch, which fences the old leader's.
- Offsets in a transaction: AddOffsetsToTxn adds the group's partition of `__consumer_offsets`
  to the transaction and registers it there, as a data partition is; its marker commits or
  drops the offsets the group coordinator took as pending (TxnOffsetCommit).
- A registration or a marker goes to the partition's own Raft group through this node's
  replica of it, or, for a partition this node hosts no replica of, through the node leading
  it (PartitionTxnEntry over the peers' native listeners); while neither answers, the
  client's registration gets COORDINATOR_NOT_AVAILABLE (retriable), and a marker is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import cast

from cluster.broker.internal_topics import (
    coordinator_of,
    ensure_internal_topic,
    ensure_offsets_topic,
    internal_topic,
    offsets_partition,
    partition_of,
)
from cluster.broker.node import (
    INTERNAL_TOPICS,
    OFFSETS_TOPIC,
    TXN_STATE_TOPIC,
    Node,
    TxnStateHandle,
)
from cluster.broker.peers import PeerWatcher
from cluster.clock import wall_ms
from cluster.raft import ProposalError, RaftGroup
from statemachine.codec import pack
from statemachine.commands import (
    AddTxnPartitions,
    CompleteTxn,
    FenceTxn,
    InitTxnProducer,
    PrepareTxnEnd,
    RegisterTxnPartition,
    WriteTxnMarker,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.metadata import transactional_id_error
from statemachine.offsets import group_id_error
from statemachine.partition import Appended, TxnEnded, TxnRegistered
from statemachine.records import PRODUCER_EPOCH_MAX
from statemachine.txn_metadata import TopicPartition, TxnMetadata, TxnState
from statemachine.txn_registry import ProducerIdAndEpoch
from statemachine.txn_state import (
    TxnAlreadyEnded,
    TxnCompleted,
    TxnEndPrepared,
    TxnPartitionsAdded,
    TxnStateResult,
)

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.1  # how often leadership and timeouts are looked at
MARKER_RETRY_S = 0.1  # a marker whose partition group could not take it is tried again after
# A marker a partition refuses thus has nothing left to end there: the transaction was not
# open there (never registered, or ended already), or a newer epoch of its producer acted.
MARKER_DONE = frozenset({ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_PRODUCER_EPOCH})


class _CoordinatorFencedError(Exception):
    """A partition knows a newer coordinator of this transaction: this one stops."""


class TxnService:
    """Every transaction request this node answers, and the coordinators' own work."""

    def __init__(self, node: Node, peers: PeerWatcher) -> None:
        self.node = node
        self.peers = peers
        self._timeout_s = node.config.timing.request_timeout_ms / 1000
        timing = node.config.timing
        self._write_timeout_s = min(timing.txn_write_timeout_ms, timing.request_timeout_ms) / 1000
        self._wake = asyncio.Event()
        # Ids whose requests wait for their last transaction to complete (`_completion`).
        self._completed: dict[str, asyncio.Event] = {}
        self._ending: set[tuple[str, int, int]] = set()  # (id, producer id, txn sequence)
        self._fencing: set[tuple[str, int, int]] = set()  # (id, producer id, epoch)

    # -- where a transactional id lives ---------------------------------------------------------

    async def coordinator_node(self, txn_id: str) -> tuple[ErrorCode, int]:
        """FindCoordinator's answer for a transactional id: its partition's leader, the topic
        created on the first ask (COORDINATOR_NOT_AVAILABLE until it has leaders)."""
        if transactional_id_error(txn_id, self.node.limits):
            return ErrorCode.INVALID_REQUEST, -1
        await self._ensure_topic()
        return coordinator_of(self.node, self.peers, TXN_STATE_TOPIC, txn_id)

    async def _ensure_topic(self) -> ErrorCode:
        partitions = self.node.config.limits.txn_state_topic_partitions
        return await ensure_internal_topic(self.node, TXN_STATE_TOPIC, partitions, self._timeout_s)

    def _hosted(self, txn_id: str) -> TxnStateHandle | None:
        """This node's replica of the id's transaction state partition, if it has one."""
        topic = internal_topic(self.node, TXN_STATE_TOPIC)
        if topic is None:
            return None
        return self.node.txn_states.get((TXN_STATE_TOPIC, partition_of(txn_id, topic.partitions)))

    async def _handle(self, txn_id: str) -> TxnStateHandle | ErrorCode:
        if transactional_id_error(txn_id, self.node.limits):
            return ErrorCode.INVALID_REQUEST
        if await self._ensure_topic() != ErrorCode.NONE:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        handle = self._hosted(txn_id)
        return ErrorCode.NOT_COORDINATOR if handle is None else handle

    async def _propose(self, handle: TxnStateHandle, command: bytes) -> TxnStateResult | ErrorCode:
        try:
            result = await handle.group.propose(command, self._write_timeout_s, forward=True)
        except ProposalError as exc:
            # Kafka's mapping of a failed write to the transaction log.
            if exc.error == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                return ErrorCode.NOT_COORDINATOR
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return cast(TxnStateResult, result)

    # -- the requests ----------------------------------------------------------------------------

    async def init_producer(
        self, txn_id: str, timeout_ms: int, expected_producer_id: int, expected_epoch: int
    ) -> ProducerIdAndEpoch | ErrorCode:
        """InitProducerId for a transactional id: its producer id and next epoch, fencing the
        last; CONCURRENT_TRANSACTIONS while an open transaction of it is being aborted."""
        handle = await self._handle(txn_id)
        if isinstance(handle, ErrorCode):
            return handle
        fresh = self.node.lease.take()  # used only if the id needs a new producer id
        self.node.pid_block_wanted.set()
        if isinstance(fresh, ErrorCode):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS  # no block yet: retried
        command = InitTxnProducer(
            wall_ms(), txn_id, timeout_ms, expected_producer_id, expected_epoch, fresh
        )
        result = await self._propose(handle, command.encode())
        match result:
            case ProducerIdAndEpoch():
                return result
            case TxnEndPrepared():
                self._wake.set()
                return ErrorCode.CONCURRENT_TRANSACTIONS
            case Rejected(error=error):
                return error
            case ErrorCode():
                return result
        raise AssertionError(f"unexpected result {result!r}")

    async def add_partitions(
        self, txn_id: str, producer_id: int, epoch: int, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn: each partition's error, NONE once it is in the transaction and
        registered with its own Raft group (so its data can be appended)."""
        unknown = [tp for tp in partitions if not self._exists(tp)]
        if unknown:  # Kafka's: the others are not attempted
            return {
                tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                for tp in partitions
            }
        return await self._add(txn_id, producer_id, epoch, partitions)

    async def add_offsets(
        self, txn_id: str, producer_id: int, epoch: int, group_id: str
    ) -> ErrorCode:
        """AddOffsetsToTxn: the group's offsets partition joins the transaction, registered
        with its Raft group, so the group's coordinator takes the producer's TxnOffsetCommit
        and the transaction's marker commits or drops those offsets."""
        if group_id_error(group_id, self.node.limits):
            return ErrorCode.INVALID_GROUP_ID
        await ensure_offsets_topic(self.node, self._timeout_s)
        partition = offsets_partition(self.node, group_id)
        if partition is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        tp = (OFFSETS_TOPIC, partition)
        return (await self._add(txn_id, producer_id, epoch, [tp]))[tp]

    async def _add(
        self, txn_id: str, producer_id: int, epoch: int, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        handle = await self._handle(txn_id)
        if isinstance(handle, ErrorCode):
            return dict.fromkeys(partitions, handle)
        data = pack([list(tp) for tp in partitions])
        command = AddTxnPartitions(wall_ms(), txn_id, producer_id, epoch, data)
        result = await self._propose(handle, command.encode())
        concurrent = Rejected(ErrorCode.CONCURRENT_TRANSACTIONS)
        if result == concurrent and await self._completion(handle, txn_id):
            command = AddTxnPartitions(wall_ms(), txn_id, producer_id, epoch, data)
            result = await self._propose(handle, command.encode())
        if isinstance(result, ErrorCode | Rejected):
            error = result if isinstance(result, ErrorCode) else result.error
            return dict.fromkeys(partitions, error)
        assert isinstance(result, TxnPartitionsAdded), result
        registration = RegisterTxnPartition(wall_ms(), producer_id, epoch, result.txn_sequence)
        errors = await asyncio.gather(*(self._register(tp, registration) for tp in partitions))
        return dict(zip(partitions, errors, strict=True))

    async def _completion(self, handle: TxnStateHandle, txn_id: str) -> bool:
        """Whether the id's last transaction, whose markers go out, completed within the
        write timeout. A transaction's first AddPartitionsToTxn comes right after the last
        one's EndTxn, while its markers go out: answered CONCURRENT_TRANSACTIONS, a client
        retries after a backoff (librdkafka: 20 ms), which every transaction would then wait;
        waiting here for the completion, a few Raft commits, answers it as soon as it can be."""
        txn = handle.replica.machine.txns.get(txn_id)
        if txn is None or txn.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return True
        # (no await between the look and this: a completion cannot slip in unseen). The event
        # stays until the id's completion pops it, shared by every request that waits for it.
        event = self._completed.setdefault(txn_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), self._write_timeout_s)
        except TimeoutError:
            return False
        return True

    def _exists(self, tp: TopicPartition) -> bool:
        """A client's partition (AddPartitionsToTxn names no internal one)."""
        topic = self.node.metadata_replica.machine.topics.get(tp[0])
        return topic is not None and 0 <= tp[1] < topic.partitions and tp[0] not in INTERNAL_TOPICS

    def _group_of(self, tp: TopicPartition) -> RaftGroup | None:
        """This node's replica's Raft group of a transaction's partition: a client's partition
        or, for offsets in the transaction, an offsets partition."""
        handle = (
            self.node.offsets.get(tp) if tp[0] == OFFSETS_TOPIC else self.node.partitions.get(tp)
        )
        return None if handle is None else handle.group

    async def _register(self, tp: TopicPartition, registration: RegisterTxnPartition) -> ErrorCode:
        """Every partition asked is registered again (a replay of an open registration is
        accepted), so a retry after a registration that failed completes it."""
        return await self._to_partition(tp, registration)

    async def _to_partition(
        self, tp: TopicPartition, entry: RegisterTxnPartition | WriteTxnMarker
    ) -> ErrorCode:
        """A coordinator's entry into the partition's own Raft group: through this node's
        replica of it, or else through the node leading it (PartitionTxnEntry, `PeerWatcher.
        txn_entry`). NONE once applied, the partition's refusal, or COORDINATOR_NOT_AVAILABLE
        (retriable) when no replica took it in time."""
        group = self._group_of(tp)
        if group is None:
            return await self.peers.txn_entry(tp, entry, self._write_timeout_s)
        try:
            result = await group.propose(entry.encode(), self._write_timeout_s, forward=True)
        except ProposalError:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if isinstance(result, Rejected):
            return result.error
        assert isinstance(result, TxnRegistered | Appended | TxnEnded), result
        return ErrorCode.NONE

    async def peer_entry(
        self,
        source: str,
        tp: TopicPartition,
        pid_epoch_sequence: tuple[int, int, int],
        marker: int | None,
        coordinator_epoch: int,
    ) -> ErrorCode:
        """A peer's coordinator asks this node to put its entry into a partition hosted here
        (`_to_partition` on its side): a registration (`marker` None) or a marker (0 abort,
        1 commit). Only from a peer's address (`source`, where the peer dials from: its own
        host): from anyone else CLUSTER_AUTHORIZATION_FAILED, Kafka's answer to an inter-broker
        request from a client (a forged marker could end or fence any transaction).
        NOT_LEADER_OR_FOLLOWER when this node hosts no replica of it (the peer asks again once
        it knows the leader)."""
        hosts = self.node.peer_hosts
        if hosts is None or not hosts.is_peer_ip(source):
            return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        if not (self._exists(tp) or tp[0] == OFFSETS_TOPIC) or self._group_of(tp) is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        producer_id, epoch, sequence = pid_epoch_sequence
        entry: RegisterTxnPartition | WriteTxnMarker = (
            RegisterTxnPartition(wall_ms(), producer_id, epoch, sequence)
            if marker is None
            else WriteTxnMarker(wall_ms(), producer_id, epoch, sequence, marker, coordinator_epoch)
        )
        return await self._to_partition(tp, entry)

    async def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool) -> ErrorCode:
        """EndTxn: NONE once the transaction is prepared (its markers follow) or a retry of an
        ended one; Kafka's errors otherwise."""
        handle = await self._handle(txn_id)
        if isinstance(handle, ErrorCode):
            return handle
        command = PrepareTxnEnd(wall_ms(), txn_id, producer_id, epoch, int(commit))
        result = await self._propose(handle, command.encode())
        match result:
            case TxnEndPrepared():
                self._wake.set()
                return ErrorCode.NONE
            case TxnAlreadyEnded():
                return ErrorCode.NONE
            case Rejected(error=error):
                return error
            case ErrorCode():
                return result
        raise AssertionError(f"unexpected result {result!r}")

    # -- an operator's abort of a hanging transaction (WriteTxnMarkers) -------------------------

    async def abort_hanging(
        self, tp: TopicPartition, producer_id: int, epoch: int, coordinator_epoch: int
    ) -> ErrorCode:
        """`kafka-transactions.sh abort`: an abort marker for the producer's transaction open
        on this partition, written by its leader as the coordinator's would be (named by
        the transaction the partition has open; a partition with none ends nothing). For a
        transaction its coordinator no longer knows: one it does know still ends as it
        decides on its other partitions, so aborting it here can tear it."""
        partition = self.node.partitions.get(tp) if self._exists(tp) else None
        if partition is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not partition.group.serving:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if not (producer_id >= 0 and 0 <= epoch <= PRODUCER_EPOCH_MAX and coordinator_epoch >= 0):
            return ErrorCode.INVALID_REQUEST
        txn = partition.replica.machine.txns.producers.get(producer_id)
        if txn is None:
            return ErrorCode.NONE  # nothing of it here: nothing to end (Kafka's answer too)
        sequence = txn.open.txn_sequence if txn.open is not None else txn.last_txn_sequence
        # Never above the coordinator epoch the partition knows (what DescribeProducers told
        # the tool): a larger one would fence the real coordinator's markers here for good.
        fenced_by = min(coordinator_epoch, max(txn.coordinator_epoch, 0))
        marker = WriteTxnMarker(wall_ms(), producer_id, epoch, sequence, 0, fenced_by)
        try:
            result = await partition.group.propose(marker.encode(), self._write_timeout_s)
        except ProposalError as exc:
            return exc.error
        if isinstance(result, Rejected):
            return result.error
        log.warning(
            "an abort marker for producer %d (epoch %d) written to %s-%d at an operator's request",
            producer_id, epoch, *tp,
        )  # fmt: skip
        return ErrorCode.NONE

    # -- what administrators read (DescribeTransactions, ListTransactions) ----------------------

    def describe(self, txn_id: str) -> TxnMetadata | ErrorCode:
        """The id's transaction, from its coordinator only (NOT_COORDINATOR elsewhere, as
        Kafka's); TRANSACTIONAL_ID_NOT_FOUND for an id it does not hold."""
        handle = self._hosted(txn_id)
        if handle is None or not handle.group.serving:
            return ErrorCode.NOT_COORDINATOR
        txn = handle.replica.machine.txns.get(txn_id)
        return ErrorCode.TRANSACTIONAL_ID_NOT_FOUND if txn is None else txn

    def listing(
        self, state_names: Sequence[str], producer_ids: frozenset[int], running_ms_min: int
    ) -> tuple[tuple[str, ...], list[tuple[str, TxnMetadata]]]:
        """The ids of the partitions this node coordinates (a client asks every node), in
        the states named as Kafka's tools name them (all: none given), of these producer ids
        (all: none given), and open longer than `running_ms_min` (-1: any); with the names
        asked for that no state has (KIP-664's `unknown_state_filters`)."""
        by_name = {state.kafka_name: state for state in TxnState}
        unknown = tuple(name for name in state_names if name not in by_name)
        states = frozenset(by_name[n] for n in state_names if n in by_name)
        if state_names and not states:
            return unknown, []  # only states Kafka does not have were asked for: none is in one
        return unknown, self._listed(states, producer_ids, running_ms_min)

    def _listed(
        self, states: frozenset[TxnState], producer_ids: frozenset[int], running_ms_min: int
    ) -> list[tuple[str, TxnMetadata]]:
        now_ms = wall_ms()
        found = []
        for handle in self.node.txn_states.values():
            if not handle.group.serving:
                continue
            for txn_id, txn in sorted(handle.replica.machine.txns.items()):
                if states and txn.state not in states:
                    continue
                if producer_ids and txn.producer_id not in producer_ids:
                    continue
                if running_ms_min >= 0 and (
                    txn.state != TxnState.ONGOING or now_ms - txn.txn_start_ms <= running_ms_min
                ):
                    continue  # (the duration filter is about transactions still open)
                found.append((txn_id, txn))
        return found

    # -- the coordinators' own work --------------------------------------------------------------

    async def run(self) -> None:
        """On each transaction state partition this node leads: end every prepared
        transaction (markers, then CompleteTxn) and fence every timed-out one."""
        async with asyncio.TaskGroup() as tasks:
            while True:
                for handle in list(self.node.txn_states.values()):
                    handle.replica.on_applied = self._applied
                    if handle.group.serving:
                        self._start_work(handle, tasks)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), WATCH_INTERVAL_S)

    def _applied(self, result: TxnStateResult) -> None:  # in a Raft tick
        if isinstance(result, TxnEndPrepared):
            self._wake.set()
        elif isinstance(result, TxnCompleted):
            waiting = self._completed.pop(result.transactional_id, None)
            if waiting is not None:
                waiting.set()

    def _start_work(self, handle: TxnStateHandle, tasks: asyncio.TaskGroup) -> None:
        machine = handle.replica.machine
        for prepared in machine.preparing():
            key = (prepared.transactional_id, prepared.producer_id, prepared.txn_sequence)
            if key not in self._ending:
                self._ending.add(key)
                tasks.create_task(self._end(handle, prepared, key))
        for txn_id, producer_id, epoch in machine.timed_out(wall_ms()):
            if (txn_id, producer_id, epoch) not in self._fencing:
                self._fencing.add((txn_id, producer_id, epoch))
                tasks.create_task(self._fence(handle, txn_id, producer_id, epoch))

    async def _end(
        self, handle: TxnStateHandle, txn: TxnEndPrepared, key: tuple[str, int, int]
    ) -> None:
        """Markers to every partition of the transaction, then CompleteTxn, while this node
        leads the transaction's partition in the term it started in."""
        term = handle.group.term
        try:
            marker = WriteTxnMarker(
                wall_ms(), txn.producer_id, txn.epoch, txn.txn_sequence, int(txn.commit), term
            )
            await asyncio.gather(*(self._mark(handle, term, tp, marker) for tp in txn.partitions))
            if handle.group.serving and handle.group.term == term:
                done = CompleteTxn(
                    wall_ms(), txn.transactional_id, txn.producer_id, txn.txn_sequence
                )
                await self._propose(handle, done.encode())
        except _CoordinatorFencedError:
            log.warning("transaction of %r: a newer coordinator wrote its markers", key[0])
        finally:
            self._ending.discard(key)

    async def _mark(
        self, handle: TxnStateHandle, term: int, tp: TopicPartition, marker: WriteTxnMarker
    ) -> None:
        """One marker, tried until a partition's group took it or this term ended."""
        while handle.group.serving and handle.group.term == term:
            if not (self._exists(tp) or tp[0] == OFFSETS_TOPIC):
                return  # the topic is gone, and its data with it (Kafka drops its markers)
            error = await self._to_partition(tp, marker)
            if error == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                raise _CoordinatorFencedError
            if error == ErrorCode.NONE or error in MARKER_DONE:
                return
            if error != ErrorCode.COORDINATOR_NOT_AVAILABLE:
                log.error("marker refused by %s-%d: %s", *tp, error.name)
            await asyncio.sleep(MARKER_RETRY_S)

    async def _fence(
        self, handle: TxnStateHandle, txn_id: str, producer_id: int, epoch: int
    ) -> None:
        """A transaction past its timeout: its producer is fenced and the transaction aborted
        (the prepared abort is then ended like any other)."""
        try:
            result = await self._propose(
                handle, FenceTxn(wall_ms(), txn_id, producer_id, epoch).encode()
            )
            if isinstance(result, TxnEndPrepared):
                log.info("transaction of %r timed out: aborted, its producer fenced", txn_id)
                self._wake.set()
        finally:
            self._fencing.discard((txn_id, producer_id, epoch))
