"""Which source addresses each peer node connects from: its configured host, resolved.

Role: the listeners tell peers from strangers by where a connection comes from. A node dials
its peers (Raft links, and the PeerWatcher's status polls) from its own configured host, so a
peer's connections come from the addresses its `host` resolves to. The Raft port accepts a
node's identity only from its addresses (a peer that knows the secret cannot pose as another
node from elsewhere), and the client port keeps slots for peers apart from clients.

Rules: a literal IP is known from the start, without DNS. A host name is resolved off the event
loop (`loop.getaddrinfo`), with a timeout, every `Timing.peer_resolve_interval_ms`, and again
sooner while it does not resolve (a container that is not up yet): until it first resolves, no
connection can be that peer's, which only delays its links. Every address is kept in one
normal form (`normal_ip`), so `::ffff:10.0.0.2` from a dual-stack socket matches `10.0.0.2`.
Lookups are reads of immutable snapshots: a refresh replaces them whole.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Protocol

from cluster.config import Peer

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 5.0
UNRESOLVED_RETRY_S = 1.0

# A host name to its addresses (empty when it does not resolve); `resolve_host` in a node.
Resolve = Callable[[str], Awaitable[frozenset[str]]]


def normal_ip(text: str) -> str | None:
    """`text` as one canonical IP string, or None when it is not an IP (a host name). An
    IPv4-mapped IPv6 address is its IPv4 address; IPv6 scope ids are dropped."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class PeerSources(Protocol):
    """Where each peer connects from: what the Raft mesh binds a peer's identity to and the
    client ports seat in their peers' slots (`PeerHosts` below, in a node)."""

    def ips_of(self, raft_address: str) -> frozenset[str]: ...

    def is_peer_ip(self, ip: str) -> bool: ...


class PeerHosts:
    """The source addresses of every other node, by Raft address, kept fresh."""

    def __init__(
        self, peers: Iterable[Peer], refresh_s: float, resolve: Resolve | None = None
    ) -> None:
        self._peers = tuple(peers)
        self._refresh_s = refresh_s
        self._resolve = resolve_host if resolve is None else resolve
        self._by_raft_address: Mapping[str, frozenset[str]] = MappingProxyType({})
        self._all: frozenset[str] = frozenset()
        self._publish({p.raft_address: _literal(p.host) for p in self._peers})

    def ips_of(self, raft_address: str) -> frozenset[str]:
        """The addresses the node with this Raft address connects from (empty if unknown)."""
        return self._by_raft_address.get(raft_address, frozenset())

    def is_peer_ip(self, ip: str) -> bool:
        """Whether a connection from `ip` may be one of the peers'."""
        normal = normal_ip(ip)
        return normal is not None and normal in self._all

    @property
    def unresolved(self) -> list[str]:
        """Hosts with no address yet."""
        return [p.host for p in self._peers if not self._by_raft_address.get(p.raft_address)]

    async def run(self) -> None:
        """Resolve host names for ever (returns at once when every host is an IP)."""
        if all(normal_ip(p.host) is not None for p in self._peers):
            return
        while True:
            await self.refresh()
            await asyncio.sleep(UNRESOLVED_RETRY_S if self.unresolved else self._refresh_s)

    async def refresh(self) -> None:
        """Resolve every host name once; a host that fails keeps the addresses it had."""
        found = dict(self._by_raft_address)
        for peer in self._peers:
            if normal_ip(peer.host) is not None:
                continue
            ips = await self._resolve(peer.host)
            if ips:
                found[peer.raft_address] = ips
        self._publish(found)

    def _publish(self, by_raft_address: Mapping[str, frozenset[str]]) -> None:
        self._by_raft_address = MappingProxyType(dict(by_raft_address))
        self._all = frozenset(ip for ips in by_raft_address.values() for ip in ips)


def _literal(host: str) -> frozenset[str]:
    normal = normal_ip(host)
    return frozenset() if normal is None else frozenset({normal})


async def resolve_host(host: str) -> frozenset[str]:
    """The addresses `host` resolves to, in normal form; empty when it does not (logged)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        log.debug("cannot resolve peer host %s: %s", host, exc)
        return frozenset()
    return frozenset(ip for info in infos if (ip := normal_ip(str(info[4][0]))) is not None)
