"""A consumer in a consumer group: partitions shared among members, resumed from commits.

Role: `GroupConsumer` joins a group (Kafka's classic protocol, protocol type "consumer", the
range assignor; cluster/client/consumer_protocol.py), so it can share a group with Kafka's
clients. It reads the partitions the group assigns it with a `Consumer`, each from the group's
committed offset (else `auto_offset_reset`), and commits what it consumed when told to.

Rules:
- `poll` drives the membership, as Kafka's clients do: it joins or rejoins when needed (and
  then waits for the rebalance, up to the rebalance timeout) and sends the heartbeats that keep
  the member's session, so it must be called at least every session timeout (its waits are cut
  short to keep heartbeats on time).
- The member talks to its coordinator on a connection of its own (Kafka's clients do the
  same): a JoinGroup parked until the rebalance ends holds up no other request of the cluster
  client it shares with producers, consumers or other members.
- Rebalances are eager: on a rejoin every partition is given up and its uncommitted progress
  forgotten, so records read but not committed are delivered again, to whichever member is
  assigned the partition next. A partition the group has no commit for (or whose commit is
  outside its log, after retention) starts at `auto_offset_reset`, as in Kafka: with LATEST,
  what was written before a member first took it is not read.
- A commit after the group moved on fails with `CommitFailedError` (as Kafka's
  CommitFailedException): those records will be delivered again.
- The member that leads the group looks at the partitions of every topic the group subscribes
  to each `metadata_max_age_ms` (as Kafka's leader does) and rejoins when they changed, so a
  subscribed topic created after the group formed is assigned then (a JoinGroup from the leader
  rebalances a Stable group). A static leader that comes back under a new id without a
  rebalance is not told it leads (the coordinator names its old id, so that it does not assign
  again): until the group next rebalances, no member looks.
- FENCED_INSTANCE_ID (another process took this static member's instance id) is final.
- `close` leaves the group (a dynamic member only: a static one keeps its partitions for its
  session timeout, to come back to them, as KIP-345 intends).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

from cluster import native as p
from cluster.client.consumer import ConsumedRecord, Consumer, ConsumerConfig
from cluster.client.consumer_protocol import (
    PROTOCOL_TYPE,
    RANGE,
    ConsumerProtocolError,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
)
from cluster.client.errors import ClientError
from cluster.client.metadata import Client
from cluster.config import Limits
from statemachine.errors import ErrorCode

# The coordinator parks a JoinGroup for the rebalance timeout and its initial delay (3 s by
# default, a broker setting): a request waits that long and this margin.
JOIN_MARGIN_S = 15.0
REJOIN = frozenset(
    {ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID}
)
# A request names at most this many partitions (a broker's default partitions_per_request_max).
PARTITIONS_PER_REQUEST_MAX = Limits().partitions_per_request_max
T = TypeVar("T")


class GroupMetadata(NamedTuple):
    """Who commits a group's offsets in a transaction (Kafka's ConsumerGroupMetadata): a
    member's generation and ids, checked as KIP-447 says; generation -1 and an empty member
    id skip the checks (a producer outside the group)."""

    group: str
    generation: int = -1
    member_id: str = ""
    instance_id: str = ""


class CommitFailedError(ClientError):
    """A commit the group did not take: it rebalanced (or dropped this member) meanwhile; the
    coordinator's code (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS)."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A member's settings, as Kafka's consumer names them. The session timeout's default is
    Kafka's (45 s since 3.0): how long a crashed member's partitions wait for it."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    rebalance_timeout_ms: int = 60_000  # Kafka's max.poll.interval.ms plays this part
    instance_id: str = ""  # group.instance.id: a static member (KIP-345)
    client_id: str = "raftbroker"
    # Where a partition the group has no commit for starts: Kafka's default, its end.
    auto_offset_reset: int = Consumer.LATEST
    metadata_max_age_ms: int = 300_000  # the leader's look for topics and partitions changed

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be positive and below the session")
        if self.rebalance_timeout_ms <= 0:
            raise ValueError("rebalance_timeout_ms must be positive")
        if self.metadata_max_age_ms <= 0:
            raise ValueError("metadata_max_age_ms must be positive")
        if self.auto_offset_reset not in (Consumer.EARLIEST, Consumer.LATEST):
            raise ValueError("auto_offset_reset is Consumer.EARLIEST or Consumer.LATEST")


