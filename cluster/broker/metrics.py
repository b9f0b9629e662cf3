"""Metrics (prometheus-client, one registry per node, no globals) and the HTTP endpoint.

`/metrics` serves the Prometheus text format; `/healthz` answers 200 when the node knows a
metadata leader and every Raft group it hosts is healthy, 503 otherwise (with the reasons).
Raft progress is collected at scrape time from the groups, so an idle node does no work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cluster.raft import GroupStatus

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
HTTP_TIMEOUT_S = 5.0


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

    def watch_groups(self, statuses: Callable[[], list[GroupStatus]]) -> None:
        self.registry.register(_RaftCollector(statuses))

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
        for s in self._statuses():
            commit.add_metric([s.name], s.commit_index)
            applied.add_metric([s.name], s.last_applied)
            term.add_metric([s.name], s.term)
            leader.add_metric([s.name], int(s.is_leader))
            healthy.add_metric([s.name], int(s.healthy))
        yield from (commit, applied, term, leader, healthy)


class HttpEndpoint:
    """GET /metrics and GET /healthz; anything else is 404. One request per connection."""

    def __init__(
        self, metrics: Metrics, health: Callable[[], list[str]], host: str, port: int
    ) -> None:
        self._metrics = metrics
        self._health = health
        self._host = host
        self._port = port

    async def serve(self) -> None:
        server = await asyncio.start_server(self._respond, self._host, self._port)
        async with server:
            await server.serve_forever()

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), HTTP_TIMEOUT_S)
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 and parts[0] == "GET" else ""
            status, body, kind = self._route(path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await asyncio.wait_for(writer.drain(), HTTP_TIMEOUT_S)
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), HTTP_TIMEOUT_S)

    def _route(self, path: str) -> tuple[str, bytes, str]:
        if path == "/metrics":
            return "200 OK", self._metrics.render(), "text/plain; version=0.0.4"
        if path == "/healthz":
            problems = self._health()
            if problems:
                return "503 Service Unavailable", "\n".join(problems).encode(), "text/plain"
            return "200 OK", b"ok\n", "text/plain"
        return "404 Not Found", b"not found\n", "text/plain"
