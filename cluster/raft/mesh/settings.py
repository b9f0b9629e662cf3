"""What the mesh is given: its settings, the poller that watches its sockets, each group's
endpoint, and where each peer connects from.

Role: the types a caller of the mesh names, kept apart from the sockets: a node builds
`MeshSettings` from its config (cluster/broker/node.py), with its `PeerHosts` as the
`PeerSources`; the driver (cluster/raft/driver.py) gives the mesh a `Poller` on its event
loop; each group plugs in an `Endpoint` (cluster/raft/adapter/transport.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cluster.peer_hosts import PeerSources

READ, WRITE, ERROR = 1, 2, 4  # the poller's event bits


class Poller(Protocol):
    def subscribe(self, descr: int, callback: Callable[[int, int], None], mask: int) -> None: ...

    def unsubscribe(self, descr: int) -> None: ...


class Endpoint(Protocol):
    """One Raft group's side of the mesh."""

    def peer_connected(self, address: str) -> None: ...

    def peer_disconnected(self, address: str) -> None: ...

    def deliver(self, address: str, message: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class MeshSettings:
    self_address: str
    peer_addresses: frozenset[str]
    secret: str | None
    frame_bytes_max: int
    queue_bytes_max: int
    timeout_s: float
    retry_s: float
    ping_s: float
    # Where each peer may connect from; None trusts a peer's claimed identity from anywhere
    # (unit tests of the mesh alone).
    sources: PeerSources | None = None
    # Accepted links not yet open: in all, and from one source address; a connection past
    # either is closed unread. The defaults are cluster/config.py's.
    handshakes_max: int = 64
    handshakes_per_address_max: int = 8
    # From a link's accept (or dial) until it is open, whatever arrives meanwhile.
    handshake_timeout_s: float = 1.25
    # Refusals of one kind are logged at most once per this (with a count).
    refusal_log_interval_s: float = 10.0
    # Read this much from one link per poller event, then let the other links and groups run.
    recv_bytes_per_event: int = 4 * 1024 * 1024
