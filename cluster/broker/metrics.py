"""Metrics (prometheus-client, one registry per node, no globals) and the HTTP endpoint.

`/metrics` serves the Prometheus text format; `/healthz` answers 200 when the node knows a
metadata leader and every Raft group it hosts is healthy, 503 otherwise (with the reasons).
Raft progress, and the client port's open and refused connections, are collected at scrape
time from their owners, so an idle node does no work.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cluster.broker.server import ConnectionStats
from cluster.config import NodeConfig
from cluster.errors import RaftbrokerError
from cluster.raft import GroupStatus

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LINGER_S = 1.0
LINGER_CHUNK_BYTES = 64 * 1024
# `METHOD SP request-target SP HTTP-version` (RFC 9112) with an origin-form target, and
# `field-name ":" field-value` with a token name (no obsolete line folding).
_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) (/[!-~]*) HTTP/1\.[01]")
_HEADER = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t -~\x80-\xff]*")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "raftbroker_requests", "Requests by operation and error", ["op", "error"], registry=r
        )
        self.latency = Histogram(
            "raftbroker_request_seconds",
            "Request latency by operation",
            ["op"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.produced_records = Counter(
            "raftbroker_produced_records", "Records appended", registry=r
        )
        self.fetched_bytes = Counter("raftbroker_fetched_bytes", "Batch bytes served", registry=r)
        self.dedup_hits = Counter(
            "raftbroker_dedup_hits", "Retries answered as duplicates", registry=r
        )
        self.fenced = Counter(
            "raftbroker_fenced_batches", "Batches refused for an old epoch", registry=r
        )
        self.out_of_order = Counter(
            "raftbroker_out_of_order_batches", "Batches refused as out of order", registry=r
        )
        self.leader_changes = Counter(
            "raftbroker_leader_changes", "Leadership changes seen, per group", ["group"], registry=r
        )
        # Children by label values: `labels()` takes a lock and builds its key on every call,
        # on the path of every request. Ops and error names are few, so these stay small.
        self._request_counts: dict[tuple[str, str], Counter] = {}
        self._latencies: dict[str, Histogram] = {}

    def request_done(self, op: str, error: str, seconds: float) -> None:
        """One request answered: counted by op and error, its latency observed by op."""
        count = self._request_counts.get((op, error))
        if count is None:
            count = self._request_counts[op, error] = self.requests.labels(op, error)
        count.inc()
        latency = self._latencies.get(op)
        if latency is None:
            latency = self._latencies[op] = self.latency.labels(op)
        latency.observe(seconds)

    @contextlib.contextmanager
    def timed(self, op: str) -> Iterator[None]:
        """A request handled in the block: `request_done` with its latency, and the refusal's
        code when the block raises a RaftbrokerError (NONE otherwise)."""
        started, error = time.perf_counter(), "NONE"
        try:
            yield
        except RaftbrokerError as exc:
            error = exc.error.name
            raise
        finally:
            self.request_done(op, error, time.perf_counter() - started)

    def watch_groups(self, statuses: Callable[[], list[GroupStatus]]) -> None:
        self.registry.register(_RaftCollector(statuses))

    def watch_connections(self, *stats: Callable[[], ConnectionStats]) -> None:
        """Every listener's connections, labelled by listener, in one collector."""
        self.registry.register(_ConnectionCollector(stats))

    def watch_raft_port(self, stats: Callable[[], RaftPortStats]) -> None:
        self.registry.register(_RaftPortCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RaftCollector(Collector):
    def __init__(self, statuses: Callable[[], list[GroupStatus]]) -> None:
        self._statuses = statuses

    def collect(self) -> Iterator[GaugeMetricFamily]:
        commit = GaugeMetricFamily("raftbroker_raft_commit_index", "Commit index", labels=["group"])
        applied = GaugeMetricFamily(
            "raftbroker_raft_last_applied", "Last applied index", labels=["group"]
        )
        term = GaugeMetricFamily("raftbroker_raft_term", "Current term", labels=["group"])
        leader = GaugeMetricFamily("raftbroker_raft_is_leader", "1 when leader", labels=["group"])
        healthy = GaugeMetricFamily(
            "raftbroker_raft_healthy", "1 when applying normally", labels=["group"]
        )
        log_bytes = GaugeMetricFamily(
            "raftbroker_raft_log_bytes", "Raft log bytes not yet compacted", labels=["group"]
        )
        for s in self._statuses():
            commit.add_metric([s.name], s.commit_index)
            applied.add_metric([s.name], s.last_applied)
            term.add_metric([s.name], s.term)
            leader.add_metric([s.name], int(s.is_leader))
            healthy.add_metric([s.name], int(s.healthy))
            log_bytes.add_metric([s.name], s.log_bytes)
        yield from (commit, applied, term, leader, healthy, log_bytes)


class _ConnectionCollector(Collector):
    def __init__(self, stats: tuple[Callable[[], ConnectionStats], ...]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        open_now = GaugeMetricFamily(
            "raftbroker_client_connections",
            "Connections open on a listener (client: the native protocol, kafka), by slot "
            "(peer: a peer node's host, in slots of their own)",
            labels=["listener", "slot"],
        )
        refused = CounterMetricFamily(
            "raftbroker_refused_connections",
            "Connections refused at a limit, or closed for a frame not read in time or a "
            "request that does not decode, by listener",
            labels=["listener", "reason"],
        )
        for stats_of in self._stats:
            stats = stats_of()
            open_now.add_metric([stats.listener, "client"], stats.clients)
            open_now.add_metric([stats.listener, "peer"], stats.peers)
            for reason, count in stats.refused.items():
                refused.add_metric([stats.listener, reason.value], count)
        yield from (open_now, refused)


class RaftPortStats(NamedTuple):
    """The Raft port's connections before they open, and the groups' messages over the open
    ones, by peer (the mesh's counters)."""

    unopened: int  # accepted or dialled, not authenticated yet
    refused: int  # closed unread: a stranger's address, or past a pre-auth cap
    failed_handshakes: int  # dropped before they opened: bad hello, wrong secret, too slow
    messages_sent: Mapping[str, int]  # by peer's Raft address
    messages_received: Mapping[str, int]


class _RaftPortCollector(Collector):
    def __init__(self, stats: Callable[[], RaftPortStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        yield GaugeMetricFamily(
            "raftbroker_raft_unopened_links",
            "Raft-port links not authenticated yet",
            value=stats.unopened,
        )
        yield CounterMetricFamily(
            "raftbroker_raft_refused_connections",
            "Raft-port connections closed unread: a stranger's address, or past a pre-auth cap",
            value=stats.refused,
        )
        yield CounterMetricFamily(
            "raftbroker_raft_failed_handshakes",
            "Raft-port links dropped before they opened (bad hello, wrong secret, deadline)",
            value=stats.failed_handshakes,
        )
        messages = CounterMetricFamily(
            "raftbroker_raft_messages",
            "Raft groups' messages to and from each peer (its Raft address), every group's",
            labels=["peer", "direction"],
        )
        for direction, counts in (
            ("sent", stats.messages_sent),
            ("received", stats.messages_received),
        ):
            for peer, count in sorted(counts.items()):
                messages.add_metric([peer, direction], count)
        yield messages


class _RefusedError(Exception):
    """A request answered with `status` (when there is one to answer), then closed."""

    def __init__(self, status: HTTPStatus | None, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class HttpEndpoint:
    """GET /metrics and GET /healthz; anything else is 404. One request per connection.

    Every request is bounded before it is read: at most `http_connections_max` connections at
    once, `http_connections_per_address_max` of them from one source address (more are closed
    unanswered), a head (request line and headers) of at most
    `http_head_bytes_max` bytes and `http_headers_max` headers (431 otherwise), all of it
    within `http_request_timeout_ms` of the accept however it trickles in (408), and the answer
    written within that time again. Malformed requests get 400, other methods 405. A refusal
    is logged at DEBUG only: whoever reaches the port could otherwise flood the log.
    """

    def __init__(
        self, metrics: Metrics, health: Callable[[], list[str]], config: NodeConfig
    ) -> None:
        self._metrics = metrics
        self._health = health
        self._host = config.host
        self._port = config.http_port
        self._head_bytes_max = config.limits.http_head_bytes_max
        self._headers_max = config.limits.http_headers_max
        self._connections_max = config.limits.http_connections_max
        self._per_address_max = config.limits.http_connections_per_address_max
        self._timeout_s = config.timing.http_request_timeout_ms / 1000
        self._connections = 0
        self._by_address: collections.Counter[str] = collections.Counter()

    async def serve(self) -> None:
        # The reader's limit bounds what one line may buffer; the head's bound is checked on
        # top of it, line by line.
        server = await asyncio.start_server(
            self._respond, self._host, self._port, limit=self._head_bytes_max
        )
        async with server:
            await server.serve_forever()

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) else ""
        if (
            self._connections >= self._connections_max
            or self._by_address[address] >= self._per_address_max
        ):
            writer.transport.abort()
            return
        self._connections += 1
        self._by_address[address] += 1
        try:
            await self._serve_one(reader, writer)
        finally:
            self._connections -= 1
            self._by_address[address] -= 1
            if not self._by_address[address]:
                del self._by_address[address]
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(self._timeout_s):
                    await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                path = await self._read_request(reader)
            status, body, kind = self._route(path)
        except TimeoutError:
            status, body, kind = HTTPStatus.REQUEST_TIMEOUT, b"request timeout\n", "text/plain"
        except _RefusedError as refused:
            log.debug("http request from %s refused: %s", _peer(writer), refused)
            if refused.status is None:
                return
            status, body, kind = refused.status, f"{refused}\n".encode(), "text/plain"
        except ConnectionError:
            return
        head = (
            f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        )
        if status == HTTPStatus.METHOD_NOT_ALLOWED:
            head += "Allow: GET\r\n"
        with contextlib.suppress(ConnectionError, TimeoutError):
            writer.write(head.encode() + b"\r\n" + body)
            async with asyncio.timeout(self._timeout_s):
                await writer.drain()
            if status != HTTPStatus.OK:
                await _linger(reader, writer)

    async def _read_request(self, reader: asyncio.StreamReader) -> str:
        """The path of a well-formed GET whose head is within bounds; `_RefusedError` otherwise."""
        lines: list[bytes] = []
        head_bytes = 0
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                raise _RefusedError(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head too large"
                ) from None
            except asyncio.IncompleteReadError:
                raise _RefusedError(None, "closed before the end of its head") from None
            head_bytes += len(line)
            if head_bytes > self._head_bytes_max:
                raise _RefusedError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head too large")
            line = line.rstrip(b"\r\n")
            if not line:
                break
            lines.append(line)
            if len(lines) > self._headers_max + 1:
                raise _RefusedError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many headers")
        request = _REQUEST_LINE.fullmatch(lines[0]) if lines else None
        if request is None or not all(_HEADER.fullmatch(h) for h in lines[1:]):
            raise _RefusedError(HTTPStatus.BAD_REQUEST, "malformed request")
        if request[1] != b"GET":
            raise _RefusedError(HTTPStatus.METHOD_NOT_ALLOWED, "only GET is served")
        return request[2].decode("ascii").partition("?")[0]

    def _route(self, path: str) -> tuple[HTTPStatus, bytes, str]:
        if path == "/metrics":
            return HTTPStatus.OK, self._metrics.render(), "text/plain; version=0.0.4"
        if path == "/healthz":
            problems = self._health()
            if problems:
                return HTTPStatus.SERVICE_UNAVAILABLE, "\n".join(problems).encode(), "text/plain"
            return HTTPStatus.OK, b"ok\n", "text/plain"
        return HTTPStatus.NOT_FOUND, b"not found\n", "text/plain"


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After refusing a request not read to its end: half-close, then discard what the client
    still sends for up to `LINGER_S`. Closing with unread bytes would reset the connection,
    and a reset can destroy the refusal before the client reads it."""
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while await reader.read(LINGER_CHUNK_BYTES):
                pass


def _peer(writer: asyncio.StreamWriter) -> object:
    return writer.get_extra_info("peername")
