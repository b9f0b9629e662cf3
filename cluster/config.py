"""Node configuration: validated, frozen dataclasses with units last in every name.

`Limits` bounds every queue, frame and size a node accepts; `Timing` holds every interval;
`NodeConfig` says who a node is and who its peers are. Nothing here reads files: `cli/` parses
TOML and hands the mapping to `NodeConfig.from_mapping`, which reports every problem as a
`ConfigError` naming the setting.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Self, TypeVar

from cluster.addresses import PORT_MAX, join_address
from statemachine.fields import check_positive_ints
from statemachine.limits import KIB, MIB

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that is missing, of the wrong type or out of range; the message names it."""


@dataclass(frozen=True, slots=True)
class Limits:
    """A bound on everything a node accepts (TigerBeetle's rule)."""

    frame_bytes_max: int = 8 * MIB
    fetch_bytes_max: int = 4 * MIB
    connections_max: int = 1_024
    in_flight_requests_per_connection_max: int = 128
    pending_proposals_max: int = 10_000
    partitions_per_request_max: int = 1_024
    segment_bytes_max: int = 64 * MIB
    # Raft entries a group keeps before compacting its log (pysyncobj holds them in memory).
    raft_log_entries_max: int = 2_000
    index_interval_bytes: int = 4 * KIB
    # A Raft message between nodes carries entries up to half of this, and one more entry.
    raft_frame_bytes_max: int = 32 * MIB
    # Bytes queued to one peer before its link is dropped as not reading (Raft resends).
    raft_queue_bytes_max: int = 256 * MIB
    # The HTTP port (/metrics, /healthz): a request's line and headers together, their count,
    # and the connections open at once. A scraper needs a fraction of each.
    http_head_bytes_max: int = 16 * KIB
    http_headers_max: int = 64
    http_connections_max: int = 64

    def __post_init__(self) -> None:
        check_positive_ints(self, ConfigError)
        if self.raft_frame_bytes_max < 2 * self.frame_bytes_max + 64 * KIB:
            raise ConfigError("Limits.raft_frame_bytes_max must exceed twice frame_bytes_max")
        if self.raft_queue_bytes_max < self.raft_frame_bytes_max:
            raise ConfigError("Limits.raft_queue_bytes_max must hold a whole raft frame")
        if self.fetch_bytes_max > self.frame_bytes_max - 64 * KIB:
            raise ConfigError("Limits.fetch_bytes_max must leave 64 KiB of frame_bytes_max free")
        if self.http_head_bytes_max < KIB:
            raise ConfigError("Limits.http_head_bytes_max must be at least 1 KiB")


@dataclass(frozen=True, slots=True)
class Timing:
    """Every interval a node uses; Raft's are chosen for fast failover on a LAN."""

    heartbeat_ms: int = 100
    election_timeout_ms_min: int = 500
    election_timeout_ms_max: int = 1_000
    leader_fallback_ms: int = 2_000
    connection_timeout_ms: int = 2_500
    connection_retry_ms: int = 300
    expiry_tick_interval_ms: int = 1_000
    retention_check_interval_ms: int = 30_000
    request_timeout_ms: int = 10_000
    client_idle_timeout_ms: int = 300_000
    # From an HTTP connection's accept to the end of its request's headers, then again to
    # write the answer: a client that drips bytes is closed at this deadline, not by idleness.
    http_request_timeout_ms: int = 5_000
    producer_id_expiration_ms: int = 86_400_000
    transactional_id_expiration_ms: int = 604_800_000
    pid_block_size: int = 1_000

    def __post_init__(self) -> None:
        check_positive_ints(self, ConfigError)
        if self.election_timeout_ms_min <= 3 * self.heartbeat_ms:
            raise ConfigError("Timing.election_timeout_ms_min must exceed 3 heartbeats")
        if self.election_timeout_ms_max <= self.election_timeout_ms_min:
            raise ConfigError("Timing.election_timeout_ms_max must exceed the minimum")
        if self.connection_timeout_ms < self.election_timeout_ms_max:
            raise ConfigError("Timing.connection_timeout_ms must be >= election_timeout_ms_max")
        if self.leader_fallback_ms <= self.heartbeat_ms:
            raise ConfigError("Timing.leader_fallback_ms must exceed heartbeat_ms")


