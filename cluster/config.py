"""Node configuration: validated, frozen dataclasses with units last in every name.

`Limits` bounds every queue, frame and size a node accepts; `Timing` holds every interval;
`NodeConfig` says who a node is and who its peers are. Nothing here reads files: `cli/` parses
TOML and hands the mapping to `NodeConfig.from_mapping`, which reports every problem as a
`ConfigError` naming the setting.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Self, TypeVar

from cluster.addresses import PORT_MAX, join_address, parse_address
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
    # Client connections: in all, and from one source address (Kafka's max.connections.per.ip),
    # so that one host cannot take a node's every slot. Connections from peer nodes' hosts (their
    # PeerWatchers) take `peer_connections_max` slots of their own first: clients filling the
    # node never cut its peers off.
    connections_max: int = 1_024
    connections_per_address_max: int = 128
    peer_connections_max: int = 16
    in_flight_requests_per_connection_max: int = 128
    # Answer bytes one connection may hold (known, or reserved for Fetches under way) before
    # its requests are no longer read: a client that pipelines requests and never reads the
    # answers costs the node about this, one answer more and a socket buffer, at most.
    answer_bytes_per_connection_max: int = 16 * MIB
    pending_proposals_max: int = 10_000
    partitions_per_request_max: int = 1_024
    segment_bytes_max: int = 64 * MIB
    # Raft entries a group keeps before compacting its log (pysyncobj holds them in memory),
    # and the bytes of them: at 1 MB batches 2,000 entries would be 2 GB of memory, and a log
    # that only grows takes fresh pages from the kernel for every batch (a page fault every
    # 4 KiB: a quarter of a node's time under load, bench/HISTORY.md, tenth session).
    raft_log_entries_max: int = 2_000
    raft_log_bytes_max: int = 32 * MIB
    index_interval_bytes: int = 4 * KIB
    # A Raft message between nodes carries entries up to half of this, and one more entry.
    raft_frame_bytes_max: int = 32 * MIB
    # Bytes queued to one peer before its link is dropped as not reading (Raft resends).
    raft_queue_bytes_max: int = 256 * MIB
    # Raft-port links that have not authenticated yet: in all, and from one source address. A
    # peer needs one at a time; a stranger's are refused past these, never queued.
    raft_handshakes_max: int = 64
    raft_handshakes_per_address_max: int = 8
    # The HTTP port (/metrics, /healthz): a request's line and headers together, their count,
    # and the connections open at once, in all and from one source address (so that one host
    # cannot keep every monitor out). A scraper needs a fraction of each.
    http_head_bytes_max: int = 16 * KIB
    http_headers_max: int = 64
    http_connections_max: int = 64
    http_connections_per_address_max: int = 8
    # Consumer groups: the members of one group (Kafka's group.max.size), and the partitions of
    # the offsets topic, which groups hash over (read when the first group creates the topic).
    group_members_max: int = 1_000
    offsets_topic_partitions: int = 8
    # Transactions: the partitions of the transaction state topic, which transactional ids hash
    # over (read when its first FindCoordinator creates it; each is a Raft group).
    txn_state_topic_partitions: int = 4

    def __post_init__(self) -> None:
        check_positive_ints(self, ConfigError)
        if self.raft_frame_bytes_max < 2 * self.frame_bytes_max + 64 * KIB:
            raise ConfigError("Limits.raft_frame_bytes_max must exceed twice frame_bytes_max")
        if self.raft_queue_bytes_max < self.raft_frame_bytes_max:
            raise ConfigError("Limits.raft_queue_bytes_max must hold a whole raft frame")
        if self.fetch_bytes_max > self.frame_bytes_max - 64 * KIB:
            raise ConfigError("Limits.fetch_bytes_max must leave 64 KiB of frame_bytes_max free")
        if self.answer_bytes_per_connection_max < self.fetch_bytes_max:
            raise ConfigError(
                "Limits.answer_bytes_per_connection_max must hold a whole fetch_bytes_max answer"
            )
        if self.connections_per_address_max > self.connections_max:
            raise ConfigError("Limits.connections_per_address_max must not exceed connections_max")
        if self.raft_handshakes_per_address_max > self.raft_handshakes_max:
            raise ConfigError(
                "Limits.raft_handshakes_per_address_max must not exceed raft_handshakes_max"
            )
        if self.http_connections_per_address_max > self.http_connections_max:
            raise ConfigError(
                "Limits.http_connections_per_address_max must not exceed http_connections_max"
            )
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
    # A request not answered by then is answered REQUEST_TIMED_OUT (a backstop: every handler
    # answers within request_timeout_ms, so only a bug could hold a connection's answers).
    answer_timeout_ms: int = 30_000
    client_idle_timeout_ms: int = 300_000
    # A client that stops reading its answers (the socket's buffer full) has this long to read
    # again before its connection is dropped; meanwhile none of its requests is read.
    client_write_timeout_ms: int = 30_000
    # Once a client frame's first byte arrives, its last must arrive within this (a client that
    # drips a frame is closed here, whatever the idle timeout says).
    frame_read_timeout_ms: int = 30_000
    # From a Raft-port connection's accept (or dial) until it is authenticated: an absolute
    # deadline, not reset by the bytes that arrive meanwhile.
    raft_handshake_timeout_ms: int = 1_250
    # Refused peers, strangers and connections past a limit are logged at WARNING, at most one
    # line per kind of refusal per this interval (the line counts the ones it stands for).
    refusal_log_interval_ms: int = 10_000
    # A peer's host name is resolved again this often (a restarted container may change address).
    peer_resolve_interval_ms: int = 5_000
    # From an HTTP connection's accept to the end of its request's headers, then again to
    # write the answer: a client that drips bytes is closed at this deadline, not by idleness.
    http_request_timeout_ms: int = 5_000
    producer_id_expiration_ms: int = 86_400_000
    transactional_id_expiration_ms: int = 604_800_000
    pid_block_size: int = 1_000
    # Consumer groups, as Kafka's settings of the same names (group.*, offsets.*): a new
    # group waits this long for more members before its first rebalance; the session timeouts
    # a member may ask for; how long offsets outlive their group's last member, and how often
    # coordinators look for them.
    group_initial_rebalance_delay_ms: int = 3_000
    group_session_timeout_ms_min: int = 6_000
    group_session_timeout_ms_max: int = 1_800_000
    offsets_retention_ms: int = 604_800_000
    offsets_retention_check_interval_ms: int = 600_000
    # Each entry the transaction coordinator writes for a request (InitProducerId, a
    # transaction's partitions and their registrations, EndTxn) is awaited this long at most,
    # then answered COORDINATOR_NOT_AVAILABLE, which clients retry (librdkafka and Kafka's Java
    # client bound these calls by transaction.timeout.ms: a short wait and a retry keep them
    # within it while a partition's leader moves). request_timeout_ms bounds it too.
    txn_write_timeout_ms: int = 3_000

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
        if self.raft_handshake_timeout_ms >= self.connection_timeout_ms:
            raise ConfigError(
                "Timing.raft_handshake_timeout_ms must be under connection_timeout_ms"
            )
        if self.answer_timeout_ms <= self.request_timeout_ms:
            raise ConfigError("Timing.answer_timeout_ms must exceed request_timeout_ms")
        if self.group_session_timeout_ms_min > self.group_session_timeout_ms_max:
            raise ConfigError(
                "Timing.group_session_timeout_ms_min must not exceed group_session_timeout_ms_max"
            )


@dataclass(frozen=True, slots=True)
class Topics:
    """What a topic gets when a client does not say (Kafka's `auto.create.topics.enable`,
    `num.partitions` and `default.replication.factor`). Set them alike on every node: the node a
    client asks decides. `auto_create`: a Kafka Metadata request that allows it creates the
    topics it names that do not exist (off by default, as Redpanda's; `raftbroker cluster up`
    and the demo turn it on)."""

    auto_create: bool = False
    default_partitions: int = 1
    default_replication_factor: int = 3

    def __post_init__(self) -> None:
        if type(self.auto_create) is not bool:
            raise ConfigError("Topics.auto_create must be true or false")
        for name in ("default_partitions", "default_replication_factor"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"Topics.{name} must be a positive integer, not {value!r}")


@dataclass(frozen=True, slots=True)
class Peer:
    """A node of the cluster as the others reach it (`kafka_port`: its Kafka listener, which
    Kafka clients learn from Metadata; None when it has none). `kafka_external_address`: what
    Metadata names this node as on the external Kafka listener (Kafka's advertised listener for
    clients outside the nodes' network, such as a container host's published port)."""

    node_id: int
    host: str
    client_port: int
    raft_port: int
    kafka_port: int | None = None
    kafka_external_address: str | None = None

    @property
    def client_address(self) -> str:
        return join_address(self.host, self.client_port)

    @property
    def kafka_address(self) -> str | None:
        return None if self.kafka_port is None else join_address(self.host, self.kafka_port)

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
    # Kafka's wire protocol on its own port (cluster/kafka/); None: no Kafka listener. When
    # set, every peer names its own, so Metadata can send Kafka clients to any node.
    kafka_port: int | None = None
    # A second Kafka listener for clients outside the nodes' network (a container host's):
    # Metadata there names each node by its peer entry's `kafka_external_address`.
    kafka_external_port: int | None = None
    cluster_id: str = "raftbroker"
    cluster_secret: str | None = None
    # Journals (and the term and vote) fsynced before an entry is acknowledged: a power cut of
    # every node at once (all the containers of one host, say) loses nothing acknowledged.
    fsync: bool = True
    # A deliberate fault, for the chaos suite's negative control only: apply appends a retried
    # batch again instead of returning its original offsets.
    unsafe_disable_deduplication: bool = False
    # A deliberate fault, for the chaos suite's negative control of transactions only: Fetch
    # serves read_committed readers as read_uncommitted ones (no last stable offset, no
    # aborted transactions), so they read aborted and open transactions' records.
    unsafe_ignore_isolation: bool = False
    # A test-only instrument, for the chaos suite's power-loss fault (cluster/chaos/power.py):
    # every fsync the node makes is recorded beside its data directory. Never in production.
    unsafe_record_syncs: bool = False
    limits: Limits = field(default_factory=Limits)
    timing: Timing = field(default_factory=Timing)
    topics: Topics = field(default_factory=Topics)

    def __post_init__(self) -> None:
        ports = ("client_port", "raft_port", "http_port", "kafka_port", "kafka_external_port")
        for name in ports:
            port = getattr(self, name)
            if name.startswith("kafka") and port is None:
                continue
            if type(port) is not int or not 1 <= port <= PORT_MAX:
                raise ConfigError(f"{name} must be a port number (1-{PORT_MAX}), not {port!r}")
        used = [getattr(self, name) for name in ports if getattr(self, name) is not None]
        if len(set(used)) != len(used):
            raise ConfigError(f"{', '.join(ports)} must differ from one another")
        self._check_kafka_peers()
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
        flags = (
            "fsync",
            "unsafe_disable_deduplication",
            "unsafe_ignore_isolation",
            "unsafe_record_syncs",
        )
        for flag in flags:
            if type(getattr(self, flag)) is not bool:
                raise ConfigError(f"{flag} must be true or false")
        if self.cluster_secret is not None:
            check_cluster_secret(self.cluster_secret)

    def _check_kafka_peers(self) -> None:
        for peer in self.peers:
            address = peer.kafka_external_address
            if address is not None:
                try:
                    parse_address(address)
                except ValueError as exc:
                    where = f"peers: node {peer.node_id}'s kafka_external_address"
                    raise ConfigError(f"{where}: {exc}") from None
            elif self.kafka_external_port is not None:  # else clients outside are sent nowhere
                raise ConfigError(
                    f"peers: node {peer.node_id} has no kafka_external_address (with "
                    "kafka_external_port set, every peer names the HOST:PORT clients outside "
                    "reach it at)"
                )
        for peer in self.peers:
            port = peer.kafka_port
            if port is not None and (type(port) is not int or not 1 <= port <= PORT_MAX):
                raise ConfigError(f"peers: node {peer.node_id}'s kafka_port must be a port number")
            if self.kafka_port is None:
                continue
            if port is None:
                raise ConfigError(
                    f"peers: node {peer.node_id} has no kafka_port (with kafka_port set, every "
                    "peer names its own: Kafka clients are sent to any node)"
                )
            if peer.node_id == self.node_id and port != self.kafka_port:
                raise ConfigError(f"peers: this node's kafka_port is {self.kafka_port}, not {port}")

    @property
    def self_peer(self) -> Peer:
        return next(p for p in self.peers if p.node_id == self.node_id)

    @property
    def kafka_address(self) -> str | None:
        return None if self.kafka_port is None else join_address(self.host, self.kafka_port)

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
            topics = _section(Topics, data.pop("topics", {}))
            peers = tuple(_section(Peer, p) for p in data.pop("peers", []))
            data_dir = Path(_require(data, "data_dir", str))
            sections = {"limits", "timing", "topics", "peers", "data_dir"}
            known = {f.name for f in fields(cls)} - sections
            unknown = set(data) - known
            if unknown:
                raise ConfigError(f"unknown settings: {sorted(unknown)}")
            return cls(
                data_dir=data_dir, peers=peers, limits=limits, timing=timing, topics=topics, **data
            )
        except TypeError as exc:
            raise ConfigError(str(exc)) from exc


# -- the cluster secret -------------------------------------------------------------------------

SECRET_CHARS_MIN = 16
SECRET_DISTINCT_CHARS_MIN = 8
SECRET_BITS_MIN = 64
MAKE_A_SECRET = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
# Words that mark a placeholder someone forgot to replace; they count for nothing.
_PLACEHOLDER = re.compile(
    r"change[-_ .]?me|replace[-_ .]?me|secret|passw(?:or)?d|placeholder|example|default"
    r"|raftbroker|cluster|xxx+",
    re.IGNORECASE,
)


def check_cluster_secret(secret: object) -> None:
    """ConfigError, in one line saying how to make a good one, unless `secret` looks random.

    Refused: fewer than 16 characters or 8 distinct ones; a known placeholder (compose's old
    `change-me-0123456789abcdef`); anything whose estimated entropy (`secret_bits`), once
    placeholder words are taken out, is under 64 bits.
    """
    if not isinstance(secret, str):
        raise ConfigError("cluster_secret must be a string")
    if len(secret) < SECRET_CHARS_MIN:
        reason = f"must have at least {SECRET_CHARS_MIN} characters"
    elif len(set(secret)) < SECRET_DISTINCT_CHARS_MIN:
        reason = f"has fewer than {SECRET_DISTINCT_CHARS_MIN} distinct characters"
    elif (bits := secret_bits(_PLACEHOLDER.sub("", secret))) >= SECRET_BITS_MIN:
        return
    elif placeholder := _PLACEHOLDER.search(secret):
        reason = f"is a placeholder ({placeholder[0]!r}, ~{bits:.0f} bits)"
    else:
        reason = f"is guessable (~{bits:.0f} bits, {SECRET_BITS_MIN} needed)"
    raise ConfigError(f"cluster_secret {reason}: make one with {MAKE_A_SECRET}")


def secret_bits(text: str) -> float:
    """A deliberately low estimate of the entropy of `text`, in bits.

    Only one period of a repeated pattern counts. Each character is worth log2 of the
    alphabet its classes span (lower case 26, upper case 26, digits 10, anything else 33),
    except one that repeats its predecessor or steps from it by one (`aaaa`, `1234`, `fedc`),
    worth 1 bit.
    """
    text = text[: _period(text)]
    alphabet = sum(
        size
        for size, present in (
            (26, any(c.islower() for c in text)),
            (26, any(c.isupper() for c in text)),
            (10, any(c.isdigit() for c in text)),
            (33, any(not c.isalnum() for c in text)),
        )
        if present
    )
    if alphabet == 0:
        return 0.0
    full = math.log2(alphabet)
    return sum(
        1.0 if i and abs(ord(c) - ord(text[i - 1])) <= 1 else full for i, c in enumerate(text)
    )


def _period(text: str) -> int:
    """The length of the shortest prefix whose repetition gives `text` (len(text) if none)."""
    for size in range(1, len(text) // 2 + 1):
        if all(text[i] == text[i % size] for i in range(size, len(text))):
            return size
    return len(text)


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
