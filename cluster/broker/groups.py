"""Consumer groups on this node: the coordinators of the offsets partitions it leads.

Role: a group lives in one partition of the internal topic `__consumer_offsets`
(`partition_of`: a CRC of its id over the topic's partitions), and its coordinator is that
partition's Raft leader, as in Kafka and Redpanda. `GroupService` keeps one `Coordinator`
(cluster/broker/coordinator/, the protocol's decisions, sans I/O) per offsets partition
this node leads, feeds it requests and the monotonic clock, parks JoinGroup and SyncGroup on
futures until the rebalance moves on, proposes the records it asks to persist and the committed
offsets, and answers once they are committed. Both client listeners call it.

Rules:
- A node that does not lead the group's partition answers NOT_COORDINATOR; a leader whose
  term-start barrier has not applied yet (its machine may lack entries of earlier terms)
  answers COORDINATOR_LOAD_IN_PROGRESS. A new term loads the coordinator afresh from the
  replicated records (members keep their generation, session timers restart); a lost one
  answers every parked request NOT_COORDINATOR.
- What must outlive the coordinator goes through the log before it is acknowledged: an
  OffsetCommit is answered after its entry commits, a rebalance ends (SyncGroup answers) after
  its record commits. Entries carry the leader's wall clock (expiry reads it); timers run on
  the monotonic clock and reach replicas only through records.
- The topic is created through the metadata group on the first need of a coordinator; until
  its partitions have leaders, FindCoordinator answers COORDINATOR_NOT_AVAILABLE (retriable).
- Offsets of deleted topics, and of groups empty for `offsets_retention_ms`, are removed by
  entries the coordinators propose (`run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import NamedTuple

from cluster.broker.coordinator import (
    Coordinator,
    CoordinatorLimits,
    Effect,
    JoinRequest,
    JoinResult,
    MemberRef,
    Persist,
    Reply,
    SyncRequest,
    SyncResult,
)
from cluster.broker.group_admin import GroupAdmin, Seat
from cluster.broker.internal_topics import (
    coordinator_of,
    ensure_offsets_topic,
    internal_topic,
    offsets_partition,
)
from cluster.broker.node import INTERNAL_TOPICS, OFFSETS_TOPIC, Node, OffsetsHandle
from cluster.broker.peers import PeerWatcher
from cluster.clock import wall_ms
from cluster.raft import ProposalError
from statemachine.codec import pack
from statemachine.commands import (
    CommitOffsets,
    CommitTxnOffsets,
    DeleteTopicOffsets,
    ExpireOffsets,
    StoreGroup,
)
from statemachine.errors import ErrorCode, Rejected
from statemachine.group_records import GroupRecord
from statemachine.metadata import TopicInfo
from statemachine.offsets import GroupStored, OffsetsStateMachine, group_id_error

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.1  # how often leadership of the offsets partitions is looked at
# A parked JoinGroup waits for the rebalance, bounded by the rebalance timeout it asked for
# and the initial delay, plus this; a SyncGroup by the group's rebalance timeout, plus this.
PARK_MARGIN_S = 5.0
MEMBER_ID_PREFIX_CHARS_MAX = 255  # + 37 for "-<uuid>": well within every name bound
NO_OFFSET = -1


class CommitPartition(NamedTuple):
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str


class FetchedOffset(NamedTuple):
    topic: str
    partition: int
    offset: int  # -1: none committed
    leader_epoch: int
    metadata: str
    error: ErrorCode = ErrorCode.NONE


class GroupService(GroupAdmin):
    """Every consumer-group request this node answers."""

    def __init__(
        self, node: Node, peers: PeerWatcher, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`clock`: the coordinators' time in seconds (time.monotonic() in a node), which
        their session, rebalance and expiry timers run on."""
        self.node = node
        self.peers = peers
        self._clock = clock
        timing, limits = node.config.timing, node.config.limits
        self._limits = CoordinatorLimits(
            session_timeout_ms_min=timing.group_session_timeout_ms_min,
            session_timeout_ms_max=timing.group_session_timeout_ms_max,
            initial_rebalance_delay_ms=timing.group_initial_rebalance_delay_ms,
            group_members_max=limits.group_members_max,
            groups_max=node.limits.groups_per_partition_max,
        )
        self._timeout_s = timing.request_timeout_ms / 1000
        self._seats: dict[int, Seat] = {}
        self._tokens = 0
        self._wake = asyncio.Event()

    # -- where a group lives -------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def offsets_topic(self) -> TopicInfo | None:
        return internal_topic(self.node, OFFSETS_TOPIC)

    async def ensure_offsets_topic(self) -> ErrorCode:
        """NONE once the offsets topic exists; else COORDINATOR_NOT_AVAILABLE while its
        creation is proposed (cluster/broker/internal_topics.py)."""
        return await ensure_offsets_topic(self.node, self._timeout_s)

    def offsets_partition(self, group_id: str) -> int | None:
        """The offsets partition that holds `group_id` (None until the topic exists)."""
        return offsets_partition(self.node, group_id)

    async def coordinator_node(self, group_id: str) -> tuple[ErrorCode, int]:
        """The node coordinating `group_id` (FindCoordinator): the leader of its offsets
        partition, known here when this node hosts a replica of it, else from the peers'
        status reports. The offsets topic is created on the first ask; until it has leaders
        the answer is COORDINATOR_NOT_AVAILABLE (retriable), as Kafka's."""
        if group_id_error(group_id, self.node.limits):
            return ErrorCode.INVALID_GROUP_ID, -1
        await self.ensure_offsets_topic()
        return coordinator_of(self.node, self.peers, OFFSETS_TOPIC, group_id)

    def _seat_for(self, group_id: str) -> Seat | ErrorCode:
        if group_id_error(group_id, self.node.limits):
            return ErrorCode.INVALID_GROUP_ID
        partition = self.offsets_partition(group_id)
        if partition is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        handle = self.node.offsets.get((OFFSETS_TOPIC, partition))
        if handle is None:
            return ErrorCode.NOT_COORDINATOR
        seat = self._refresh(partition, handle)
        if seat.coordinator is None:
            return (
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                if handle.group.is_leader
                else ErrorCode.NOT_COORDINATOR
            )
        return seat

    def _refresh(self, partition: int, handle: OffsetsHandle) -> Seat:
        """The seat of `partition`, its coordinator loaded or dropped as its leadership is."""
        seat = self._seats.get(partition)
        if seat is None or seat.handle is not handle:
            if seat is not None:
                self._drop(seat)
            seat = self._seats[partition] = Seat(handle)
        group = handle.group
        if not group.serving:
            self._drop(seat)
            return seat
        term = group.term
        if seat.coordinator is None or seat.term != term:
            self._drop(seat)
            seat.coordinator = Coordinator(self._limits, _new_member_id)
            seat.coordinator.load(_records(handle.replica.machine), self._now_ms())
            seat.term = term
            log.info("coordinating the groups of %s-%d (term %d)", OFFSETS_TOPIC, partition, term)
        return seat

    def _drop(self, seat: Seat) -> None:
        if seat.coordinator is None:
            return
        self._settle(seat, seat.coordinator.abandon())
        seat.coordinator = None
        for future in seat.waiting.values():
            if not future.done():
                future.set_result(JoinResult(ErrorCode.NOT_COORDINATOR))
        seat.waiting.clear()

    # -- the coordinator's effects -------------------------------------------------------------

    def _settle(self, seat: Seat, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                future = seat.waiting.pop(effect.token, None)
                if future is not None and not future.done():
                    future.set_result(effect.result)
            else:
                self._persist(seat, effect)
        self._wake.set()  # the next deadline may have moved

    def _persist(self, seat: Seat, persist: Persist) -> None:
        coordinator = seat.coordinator
        assert coordinator is not None, "a record to persist without a coordinator"
        seq = persist.seq
        command = StoreGroup(persist.group_id, wall_ms(), persist.record.encode()).encode()

        def done(result: object, error: Exception | None) -> None:  # in the apply, on the loop
            if seat.coordinator is not coordinator:
                return  # leadership moved meanwhile: the parked requests were answered
            if error is None and isinstance(result, GroupStored):
                effects = coordinator.persisted(persist.group_id, seq, self._now_ms())
            else:
                log.warning("group %s: its record did not commit (%s)", persist.group_id,
                            error or result)  # fmt: skip
                effects = coordinator.persist_failed(persist.group_id, seq, self._now_ms())
            self._settle(seat, effects)

        try:
            seat.handle.group.submit(command, self._timeout_s, done)
        except ProposalError as exc:
            asyncio.get_running_loop().call_soon(done, None, exc)

    def _park(self, seat: Seat) -> tuple[int, asyncio.Future[JoinResult | SyncResult]]:
        self._tokens += 1
        future: asyncio.Future[JoinResult | SyncResult] = asyncio.get_running_loop().create_future()
        seat.waiting[self._tokens] = future
        return self._tokens, future

    async def _await(
        self,
        seat: Seat,
        token: int,
        future: asyncio.Future[JoinResult | SyncResult],
        wait_s: float,
    ) -> JoinResult | SyncResult | None:
        try:
            return await asyncio.wait_for(asyncio.shield(future), wait_s)
        except TimeoutError:
            seat.waiting.pop(token, None)  # the coordinator's late answer goes nowhere
            return None

    # -- the protocol ----------------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> JoinResult:
        names_max = self.node.limits.name_length_max
        # Every name a member brings is kept and shown to both listeners' clients (listings,
        # descriptions), each of whose answers bounds a name: beyond it, refused here.
        names = (
            request.instance_id or "",
            request.protocol_type,
            *(protocol.name for protocol in request.protocols),
        )
        if any(len(name) > names_max for name in names):
            return JoinResult(ErrorCode.INVALID_REQUEST, member_id=request.member_id)
        # Kept (and shown by DescribeGroups) within the bound every name has on our wire.
        request = request._replace(client_id=request.client_id[:names_max])
        seat = self._seat_for(request.group_id)
        if isinstance(seat, ErrorCode):
            return JoinResult(seat, member_id=request.member_id)
        assert seat.coordinator is not None
        token, future = self._park(seat)
        self._settle(seat, seat.coordinator.join(request, token, self._now_ms()))
        wait_s = self.join_wait_s(request.rebalance_timeout_ms)
        result = await self._await(seat, token, future, wait_s)
        if not isinstance(result, JoinResult):
            return JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=request.member_id)
        return result

    def join_wait_s(self, rebalance_timeout_ms: int) -> float:
        """How long a JoinGroup may be parked: its rebalance timeout, the initial delay, and a
        margin."""
        delay_ms = self._limits.initial_rebalance_delay_ms
        # Not negative: a JoinGroup v0 with a negative session timeout carries it as its
        # rebalance timeout, and is refused (INVALID_SESSION_TIMEOUT) at once, not parked.
        return (max(rebalance_timeout_ms, 0) + delay_ms) / 1000 + PARK_MARGIN_S

    def sync_wait_s(self, group_id: str) -> float:
        """How long a SyncGroup may be parked: the group's rebalance timeout, and a margin
        (the margin alone where this node does not coordinate the group)."""
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode) or seat.coordinator is None:
            return PARK_MARGIN_S
        return _sync_wait_s(seat.coordinator, group_id)

    async def sync(self, request: SyncRequest) -> SyncResult:
        seat = self._seat_for(request.group_id)
        if isinstance(seat, ErrorCode):
            return SyncResult(seat)
        assert seat.coordinator is not None
        wait_s = _sync_wait_s(seat.coordinator, request.group_id)
        token, future = self._park(seat)
        self._settle(seat, seat.coordinator.sync(request, token, self._now_ms()))
        result = await self._await(seat, token, future, wait_s)
        if isinstance(result, JoinResult):  # NOT_COORDINATOR from _drop
            return SyncResult(result.error)
        return result if result is not None else SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> ErrorCode:
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode):
            return seat
        assert seat.coordinator is not None
        return seat.coordinator.heartbeat(
            group_id, generation, member_id, instance_id, self._now_ms()
        )

    def leave(
        self, group_id: str, members: tuple[MemberRef, ...]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode):
            return seat, [seat] * len(members)
        assert seat.coordinator is not None
        error, errors, effects = seat.coordinator.leave(group_id, members, self._now_ms())
        self._settle(seat, effects)
        return error, errors

    # -- offsets -----------------------------------------------------------------------------

    async def commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        partitions: list[CommitPartition],
        *,
        producer: tuple[int, int] | None = None,
    ) -> list[ErrorCode]:
        """One error per partition, in order: NONE for each committed. With a `producer`
        (its id and epoch): TxnOffsetCommit, the offsets pending in its transaction, which
        must have registered this group's offsets partition (AddOffsetsToTxn) first."""
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode):
            return [seat] * len(partitions)
        assert seat.coordinator is not None
        refusal = seat.coordinator.commit_refusal(
            group_id,
            generation,
            member_id,
            instance_id,
            self._now_ms(),
            transactional=producer is not None,
        )
        if refusal is ErrorCode.NONE and producer is not None:
            # Checked again in apply; here so that a refused one never reaches the log.
            refusal = seat.handle.replica.machine.txns.check_data(*producer)
        if refusal is not ErrorCode.NONE:
            return [refusal] * len(partitions)
        errors = [self._commit_refusal(p) for p in partitions]
        taken = [list(p) for p, e in zip(partitions, errors, strict=True) if e is ErrorCode.NONE]
        if not taken:
            return errors
        command = (
            CommitOffsets(group_id, wall_ms(), pack(taken))
            if producer is None
            else CommitTxnOffsets(group_id, wall_ms(), *producer, pack(taken))
        )
        error = await self._propose(seat, command.encode())
        return [error if e is ErrorCode.NONE else e for e in errors]

    def _commit_refusal(self, partition: CommitPartition) -> ErrorCode:
        topic = self.node.metadata_replica.machine.topics.get(partition.topic)
        if (
            topic is None
            or topic.name in INTERNAL_TOPICS
            or not (0 <= partition.partition < topic.partitions)
        ):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if len(partition.metadata.encode()) > self.node.limits.offset_metadata_bytes_max:
            return ErrorCode.OFFSET_METADATA_TOO_LARGE
        return ErrorCode.NONE

    async def _propose(self, seat: Seat, command: bytes) -> ErrorCode:
        try:
            result = await seat.handle.group.propose(command, self._timeout_s)
        except ProposalError as exc:
            # The entry may yet commit: a retry commits the same offsets again, harmlessly.
            return (
                ErrorCode.NOT_COORDINATOR
                if exc.error == ErrorCode.NOT_LEADER_OR_FOLLOWER
                else exc.error
            )
        return result.error if isinstance(result, Rejected) else ErrorCode.NONE

    def fetch(
        self, group_id: str, asked: list[tuple[str, int]] | None, *, require_stable: bool = False
    ) -> tuple[ErrorCode, list[FetchedOffset]]:
        """The group's committed offsets of `asked` (every one it has: None), -1 where none.
        With `require_stable` (KIP-447), a partition whose offset a transaction has pending
        answers UNSTABLE_OFFSET_COMMIT (retriable) instead, until its marker."""
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode):
            return seat, []
        entry = seat.handle.replica.machine.groups.get(group_id)
        committed = entry.offsets if entry is not None else {}
        keys = sorted(committed) if asked is None else asked
        fetched = []
        for topic, partition in keys:
            c = committed.get((topic, partition))
            if require_stable and entry is not None and entry.is_pending((topic, partition)):
                fetched.append(FetchedOffset(topic, partition, NO_OFFSET, -1, "",
                                             ErrorCode.UNSTABLE_OFFSET_COMMIT))  # fmt: skip
            elif c is None:
                fetched.append(FetchedOffset(topic, partition, NO_OFFSET, -1, ""))
            else:
                fetched.append(FetchedOffset(topic, partition, c.offset, c.leader_epoch,
                                             c.metadata))  # fmt: skip
        return ErrorCode.NONE, fetched

    # -- timers and housekeeping -------------------------------------------------------------

    def _hosted(self) -> list[tuple[int, OffsetsHandle]]:
        return [(key[1], handle) for key, handle in self.node.offsets.items()]

    async def run(self) -> None:
        """Tick every coordinator at its next deadline; follow leadership; sweep offsets."""
        timing = self.node.config.timing
        next_expiry = self._clock() + timing.offsets_retention_check_interval_ms / 1000
        next_sweep = self._clock()
        while True:
            now_ms = self._now_ms()
            for partition, handle in self._hosted():
                seat = self._refresh(partition, handle)
                if seat.coordinator is not None:
                    self._settle(seat, seat.coordinator.tick(now_ms))
                    seat.coordinator.prune(handle.replica.machine.groups.__contains__)
            for partition in [
                p for p in self._seats if (OFFSETS_TOPIC, p) not in self.node.offsets
            ]:
                self._drop(self._seats.pop(partition))
            if self._clock() >= next_sweep:
                next_sweep = self._clock() + timing.expiry_tick_interval_ms / 1000
                await self._sweep_deleted_topics()
            if self._clock() >= next_expiry:
                next_expiry = self._clock() + timing.offsets_retention_check_interval_ms / 1000
                await self._expire_offsets(timing.offsets_retention_ms)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._sleep_s())

    def _sleep_s(self) -> float:
        deadlines = [
            d
            for s in self._seats.values()
            if s.coordinator is not None
            for d in [s.coordinator.next_deadline_ms()]
            if d is not None
        ]
        if not deadlines:
            return WATCH_INTERVAL_S
        return min(WATCH_INTERVAL_S, max(0.0, (min(deadlines) - self._now_ms()) / 1000))

    async def _sweep_deleted_topics(self) -> None:
        topics = self.node.metadata_replica.machine.topics
        for seat in list(self._seats.values()):
            if seat.coordinator is None:
                continue
            gone = {
                c.topic
                for entry in seat.handle.replica.machine.groups.values()
                for c in entry.offsets.values()
                if c.topic not in topics
            }
            for topic in sorted(gone):
                await self._propose(seat, DeleteTopicOffsets(topic).encode())

    async def _expire_offsets(self, retention_ms: int) -> None:
        for seat in list(self._seats.values()):
            if seat.coordinator is not None:
                await self._propose(seat, ExpireOffsets(wall_ms(), retention_ms).encode())


def _sync_wait_s(coordinator: Coordinator, group_id: str) -> float:
    return coordinator.rebalance_timeout_ms(group_id) / 1000 + PARK_MARGIN_S


def _records(machine: OffsetsStateMachine) -> list[tuple[str, GroupRecord]]:
    return [(g, e.record) for g, e in sorted(machine.groups.items()) if e.record is not None]


def _new_member_id(prefix: str) -> str:
    """Kafka's form: the client id (or static instance id), a dash, a random UUID; the prefix
    cut so that an id stays within the wire's bound on names (a Kafka client id may be 32 KiB)."""
    return f"{prefix[:MEMBER_ID_PREFIX_CHARS_MAX]}-{uuid.uuid4()}"


def client_host(source: str) -> str:
    """A member's host as Kafka's DescribeGroups shows it: its address after a slash."""
    return f"/{source}" if source else ""