@dataclass(frozen=True, slots=True)
class Peer:
    """A node of the cluster as the others reach it."""

    node_id: int
    host: str
    client_port: int
    raft_port: int

    @property
    def client_address(self) -> str:
        return join_address(self.host, self.client_port)

    @property
    def raft_address(self) -> str:
        return join_address(self.host, self.raft_port)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Who this node is, where it keeps data, and the cluster it belongs to."""

    node_id: int
    host: str
    client_port: int
    raft_port: int
    http_port: int
    data_dir: Path
    peers: tuple[Peer, ...]
    cluster_id: str = "raftbroker"
    cluster_secret: str | None = None
    fsync: bool = False
    # A deliberate fault, for the chaos suite's negative control only: apply appends a retried
    # batch again instead of returning its original offsets.
    unsafe_disable_deduplication: bool = False
    limits: Limits = field(default_factory=Limits)
    timing: Timing = field(default_factory=Timing)

    def __post_init__(self) -> None:
        for name in ("client_port", "raft_port", "http_port"):
            port = getattr(self, name)
            if type(port) is not int or not 1 <= port <= PORT_MAX:
                raise ConfigError(f"{name} must be a port number (1-{PORT_MAX}), not {port!r}")
        ids = [p.node_id for p in self.peers]
        if len(set(ids)) != len(ids):
            raise ConfigError("peers: node ids must be unique")
        if self.node_id not in ids:
            raise ConfigError(f"peers must include this node ({self.node_id})")
        if self.cluster_secret is None and not _is_loopback(self.host):
            raise ConfigError(
                f"host {self.host} is not a loopback address: set cluster_secret, which "
                "authenticates and encrypts Raft links (whoever can send Raft messages can "
                "rewrite the log)"
            )
        for flag in ("fsync", "unsafe_disable_deduplication"):
            if type(getattr(self, flag)) is not bool:
                raise ConfigError(f"{flag} must be true or false")
        if self.cluster_secret is not None and len(self.cluster_secret) < 16:
            raise ConfigError("cluster_secret must have at least 16 characters")

    @property
    def self_peer(self) -> Peer:
        return next(p for p in self.peers if p.node_id == self.node_id)

    @property
    def client_address(self) -> str:
        return join_address(self.host, self.client_port)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Self:
        """Build from parsed TOML; unknown keys and wrong types are errors."""
        data = dict(raw)
        try:
            limits = _section(Limits, data.pop("limits", {}))
            timing = _section(Timing, data.pop("timing", {}))
            peers = tuple(_section(Peer, p) for p in data.pop("peers", []))
            data_dir = Path(_require(data, "data_dir", str))
            known = {f.name for f in fields(cls)} - {"limits", "timing", "peers", "data_dir"}
            unknown = set(data) - known
            if unknown:
                raise ConfigError(f"unknown settings: {sorted(unknown)}")
            return cls(data_dir=data_dir, peers=peers, limits=limits, timing=timing, **data)
        except TypeError as exc:
            raise ConfigError(str(exc)) from exc


def _require(data: dict[str, Any], key: str, kind: type) -> Any:
    if key not in data:
        raise ConfigError(f"missing setting: {key}")
    value = data.pop(key)
    if not isinstance(value, kind):
        raise ConfigError(f"{key} must be a {kind.__name__}")
    return value


def _section(cls: type[T], raw: object) -> T:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[{cls.__name__.lower()}] must be a table")
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(raw) - names
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} settings: {sorted(unknown)}")
    return cls(**raw)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