class GroupConsumer:
    """Reads the partitions its group assigns it; commits what it consumed."""

    def __init__(
        self,
        cluster: Client,
        group: str,
        topics: Iterable[str],
        config: GroupConfig | None = None,
        consumer_config: ConsumerConfig | None = None,
    ) -> None:
        self.cluster = cluster
        self.group = group
        self.topics = tuple(sorted(set(topics)))
        self.config = config or GroupConfig()
        # Its consumer resets a partition whose position falls outside the log (a commit
        # retention passed, say) where the group's policy says, as Kafka's fetcher does.
        self.consumer = Consumer(
            cluster,
            replace(
                consumer_config or ConsumerConfig(), auto_offset_reset=self.config.auto_offset_reset
            ),
        )
        self.member_id = ""
        self.generation = -1
        self.rebalances = 0  # assignments received: a record may be delivered again after one
        self._lane = f"group-member-{uuid.uuid4().hex}"  # its own coordinator connection
        self._rejoin = True
        self._fenced: ClientError | None = None
        self._next_heartbeat = 0.0
        self._committed: dict[tuple[str, int], int] = {}
        # The leader's: partitions per subscribed topic (0: none yet) when it last assigned.
        self._assigned_counts: dict[str, int] = {}
        self._next_metadata_look = 0.0

    # -- what a member holds ---------------------------------------------------------------------

    def assignment(self) -> set[tuple[str, int]]:
        return set(self.consumer.positions)

    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset of each assigned partition: what a commit of all would store."""
        return {tp: pos.offset for tp, pos in self.consumer.positions.items()}

    # -- the loop --------------------------------------------------------------------------------

    async def poll(self, max_wait_ms: int | None = None) -> list[ConsumedRecord]:
        """The next records of the assigned partitions, [] after `max_wait_ms` without any;
        joining or rejoining the group first when it must (which waits for the rebalance)."""
        if self._fenced is not None:
            raise self._fenced
        wait_ms = self.consumer.config.max_wait_ms if max_wait_ms is None else max_wait_ms
        if self._rejoin:
            await self._join()
        await self._heartbeat_if_due()
        await self._look_at_metadata_if_due()
        if self._rejoin:
            return []
        until_heartbeat_ms = max(0, round((self._next_heartbeat - time.monotonic()) * 1000))
        wait_ms = min(wait_ms, until_heartbeat_ms)
        if not self.consumer.positions:  # a member without partitions: nothing to fetch
            await asyncio.sleep(wait_ms / 1000)
            return []
        return await self.consumer.poll(wait_ms)

    def group_metadata(self) -> GroupMetadata:
        """This member as a transaction's offsets name it (`TransactionalProducer.send_offsets`)."""
        return GroupMetadata(self.group, self.generation, self.member_id, self.config.instance_id)

    async def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit `offsets` (next offset per partition; default: every assigned partition's
        position) once committed in the group's log."""
        wanted = dict(self.positions() if offsets is None else offsets)
        changed = {tp: o for tp, o in wanted.items() if self._committed.get(tp) != o}
        for chunk in _chunks(sorted(changed.items())):
            await self._commit(tuple(p.CommitEntry(t, i, o, "") for (t, i), o in chunk))
        self._committed.update(changed)

    async def _commit(self, entries: tuple[p.CommitEntry, ...]) -> None:
        request = p.OffsetCommit(
            self.group, self.generation, self.member_id, self.config.instance_id, entries
        )
        response = await self._call(request)
        assert isinstance(response, p.OffsetCommitResponse)
        for r in response.results:
            error = ErrorCode(r.error)
            if error in REJOIN or error == ErrorCode.FENCED_INSTANCE_ID:
                self._member_error(error)
                raise CommitFailedError(
                    error, f"group {self.group!r} rebalanced before the commit: "
                    "its records will be delivered again",
                )  # fmt: skip
            if error != ErrorCode.NONE:
                raise ClientError(error, f"group {self.group!r}: commit of {r.topic}-{r.partition}")

    async def close(self) -> None:
        """Leave the group (a dynamic member), so its partitions move at once."""
        if self.member_id and not self.config.instance_id and self._fenced is None:
            request = p.LeaveGroup(self.group, self.member_id, "")
            with contextlib.suppress(ClientError):  # else its session expires instead
                await self.cluster.call_coordinator(
                    self.group, request, timeout_s=self.cluster.request_timeout_s, lane=self._lane
                )
        self.member_id, self._rejoin = "", True
        await self.cluster.close_lane(self._lane)

    # -- membership ------------------------------------------------------------------------------

    def _member_error(self, error: ErrorCode) -> None:
        if error == ErrorCode.FENCED_INSTANCE_ID:
            self._fenced = ClientError(
                error,
                f"group {self.group!r}: another consumer took instance id "
                f"{self.config.instance_id!r}",
            )
            raise self._fenced
        if error == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
        self._rejoin = True

    async def _heartbeat_if_due(self) -> None:
        if time.monotonic() < self._next_heartbeat:
            return
        interval_s = self.config.heartbeat_interval_ms / 1000
        self._next_heartbeat = time.monotonic() + interval_s
        request = p.Heartbeat(self.group, self.generation, self.member_id, self.config.instance_id)
        try:
            response = await self.cluster.call_coordinator(
                self.group, request, timeout_s=interval_s, lane=self._lane
            )
        except ClientError as exc:
            if not exc.retriable:
                raise
            return  # the coordinator is moving: the session may well outlive it
        assert isinstance(response, p.GroupErrorResponse)
        if response.error != ErrorCode.NONE:
            self._member_error(ErrorCode(response.error))

    async def _look_at_metadata_if_due(self) -> None:
        """The leader: rejoin if a subscribed topic's partitions changed since it assigned."""
        if not self._assigned_counts or time.monotonic() < self._next_metadata_look:
            return
        self._next_metadata_look = time.monotonic() + self.config.metadata_max_age_ms / 1000
        try:  # bounded by a heartbeat's interval: the session must not lapse while it waits
            counts = await self._partition_counts(
                self._assigned_counts, timeout_s=self.config.heartbeat_interval_ms / 1000
            )
        except ClientError as exc:
            if not exc.retriable:
                raise
            return  # looked at again at the next age
        if counts != self._assigned_counts:
            self._rejoin = True

    async def _partition_counts(
        self, topics: Iterable[str], timeout_s: float | None = None
    ) -> dict[str, int]:
        """Fresh metadata: each topic's partitions, 0 for a topic that does not exist."""
        if not topics:
            return {}
        answer = await self.cluster.metadata(sorted(topics), timeout_s=timeout_s)
        found = {t.name: len(t.partitions) for t in answer.topics if t.error == ErrorCode.NONE}
        return {topic: found.get(topic, 0) for topic in topics}

    async def _join(self) -> None:
        """Join (or rejoin) the group and take up the partitions it assigns."""
        self.consumer.positions.clear()
        self.consumer.stalled.clear()
        self._committed.clear()
        while True:
            self._assigned_counts = {}  # set again by `_assign` if this round makes it leader
            joined = await self._join_once()
            if joined is None:
                continue
            assignments = await self._assign(joined) if joined.leader == self.member_id else {}
            request = p.SyncGroup(
                self.group,
                self.generation,
                self.member_id,
                self.config.instance_id,
                tuple(p.MemberAssignment(m, a) for m, a in sorted(assignments.items())),
            )
            # Parked until the leader's assignment is in: as long as the rebalance may last.
            synced = await self._call(request, wait_s=self.config.rebalance_timeout_ms / 1000)
            assert isinstance(synced, p.SyncGroupResponse)
            if synced.error in REJOIN:
                self._member_error(ErrorCode(synced.error))
                continue
            self._check(synced.error, "SyncGroup")
            await self._take(synced.assignment)
            self._rejoin = False
            self.rebalances += 1
            self._next_heartbeat = time.monotonic() + self.config.heartbeat_interval_ms / 1000
            return

    async def _join_once(self) -> p.JoinGroupResponse | None:
        """One JoinGroup; None when it must be sent again (with the id it was given)."""
        protocols = (p.GroupProtocol(RANGE, encode_subscription(self.topics)),)
        request = p.JoinGroup(
            self.group,
            self.member_id,
            self.config.instance_id,
            self.config.client_id,
            self.config.session_timeout_ms,
            self.config.rebalance_timeout_ms,
            PROTOCOL_TYPE,
            protocols,
        )
        joined = await self._call(request, wait_s=self.config.rebalance_timeout_ms / 1000)
        assert isinstance(joined, p.JoinGroupResponse)
        error = ErrorCode(joined.error)
        if error == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = joined.member_id
            return None
        if error in REJOIN:
            self._member_error(error)
            await asyncio.sleep(self.cluster.retry.backoff_s)
            return None
        self._check(error, "JoinGroup")
        self.member_id, self.generation = joined.member_id, joined.generation
        return joined

    async def _assign(self, joined: p.JoinGroupResponse) -> dict[str, bytes]:
        """The leader's part: the range assignment of every member's subscription."""
        subscriptions: dict[str, tuple[str, ...]] = {}
        for member in joined.members:
            try:
                subscriptions[member.member_id] = decode_subscription(member.metadata)
            except ConsumerProtocolError:
                subscriptions[member.member_id] = ()  # unreadable: it is assigned nothing
        # Fresh, not cached: a topic that does not exist yet is assigned to nobody, and looked
        # at again each metadata_max_age_ms (`_look_at_metadata_if_due`).
        counts = await self._partition_counts({t for ts in subscriptions.values() for t in ts})
        plan = range_assign(subscriptions, {t: n for t, n in counts.items() if n})
        self._assigned_counts = counts
        self._next_metadata_look = time.monotonic() + self.config.metadata_max_age_ms / 1000
        return {member: encode_assignment(a) for member, a in plan.items()}

    async def _take(self, assignment_bytes: bytes) -> None:
        """Start each assigned partition at the group's commit; where there is none, or it is
        outside the log (retention removed what it pointed at), at auto_offset_reset."""
        try:
            assignment = decode_assignment(assignment_bytes)
        except ConsumerProtocolError as exc:
            raise ClientError(ErrorCode.INVALID_REQUEST, f"group {self.group!r}: {exc}") from exc
        owned = [(t, i) for t, ps in sorted(assignment.items()) for i in ps]
        committed = await self._fetch_committed(owned)
        for topic, partition in owned:
            offset = committed.get((topic, partition))
            if offset is None:
                await self.consumer.seek(topic, partition, self.config.auto_offset_reset)
            else:  # outside the log, the first fetch says so and the consumer resets it
                await self.consumer.seek(topic, partition, offset)
                self._committed[(topic, partition)] = offset

    async def _fetch_committed(self, owned: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        if not owned:  # a member assigned nothing (naming no partition would ask for them all)
            return {}

        async def checked(request: p.Request) -> p.Response:
            response = await self._call(request)
            assert isinstance(response, p.OffsetFetchResponse)
            self._check(response.error, "OffsetFetch")
            return response

        # A read_committed member starts from no offset a transaction still has pending
        # (KIP-447): it waits for the transaction's end, not its output.
        stable = self.consumer.config.read_committed
        return await fetch_committed(checked, self.group, owned, require_stable=stable)

    async def _call(self, request: p.Request, wait_s: float = 0.0) -> p.Response:
        per_request_s = max(self.cluster.request_timeout_s, wait_s + JOIN_MARGIN_S)
        return await self.cluster.call_coordinator(
            self.group,
            request,
            timeout_s=self.cluster.retry.timeout_s + per_request_s,
            request_timeout_s=per_request_s,
            lane=self._lane,
        )

    def _check(self, error: int, what: str) -> None:
        if error != ErrorCode.NONE:
            code = ErrorCode(error)
            if code == ErrorCode.FENCED_INSTANCE_ID:
                self._member_error(code)
            raise ClientError(code, f"group {self.group!r}: {what} refused")


async def fetch_committed(
    call: Callable[[p.Request], Awaitable[p.Response]],
    group: str,
    partitions: Sequence[tuple[str, int]],
    *,
    require_stable: bool = False,
    backoff_s: float = 0.05,
    patience_s: float = 120.0,
) -> dict[tuple[str, int], int]:
    """The group's committed offsets of `partitions` (none named: of every partition it has),
    leaving out those it has none for; in requests of at most the partitions one may carry.
    `call` sends a request to the group's coordinator and raises its errors. With
    `require_stable`, a partition whose offset a transaction has pending is asked again
    (backing off) until that transaction ends, for `patience_s` at most (a transaction's
    coordinator aborts it at its timeout, 60 s by default): UNSTABLE_OFFSET_COMMIT then."""
    found: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + patience_s
    for chunk in _chunks(partitions) if partitions else [()]:
        asked: Sequence[tuple[str, int]] = chunk
        while True:
            wanted = tuple(p.GroupPartition(t, i) for t, i in asked)
            response = await call(p.OffsetFetch(group, wanted, require_stable))
            assert isinstance(response, p.OffsetFetchResponse)
            unstable = [(o.topic, o.partition) for o in response.offsets if o.error]
            found.update(
                ((o.topic, o.partition), o.offset)
                for o in response.offsets
                if o.offset >= 0 and not o.error
            )
            if not unstable:
                break
            if time.monotonic() > deadline:
                message = f"group {group!r}: offsets of {unstable} still pending in a transaction"
                raise ClientError(ErrorCode.UNSTABLE_OFFSET_COMMIT, message)
            asked = unstable
            await asyncio.sleep(backoff_s)  # a backoff between asks, as Kafka's consumer's
    return found


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """`items` in runs that a request may carry."""
    for start in range(0, len(items), PARTITIONS_PER_REQUEST_MAX):
        yield items[start : start + PARTITIONS_PER_REQUEST_MAX]
