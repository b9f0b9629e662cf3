"""The client-facing TCP servers: one per listener, its connections admitted within limits.

One `Server` class serves both listeners of a node, the native protocol and Kafka's, each
with its own `Wire` (how bytes become requests and answers become bytes: cluster/native/wire.py's
`NativeWire`, cluster/kafka/wire.py's `KafkaWire`) and its own handler; every limit holds on
each, counted per listener. What one connection does (framing, answer order, in-flight and
byte bounds, deadlines, bad frames) is cluster/broker/connection.py's `ServerConnection`.

Connections: `connections_max` per node, and `connections_per_address_max` from one source
address (Kafka's `max.connections.per.ip`; addresses in one normal form, `normal_ip`). A
connection past either is closed at once, never counted. A connection from a peer node's host
(`PeerSources`: its PeerWatcher dials from there) takes one of `peer_connections_max` slots of
its own first, counted against neither, so clients that fill a node never cut its peers'
status polls off; with those slots full, it is a client like any other.

A refused or timed-out connection is counted by reason (`Server.stats`, on /metrics) and logged
at WARNING through a `RefusalLog`: one line per reason per `refusal_log_interval_ms`, with a
count, so a flood of connections cannot flood the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Generic

from cluster.broker.connection import (
    A,
    Q,
    Refusal,
    RequestHandler,
    Seat,
    ServerConnection,
    Wire,
)
from cluster.config import Limits, Timing
from cluster.peer_hosts import PeerSources
from cluster.refusals import RefusalLog

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """One listener's connections open now, and refused since start by reason (/metrics)."""

    listener: str
    clients: int
    peers: int
    refused: Mapping[Refusal, int]


class Server(Generic[Q, A]):
    def __init__(
        self,
        handler: RequestHandler[Q, A],
        host: str,
        port: int,
        limits: Limits,
        timing: Timing,
        *,
        wire: Wire[Q, A],
        peer_sources: PeerSources | None = None,
    ) -> None:
        self.handler = handler
        self.wire = wire
        self.peer_sources = peer_sources
        self.limits = limits
        self.idle_timeout_s = timing.client_idle_timeout_ms / 1000
        self.answer_timeout_s = timing.answer_timeout_ms / 1000
        self.write_timeout_s = timing.client_write_timeout_ms / 1000
        self.frame_read_timeout_s = timing.frame_read_timeout_ms / 1000
        self._host = host
        self._port = port
        self.connections = 0  # clients'; peers in their own slots are not counted here
        self.peer_connections = 0
        self._by_address: dict[str, int] = {}  # client connections by source; no zero entries
        self._refusal_interval_s = timing.refusal_log_interval_ms / 1000
        self._refusals = RefusalLog(log, self._refusal_interval_s, time.monotonic)
        self._refused = dict.fromkeys(Refusal, 0)
        # One log kind per reason, fixed for the server's life (RefusalLog's table stays small).
        name = wire.name
        self._refusal_kinds = {
            Refusal.CONNECTIONS_MAX: f"{name} connection refused: connections_max "
            f"({limits.connections_max}) reached",
            Refusal.PER_ADDRESS: f"{name} connection refused: connections_per_address_max "
            f"({limits.connections_per_address_max}) reached",
            Refusal.FRAME_READ_TIMEOUT: f"{name} connection closed: frame not read within "
            f"frame_read_timeout_ms ({timing.frame_read_timeout_ms})",
            Refusal.UNDECODABLE: f"{name} connection closed: a request that does not decode",
        }
        self.listening = asyncio.Event()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(partial(ServerConnection, self), self._host, self._port)
        try:
            async with server, asyncio.TaskGroup() as tasks:
                tasks.create_task(self._flush_refusals())
                self.listening.set()
                await server.serve_forever()
        finally:
            self._refusals.flush()  # the counts still folded: an operator sees every refusal

    async def _flush_refusals(self) -> None:
        while True:
            await asyncio.sleep(self._refusal_interval_s)
            self._refusals.flush_due()

    def stats(self) -> ConnectionStats:
        return ConnectionStats(
            self.wire.name, self.connections, self.peer_connections, dict(self._refused)
        )

    def admit(self, ip: str) -> Seat | None:
        """Seat a new connection from `ip` (normalised): in a peer slot if it may be a peer's
        and one is free, else as a client within both connection limits; None if refused."""
        limits = self.limits
        if (
            self.peer_connections < limits.peer_connections_max
            and self.peer_sources is not None
            and self.peer_sources.is_peer_ip(ip)
        ):
            self.peer_connections += 1
            return Seat.PEER
        if self.connections >= limits.connections_max:
            self.refuse(Refusal.CONNECTIONS_MAX, f"from {ip}")
            return None
        from_address = self._by_address.get(ip, 0)
        if from_address >= limits.connections_per_address_max:
            self.refuse(Refusal.PER_ADDRESS, f"from {ip}")
            return None
        self._by_address[ip] = from_address + 1
        self.connections += 1
        return Seat.CLIENT

    def release(self, ip: str, seat: Seat) -> None:
        """Give back the slot `admit` gave a connection from `ip`."""
        if seat is Seat.PEER:
            self.peer_connections -= 1
            return
        self.connections -= 1
        left = self._by_address[ip] - 1
        if left:
            self._by_address[ip] = left
        else:
            del self._by_address[ip]

    def refuse(self, reason: Refusal, detail: str) -> None:
        """Count a refusal and log it (rate-limited, at WARNING)."""
        self._refused[reason] += 1
        self._refusals.warn(self._refusal_kinds[reason], detail)
