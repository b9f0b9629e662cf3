"""The cluster as a client sees it, and routing that rides out dead nodes and leader changes.

Role: `Client` keeps the bootstrap addresses, one connection per broker, and a metadata cache
(brokers, each topic's partitions and leaders); every client path (Admin, Producer, Consumer,
the fenced writer, the sync client, the Spark side) reaches brokers through it.

Rules:
- Single attempts (`send`, `send_any`, `refresh`, `send_to_leader`) raise their failure; the
  producer's hot path uses them and keeps its own retry loop.
- Calls (`call_any`, `metadata`, `partitions`, `call_leader`) ride out failures until their
  timeout (the `RetryPolicy`'s unless given; cluster/client/retry.py): a broker that does not
  answer is tried last from then on and forgotten as a leader (`lost`); a NOT_LEADER answer's
  hint is believed; otherwise metadata is refreshed from any broker that answers (bootstrap
  addresses and the brokers metadata listed). `reroute` is that recovery, for loops of their own.
- A consumer group's requests go to its coordinator (`call_coordinator`), found through any
  broker and remembered per group until it moves.
- UNKNOWN_TOPIC_OR_PARTITION is final once an answered Metadata request says the topic does not
  exist (or has no such partition); until then it is retried like a leader change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from cluster import native as p
from cluster.addresses import parse_address
from cluster.client.connection import Call, Connection, OnAnswer
from cluster.client.errors import ClientError
from cluster.client.retry import Attempts, Failure, RetryPolicy, final
from statemachine.errors import ErrorCode

# A group's answer that sends the client to find its coordinator again.
COORDINATOR_MOVED = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
    }
)


class Started(NamedTuple):
    """A request written to a broker (`Client.start`), until `Client.finish` awaits it."""

    address: str
    connection: Connection
    call: Call


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader_id: int
    replicas: tuple[int, ...]


class Client:
    """Bootstrap addresses, a connection per broker, a metadata cache, and routing."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        request_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address (host:port) is needed")
        for address in bootstrap:
            parse_address(address)  # a ValueError naming it, before any connection
        self.bootstrap = list(bootstrap)
        self.request_timeout_s = request_timeout_s
        self.retry = retry or RetryPolicy()
        # By address, and by (address, lane) for a consumer group member's coordinator lane.
        self._connections: dict[str | tuple[str, str], Connection] = {}
        self._opening: dict[str | tuple[str, str], asyncio.Lock] = {}
        self._brokers: dict[int, str] = {}
        self._partitions: dict[str, tuple[PartitionInfo, ...]] = {}
        self._unknown: set[str] = set()  # topics the last Metadata answer said do not exist
        # Addresses that did not answer, until one answers a call to any broker: asked last.
        self._unreachable: set[str] = set()
        # (key type, group or transactional id) -> its coordinator's address
        self._coordinators: dict[tuple[int, str], str] = {}

    def _open_connection(self, address: str, lane: str = "") -> Connection | None:
        conn = self._connections.get((address, lane) if lane else address)
        return None if conn is None or conn.closed else conn

    async def connection(
        self, address: str, timeout_s: float | None = None, lane: str = ""
    ) -> Connection:
        """The one connection to `address` (of `lane`: a consumer group member's own, so
        that its JoinGroup, parked at the coordinator until the rebalance ends, holds up no
        other request: a broker answers a connection's requests in order)."""
        key: str | tuple[str, str] = (address, lane) if lane else address
        conn = self._open_connection(address, lane)
        if conn is not None:
            return conn
        async with self._opening.setdefault(key, asyncio.Lock()):
            conn = self._open_connection(address, lane)
            if conn is None:
                try:
                    conn = await Connection.open(address, timeout_s or self.request_timeout_s)
                except (OSError, TimeoutError) as exc:
                    raise ClientError(
                        ErrorCode.NETWORK_EXCEPTION, f"{address}: {exc!r}", address=address
                    ) from exc
                self._connections[key] = conn
            return conn

    async def send(
        self,
        address: str,
        request: p.Request,
        timeout_s: float | None = None,
        on_answer: OnAnswer | None = None,
        lane: str = "",
    ) -> p.Response:
        """One attempt at `address` (on `lane`'s connection); a failure names the address
        (`ClientError.address`)."""
        timeout = timeout_s or self.request_timeout_s
        # An open connection without a coroutine: this is on the path of every produce.
        conn = self._open_connection(address, lane) or await self.connection(address, timeout, lane)
        return await self.finish(self._write(address, conn, request, timeout, on_answer))

    def start(
        self, address: str, request: p.Request, timeout_s: float, on_answer: OnAnswer | None
    ) -> Started | None:
        """`send`'s first half without an await, when a connection to `address` is open:
        `request` is written now, and `finish` awaits its answer. None when no connection is
        open (or it just closed): then `send`, which opens one."""
        conn = self._open_connection(address)
        if conn is None:
            return None
        try:
            return self._write(address, conn, request, timeout_s, on_answer)
        except ClientError:
            return None

    def _write(
        self,
        address: str,
        conn: Connection,
        request: p.Request,
        timeout_s: float,
        on_answer: OnAnswer | None,
    ) -> Started:
        try:
            return Started(address, conn, conn.start(request, timeout_s, on_answer))
        except ClientError as exc:
            exc.address = exc.address or address
            raise

    async def finish(self, started: Started) -> p.Response:
        """`send`'s second half: the answer to a `start`ed request."""
        address = started.address
        try:
            return await started.connection.answer(started.call)
        except TimeoutError as exc:
            raise ClientError(ErrorCode.REQUEST_TIMED_OUT, address, address=address) from exc
        except ClientError as exc:
            exc.address = exc.address or address
            raise

    @staticmethod
    def forget(started: Started) -> None:
        """A `start`ed request whose answer nobody will await."""
        started.connection.forget(started.call)

    def addresses(self) -> list[str]:
        """Every address to ask: known brokers, then bootstrap; those that failed last."""
        known = [a for _, a in sorted(self._brokers.items())]
        every = known + [a for a in self.bootstrap if a not in known]
        return sorted(every, key=self._unreachable.__contains__)  # stable: order kept

    async def send_any(self, request: p.Request, timeout_s: float | None = None) -> p.Response:
        """One round: send to the first broker that answers (`addresses()` in order)."""
        last: ClientError | None = None
        for address in self.addresses():
            try:
                response = await self.send(address, request, timeout_s)
            except ClientError as exc:
                if exc.error not in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT):
                    raise
                if not exc.answered:
                    self.lost(address)
                last = exc
                continue
            self._unreachable.discard(address)
            return response
        raise last or ClientError(ErrorCode.NETWORK_EXCEPTION, "no broker reachable")

    async def call_any(self, request: p.Request, *, timeout_s: float | None = None) -> p.Response:
        """`request` served by some broker, riding out dead nodes and retriable answers until
        `timeout_s` (default: the retry policy's); CallTimeoutError then, final errors at once."""
        waited_for = f"no broker served {type(request).__name__}"
        attempts = self._attempts(waited_for, timeout_s, any_broker=True)
        while True:
            for address in self.addresses():
                try:
                    response = await self.send(
                        address, request, attempts.request_timeout_s(self.request_timeout_s)
                    )
                except ClientError as exc:
                    if final(exc.error):
                        raise
                    attempts.failed(Failure.of(exc, address))
                    if not exc.answered:
                        self.lost(address)
                    if exc.answered or exc.error == ErrorCode.REQUEST_TIMED_OUT:
                        attempts.reached = True
                    if attempts.left_s() <= 0:
                        break
                    continue
                self._unreachable.discard(address)
                return response
            await attempts.pause()

    async def ask_every_broker(
        self, request: p.Request, timeout_s: float | None = None
    ) -> list[p.Response]:
        """`request` answered by every broker metadata names (for what each node holds its
        own part of: groups, transactions); the first failure raised only if none answered."""
        brokers = (await self.metadata((), timeout_s=timeout_s)).brokers
        answers: list[p.Response] = []
        failures: list[ClientError] = []
        for broker in brokers:
            try:
                answers.append(await self.send(broker.address, request, timeout_s))
            except ClientError as exc:
                failures.append(exc)
        if failures and not answers:
            raise failures[0]
        return answers

    def _attempts(
        self, waited_for: str, timeout_s: float | None, *, any_broker: bool = False
    ) -> Attempts:
        patience_s = self.retry.timeout_s if timeout_s is None else timeout_s
        return Attempts(waited_for, patience_s, self.retry, any_broker=any_broker)

    # -- metadata ------------------------------------------------------------------------------

    async def refresh(
        self, topics: Iterable[str] = (), timeout_s: float | None = None
    ) -> p.MetadataResponse:
        """One round of Metadata (`send_any`); the cache learns the answer."""
        return self._learn(await self.send_any(p.Metadata(tuple(topics)), timeout_s))

    async def metadata(
        self, topics: Iterable[str] = (), *, timeout_s: float | None = None
    ) -> p.MetadataResponse:
        """Metadata from some broker, riding out dead nodes (`call_any`); the cache learns it."""
        request = p.Metadata(tuple(topics))
        return self._learn(await self.call_any(request, timeout_s=timeout_s))

    def _learn(self, response: p.Response) -> p.MetadataResponse:
        assert isinstance(response, p.MetadataResponse)
        self._brokers = {b.node_id: b.address for b in response.brokers}
        for t in response.topics:
            if t.error == ErrorCode.NONE:
                self._partitions[t.name] = tuple(
                    PartitionInfo(t.name, pm.partition, pm.leader_id, pm.replicas)
                    for pm in t.partitions
                )
                self._unknown.discard(t.name)
            else:
                self._partitions.pop(t.name, None)
                self._unknown.add(t.name)
        return response

    def cached_partitions(self, topic: str) -> tuple[PartitionInfo, ...] | None:
        """The partitions of a topic from the metadata cache, without a round trip."""
        return self._partitions.get(topic)

    async def partitions(
        self, topic: str, *, timeout_s: float | None = None
    ) -> tuple[PartitionInfo, ...]:
        """A topic's partitions (cached, else from `metadata`); UNKNOWN_TOPIC_OR_PARTITION
        at once when metadata says it does not exist."""
        if topic not in self._partitions:
            await self.metadata([topic], timeout_s=timeout_s)
        found = self._partitions.get(topic)
        if found is None:
            raise ClientError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, topic)
        return found

    def rules_out(self, topic: str, partition: int) -> bool:
        """Whether the last answered metadata says the partition does not exist (its topic
        is unknown, or has fewer partitions)."""
        infos = self._partitions.get(topic)
        return topic in self._unknown or (infos is not None and not 0 <= partition < len(infos))

    def _check_exists(self, topic: str, partition: int) -> None:
        """UNKNOWN_TOPIC_OR_PARTITION if the last answered metadata rules the partition out."""
        if self.rules_out(topic, partition):
            raise ClientError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")

    # -- leaders -------------------------------------------------------------------------------

    def leader_address(self, topic: str, partition: int) -> str | None:
        """The known leader, else a replica to ask (it answers with a hint), one that answered
        when last asked if there is one."""
        infos = self._partitions.get(topic, ())
        if partition >= len(infos):
            return None
        info = infos[partition]
        if info.leader_id in self._brokers:
            return self._brokers[info.leader_id]
        replicas = [self._brokers[r] for r in info.replicas if r in self._brokers]
        answering = [a for a in replicas if a not in self._unreachable]
        return next(iter(answering or replicas), None)

    def note_leader(self, topic: str, partition: int, address: str) -> None:
        """A NOT_LEADER hint: believe it until the next refresh."""
        node_id = self._node_at(address)
        infos = list(self._partitions.get(topic, ()))
        if node_id is not None and partition < len(infos):
            old = infos[partition]
            infos[partition] = PartitionInfo(topic, partition, node_id, old.replicas)
            self._partitions[topic] = tuple(infos)

    def lost(self, address: str) -> None:
        """`address` did not answer (refused, reset, timed out): ask it last from now on, and
        forget it as a leader until metadata names it again."""
        self._unreachable.add(address)
        node_id = self._node_at(address)
        if node_id is None:
            return
        self._partitions = {
            topic: tuple(
                PartitionInfo(topic, i.partition, -1, i.replicas) if i.leader_id == node_id else i
                for i in infos
            )
            for topic, infos in self._partitions.items()
        }

    def _node_at(self, address: str) -> int | None:
        return next((n for n, a in self._brokers.items() if a == address), None)

    async def reroute(
        self,
        topic: str,
        partition: int,
        failure: ClientError | None = None,
        hint: str = "",
        *,
        timeout_s: float | None = None,
    ) -> ClientError | None:
        """After a partition's leader did not serve a request: forget an address that did not
        answer, believe a hint, else refresh the topic's metadata (each request waiting up to
        `timeout_s`). Never raises: a cluster that does not answer now is the next attempt's
        to meet; the refresh's failure is returned, for the caller to report."""
        if failure is not None:
            if failure.unanswered:
                self.lost(failure.address)
            hint = hint or failure.leader
        if hint and (failure is None or hint != failure.address):
            self.note_leader(topic, partition, hint)
            return None
        try:
            await self.refresh([topic], timeout_s)
        except ClientError as exc:
            return exc
        return None

    async def send_to_leader(
        self,
        topic: str,
        partition: int,
        request: p.Request,
        timeout_s: float | None = None,
        on_answer: OnAnswer | None = None,
    ) -> p.Response:
        """One attempt at the partition's leader (the producer's hot path)."""
        if self.leader_address(topic, partition) is None:
            await self.refresh([topic])
        address = self.leader_address(topic, partition)
        if address is None:
            raise ClientError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition}")
        return await self.send(address, request, timeout_s, on_answer)

    async def call_leader(
        self,
        topic: str,
        partition: int,
        request: p.Request,
        *,
        timeout_s: float | None = None,
        request_timeout_s: float | None = None,
    ) -> p.Response:
        """`request` answered by the partition's leader, riding out dead nodes and leader
        changes until `timeout_s` (default: the retry policy's), then CallTimeoutError. An
        answer whose partition result is retriable (NOT_LEADER...) is retried; any other answer
        is returned, for the caller to read its result."""
        attempts = self._attempts(f"no leader for {topic}-{partition} answered", timeout_s)
        per_request_s = request_timeout_s or self.request_timeout_s
        while True:
            wait_s = attempts.request_timeout_s(per_request_s)
            address = self.leader_address(topic, partition)
            unknown = None
            if address is None:
                unknown = await self.reroute(topic, partition, timeout_s=wait_s)
                self._check_exists(topic, partition)
                address = self.leader_address(topic, partition)
            if address is None:
                attempts.failed(no_leader(unknown))
            else:
                wait_s = attempts.request_timeout_s(per_request_s)
                try:
                    response = await self.send(address, request, wait_s)
                except ClientError as exc:
                    if final(exc.error):
                        raise
                    attempts.failed(Failure.of(exc, address))
                    await self.reroute(topic, partition, exc, timeout_s=wait_s)
                else:
                    error, hint = partition_error(response)
                    if error == ErrorCode.NONE or not error.retriable:
                        return response
                    attempts.failed(Failure(error, address))
                    await self.reroute(topic, partition, hint=hint, timeout_s=wait_s)
                    self._check_exists(topic, partition)
            await attempts.pause()

    # -- consumer groups -----------------------------------------------------------------------

    async def call_coordinator(
        self,
        group: str,
        request: p.Request,
        *,
        timeout_s: float | None = None,
        request_timeout_s: float | None = None,
        lane: str = "",
        key_type: int = p.GROUP_KEY,
    ) -> p.Response:
        """`request` answered by `group`'s coordinator (FindCoordinator names it; with
        `key_type` TXN_KEY, the coordinator of the transactional id `group`), on `lane`'s
        connection, riding out dead nodes, coordinator moves (NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE) and other retriable answers
        (a commit's REQUEST_TIMED_OUT, a transaction's CONCURRENT_TRANSACTIONS) until
        `timeout_s`; any other answer is returned, for the caller to read its errors."""
        kind = "transactional id" if key_type == p.TXN_KEY else "group"
        attempts = self._attempts(f"no coordinator of {kind} {group!r} answered", timeout_s)
        per_request_s = request_timeout_s or self.request_timeout_s
        key = (key_type, group)
        while True:
            address = self._coordinators.get(key)
            try:
                if address is None:
                    address = await self._find_coordinator(key, attempts)
                wait_s = attempts.request_timeout_s(per_request_s)
                response = await self.send(address, request, wait_s, lane=lane)
            except ClientError as exc:
                if final(exc.error):
                    raise
                attempts.failed(Failure.of(exc, address or ""))
                self._coordinators.pop(key, None)
                if address is not None and exc.error == ErrorCode.NETWORK_EXCEPTION:
                    self.lost(address)
            else:
                error = group_answer_error(response)
                if error in COORDINATOR_MOVED:
                    self._coordinators.pop(key, None)
                elif not error.retriable or error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    return response
                attempts.failed(Failure(error, address))
            await attempts.pause()

    async def _find_coordinator(self, key: tuple[int, str], attempts: Attempts) -> str:
        wait_s = attempts.request_timeout_s(self.request_timeout_s)
        key_type, name = key
        response = await self.send_any(p.FindCoordinator(name, key_type), wait_s)
        assert isinstance(response, p.FindCoordinatorResponse)
        if response.error != ErrorCode.NONE:
            raise ClientError(ErrorCode(response.error), f"the coordinator of {name!r}")
        self._coordinators[key] = response.address
        return response.address

    async def close_lane(self, lane: str) -> None:
        """Close `lane`'s connections (a group member's, when it leaves)."""
        for key in [k for k in self._connections if isinstance(k, tuple) and k[1] == lane]:
            await self._connections.pop(key).close()

    async def close(self) -> None:
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()


def no_leader(refresh_failed: ClientError | None) -> Failure:
    """Why no leader is known: metadata could not be had, or it names none."""
    if refresh_failed is not None:
        return Failure.of(refresh_failed)
    return Failure(ErrorCode.LEADER_NOT_AVAILABLE, detail="metadata names none")


def group_answer_error(response: p.Response) -> ErrorCode:
    """A group answer's error: its own, or (an OffsetCommit's) the first of its results."""
    error = getattr(response, "error", None)
    if error is not None:
        return ErrorCode(error)
    for result in getattr(response, "results", ()):
        if result.error != ErrorCode.NONE:
            return ErrorCode(result.error)
    return ErrorCode.NONE


def partition_error(response: p.Response) -> tuple[ErrorCode, str]:
    """The first error among an answer's partition results, with its leader hint."""
    for result in getattr(response, "results", ()):
        error = getattr(result, "error", ErrorCode.NONE)
        if error != ErrorCode.NONE:
            return ErrorCode(error), getattr(result, "leader", "")
    return ErrorCode.NONE, ""
