"""A broker process: the metadata group, this node's partition groups, and their lifecycle.

`Node` owns the Raft driver, the metadata replica (every configured node is a voter), one
`PartitionHandle` per partition whose replica set includes this node, and one `OffsetsHandle` per
partition of the internal offsets topic it holds (consumer groups: `groups.py`). The set of running
partition groups follows the metadata state: `reconcile()` starts the groups of new topics and stops
those of deleted ones, at runtime, without a restart; a group that cannot start (an unwritable
directory) is logged in one line, shown unhealthy, and retried ever less often. Where each group
keeps its files is `layout.py`'s. What each request is answered with lives in `frontend.py` (the
server in `server.py` only frames and orders), periodic duties in `duties.py`; both reach the node
through this class.

Every group of a node, the metadata group included, talks to its peers over the node's one Raft port
(`cluster/raft/mesh/`): a replica's Raft address is its node's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cluster.broker import layout
from cluster.broker.replica import (
    Fatal,
    MetadataReplica,
    OffsetsReplica,
    PartitionReplica,
    TxnStateReplica,
)
from cluster.broker.storage import PartitionStore
from cluster.config import NodeConfig, Peer
from cluster.raft import GroupSpec, GroupStatus, RaftDriver, RaftGroup
from cluster.raft.mesh import MeshSettings, PeerSources
from statemachine.limits import DEFAULT_LIMITS
from statemachine.metadata import (
    MetadataResult,
    TopicAltered,
    TopicCreated,
    TopicDeleted,
    TopicInfo,
)
from statemachine.partition import Appended, PartitionResult
from statemachine.pid_allocator import PidBlockLease

log = logging.getLogger(__name__)
METADATA_GROUP = "__metadata"
# The internal topic whose partitions hold consumer groups (Kafka's name): created by the
# metadata group on the first need of a group coordinator, never by a client.
OFFSETS_TOPIC = "__consumer_offsets"
# The internal topic whose partitions hold the transaction coordinator's state (Kafka's name):
# created by the metadata group on the first FindCoordinator for a transactional id.
TXN_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_STATE_TOPIC})


def client_topics(topics: dict[str, TopicInfo]) -> dict[str, TopicInfo]:
    """The topics clients see: every one but the internal ones, which no client lists,
    produces to, reads or deletes (their partitions are not record logs)."""
    return {name: info for name, info in topics.items() if name not in INTERNAL_TOPICS}


RECONCILE_INTERVAL_S = 1.0
# A partition group that failed to start is tried again after this, doubled after each failure
# up to the maximum: a lasting fault (an unwritable disk) costs a line a few minutes, not a
# traceback every few seconds.
START_RETRY_S = 5.0
START_RETRY_MAX_S = 300.0
START_ERROR_CHARS_MAX = 500  # of a failure's text in status details (ClusterStatus, /healthz)

PartitionKey = tuple[str, int]


def mesh_settings(config: NodeConfig, sources: PeerSources | None = None) -> MeshSettings:
    """The node's Raft links: its own address, every other node's, and their bounds."""
    timing = config.timing
    return MeshSettings(
        self_address=config.self_peer.raft_address,
        peer_addresses=frozenset(
            p.raft_address for p in config.peers if p.node_id != config.node_id
        ),
        secret=config.cluster_secret,
        frame_bytes_max=config.limits.raft_frame_bytes_max,
        queue_bytes_max=config.limits.raft_queue_bytes_max,
        timeout_s=timing.connection_timeout_ms / 1000,
        retry_s=timing.connection_retry_ms / 1000,
        ping_s=timing.heartbeat_ms / 1000,
        sources=sources,
        handshakes_max=config.limits.raft_handshakes_max,
        handshakes_per_address_max=config.limits.raft_handshakes_per_address_max,
        handshake_timeout_s=timing.raft_handshake_timeout_ms / 1000,
        refusal_log_interval_s=timing.refusal_log_interval_ms / 1000,
    )


@dataclass(frozen=True, slots=True)
class StartFailure:
    """A partition group this node should run and could not start: reported, retried."""

    topic: TopicInfo
    error: str
    attempts: int
    retry_at: float


@dataclass(slots=True)
class PartitionHandle:
    """One partition replica hosted here: its group, its replica, and its long-poll waiters."""

    topic: TopicInfo
    partition: int
    group: RaftGroup
    replica: PartitionReplica
    peers_by_raft_address: dict[str, Peer]
    new_data: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0

    @property
    def key(self) -> PartitionKey:
        return (self.topic.name, self.partition)

    def leader_peer(self) -> Peer | None:
        address = self.group.leader_address
        return None if address is None else self.peers_by_raft_address.get(address)

    async def wait_for_data(self, timeout_s: float) -> None:
        """Until a batch is appended here, or `timeout_s` passes."""
        event = self.new_data
        self.waiters += 1
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            self.waiters -= 1

    def data_arrived(self) -> None:
        """On the event loop: wake every long-poll of this partition."""
        self.new_data.set()
        self.new_data = asyncio.Event()


@dataclass
class OffsetsHandle:
    """One offsets partition replica hosted here (consumer groups: cluster/broker/groups.py)."""

    topic: TopicInfo
    partition: int
    group: RaftGroup
    replica: OffsetsReplica


@dataclass
class TxnStateHandle:
    """One transaction state partition replica hosted here (cluster/broker/txns.py)."""

    topic: TopicInfo
    partition: int
    group: RaftGroup
    replica: TxnStateReplica


InternalHandle = OffsetsHandle | TxnStateHandle


class Node:
    """Everything one broker process runs, except its sockets."""

    def __init__(
        self, config: NodeConfig, fatal: Fatal, peer_hosts: PeerSources | None = None
    ) -> None:
        self.config = config
        self.fatal = fatal
        self.peer_hosts = peer_hosts  # where peers connect from (None: no peers known)
        self.limits = DEFAULT_LIMITS
        self.driver = RaftDriver(
            config.timing,
            mesh_settings(config, peer_hosts),
            config.limits.raft_log_entries_max,
            compaction_bytes=config.limits.raft_log_bytes_max,
            durable=config.fsync,
        )
        self.metadata_replica = MetadataReplica(self.limits, self._on_metadata_applied)
        self.partitions: dict[PartitionKey, PartitionHandle] = {}
        self.offsets: dict[PartitionKey, OffsetsHandle] = {}
        self.txn_states: dict[PartitionKey, TxnStateHandle] = {}
        self.lease = PidBlockLease()
        self.pid_block_wanted = asyncio.Event()
        self._metadata: RaftGroup | None = None
        self._reconcile_now = asyncio.Event()
        self._start_failures: dict[PartitionKey, StartFailure] = {}
        self._peers = {p.node_id: p for p in config.peers}

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def metadata(self) -> RaftGroup:
        assert self._metadata is not None, "node not started"
        return self._metadata

    async def start(self) -> None:
        if self.config.unsafe_disable_deduplication:
            log.warning("UNSAFE: deduplication is disabled (a test switch): retries duplicate")
        if self.config.unsafe_ignore_isolation:
            log.warning("UNSAFE: read_committed is served as read_uncommitted (a test switch)")
        self.driver.start()
        me = self.config.self_peer
        spec = GroupSpec(
            METADATA_GROUP,
            me.raft_address,
            tuple(p.raft_address for p in self.config.peers if p.node_id != me.node_id),
            layout.metadata_dir(self.config.data_dir),
            METADATA_GROUP,
            self._labels(),
        )
        self._metadata = await self.driver.add_group(
            spec, self.metadata_replica, self.config.limits.pending_proposals_max
        )

    def _labels(self) -> tuple[tuple[str, str], ...]:
        """Replicas by node in status details (`node 2`), not by Raft address."""
        return tuple((p.raft_address, f"node {p.node_id}") for p in self.config.peers)

    async def stop(self) -> None:
        self.driver.stop()
        for handle in self.partitions.values():
            handle.replica.store.close()
        self.partitions.clear()
        self.offsets.clear()
        self.txn_states.clear()

    async def reconcile_forever(self) -> None:
        while True:
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reconcile_now.wait(), RECONCILE_INTERVAL_S)
            self._reconcile_now.clear()

    async def reconcile(self) -> None:
        """Start groups this node should host and stop those it should not."""
        topics = await self.metadata.read(lambda: dict(self.metadata_replica.machine.topics))
        wanted = {
            (t.name, p): t
            for t in topics.values()
            for p in range(t.partitions)
            if self.config.node_id in t.replicas[p]
        }
        hosted: dict[PartitionKey, PartitionHandle | InternalHandle] = {
            **self.partitions,
            **self.offsets,
            **self.txn_states,
        }
        for key in [k for k, h in hosted.items() if not _same_topic(wanted.get(k), h.topic)]:
            await self._stop_partition(key, delete=True)
            await asyncio.sleep(0)  # see below
        for key, handle in hosted.items():  # a topic's configs changed: the handle takes them
            if key in wanted and _same_topic(wanted[key], handle.topic):
                handle.topic = wanted[key]
        self._start_failures = {
            k: f for k, f in self._start_failures.items() if _same_topic(wanted.get(k), f.topic)
        }
        now = time.monotonic()
        for key, topic in wanted.items():
            failure = self._start_failures.get(key)
            if key in hosted or (failure is not None and failure.retry_at > now):
                continue
            try:
                await self._start_partition(topic, key[1])
            except Exception as exc:  # noqa: BLE001 - e.g. an unwritable disk: reported, retried
                self._start_failed(key, topic, exc, now)
            else:
                if self._start_failures.pop(key, None) is not None:
                    log.info("partition %s-%d started after all", *key)
            # A group starts in a few ms of disk and setup: a topic of hundreds of partitions
            # started in one turn of the loop stalled it past the election timeout, and every
            # group of every node re-elected at once (issue 40, item 6). One start per turn.
            await asyncio.sleep(0)

    def _start_failed(
        self, key: PartitionKey, topic: TopicInfo, exc: Exception, now: float
    ) -> None:
        """One line the first time (or when the error changes), a quieter one per retry, and
        retries further and further apart; the group shows unhealthy meanwhile."""
        previous = self._start_failures.get(key)
        attempts = 1 if previous is None else previous.attempts + 1
        delay_s = min(START_RETRY_S * 2 ** (attempts - 1), START_RETRY_MAX_S)
        error = f"{type(exc).__name__}: {exc}"[:START_ERROR_CHARS_MAX]
        if previous is None or previous.error != error:
            log.error("could not start partition %s-%d: %s", *key, error)
        else:
            log.warning("partition %s-%d still cannot start (attempt %d)", *key, attempts)
        log.debug("partition %s-%d failed to start", *key, exc_info=exc)
        self._start_failures[key] = StartFailure(topic, error, attempts, now + delay_s)

    # -- partitions ------------------------------------------------------------------------------

    async def _start_partition(self, topic: TopicInfo, partition: int) -> None:
        directory = layout.prepare_partition_dir(self.config.data_dir, topic, partition)
        spec, by_address = self._partition_spec(topic, partition, directory)
        if topic.name == OFFSETS_TOPIC:
            offsets = OffsetsReplica(self.limits)
            group = await self.driver.add_group(
                spec, offsets, self.config.limits.pending_proposals_max
            )
            self.offsets[(topic.name, partition)] = OffsetsHandle(topic, partition, group, offsets)
            log.info("started offsets partition %s", spec.name)
            return
        if topic.name == TXN_STATE_TOPIC:
            txn_state = TxnStateReplica(self.limits)
            group = await self.driver.add_group(
                spec, txn_state, self.config.limits.pending_proposals_max
            )
            key = (topic.name, partition)
            self.txn_states[key] = TxnStateHandle(topic, partition, group, txn_state)
            log.info("started transaction state partition %s", spec.name)
            return
        replica = PartitionReplica(
            self.open_store,
            directory,
            self.fatal,
            self.limits,
            deduplicate=not self.config.unsafe_disable_deduplication,
            durable=self.config.fsync,
        )
        if replica.store.recovered_truncated_bytes:
            log.warning(
                "%s: truncated a torn tail of %d bytes (%s)",
                spec.name,
                replica.store.recovered_truncated_bytes,
                replica.store.recovery_problem,
            )
        group = await self.driver.add_group(spec, replica, self.config.limits.pending_proposals_max)
        handle = PartitionHandle(topic, partition, group, replica, by_address)
        replica.on_applied = self._partition_listener(handle)
        self.partitions[handle.key] = handle
        log.info("started partition %s", spec.name)

    def _partition_spec(
        self, topic: TopicInfo, partition: int, directory: Path
    ) -> tuple[GroupSpec, dict[str, Peer]]:
        replicas = [self._peers[n] for n in topic.replicas[partition] if n in self._peers]
        by_address = {p.raft_address: p for p in replicas}
        me = self.config.self_peer
        spec = GroupSpec(
            f"{topic.name}-{partition}",
            me.raft_address,
            tuple(a for a, p in by_address.items() if p.node_id != me.node_id),
            directory / "raft",
            f"{topic.name}-{partition}.{topic.topic_id}",
            self._labels(),
            # The first assigned replica, which placement rotates over partitions
            # (statemachine/metadata.py: place_replicas): a new topic's leaders spread.
            preferred_leader=replicas[0].raft_address if replicas else None,
        )
        return spec, by_address

    def open_store(self, directory: Path) -> PartitionStore:
        limits = self.config.limits
        return PartitionStore(
            directory,
            segment_bytes_max=limits.segment_bytes_max,
            index_interval_bytes=limits.index_interval_bytes,
            # Not per append: the Raft journal holds every record until a snapshot, and the
            # replica syncs its store before one is taken (PartitionReplica.snapshot).
            fsync=False,
        )

    async def _stop_partition(self, key: PartitionKey, *, delete: bool) -> None:
        handle: PartitionHandle | InternalHandle
        if key in self.offsets or key in self.txn_states:
            handle = self.offsets.pop(key) if key in self.offsets else self.txn_states.pop(key)
            await self.driver.remove_group(handle.group.name)
        else:
            handle = self.partitions.pop(key)
            await self.driver.remove_group(handle.group.name)
            handle.replica.store.close()
        if delete:
            directory = layout.partition_dir(
                self.config.data_dir, handle.topic.topic_id, handle.partition
            )
            await asyncio.to_thread(shutil.rmtree, directory, True)
        log.info("stopped partition %s-%d", *key)

    @staticmethod
    def _partition_listener(handle: PartitionHandle) -> Callable[[PartitionResult], None]:
        def on_applied(result: PartitionResult) -> None:  # in a Raft tick, on the loop
            if isinstance(result, Appended) and handle.waiters:
                handle.data_arrived()

        return on_applied

    def _on_metadata_applied(self, result: MetadataResult) -> None:  # in a Raft tick
        if isinstance(result, TopicCreated | TopicDeleted | TopicAltered):
            self._reconcile_now.set()

    # -- views for the server --------------------------------------------------------------------

    def peer(self, node_id: int) -> Peer | None:
        return self._peers.get(node_id)

    def group_statuses(self) -> list[GroupStatus]:
        statuses = [self.metadata.status()]
        statuses += [h.group.status() for h in self.partitions.values()]
        statuses += [h.group.status() for h in self.offsets.values()]
        statuses += [h.group.status() for h in self.txn_states.values()]
        statuses += [
            GroupStatus(
                name=f"{name}-{partition}",
                is_leader=False,
                serving=False,
                leader_address=None,
                term=0,
                commit_index=0,
                last_applied=0,
                healthy=False,
                detail=f"not started: {f.error}",
            )
            for (name, partition), f in self._start_failures.items()
        ]
        return statuses

    def partition_offsets(self) -> dict[str, tuple[int, int]]:
        """(log start offset, high watermark) of each partition replica here, by group name."""
        return {
            h.group.name: (h.replica.log_start_offset, h.replica.high_watermark)
            for h in self.partitions.values()
        }

    def metadata_leader(self) -> Peer | None:
        address = self.metadata.leader_address
        return next((p for p in self.config.peers if p.raft_address == address), None)


def _same_topic(wanted: TopicInfo | None, hosted: TopicInfo) -> bool:
    """Whether a hosted replica still belongs to the topic the metadata has (the same topic,
    not one deleted and created again under its name), whatever its configs are now."""
    return wanted is not None and wanted.topic_id == hosted.topic_id
