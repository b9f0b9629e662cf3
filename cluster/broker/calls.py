"""What the broker core's calls take and give: small tuples in the broker's own terms.

Role: the vocabulary between the broker core (core.py) and the listeners that translate their
wire onto it (cluster/native/, cluster/kafka/): no wire class crosses into the core, and no
core type is a wire's. Field orders follow the native protocol's results where one mirrors
another, so the native listener builds its answer from a tuple in one call.
"""

from __future__ import annotations

from typing import NamedTuple

from cluster.broker.storage import StoredBatch
from statemachine.errors import ErrorCode
from statemachine.partition_txns import AbortedTxn
from statemachine.producer_state import BatchMetadata

EARLIEST, LATEST = -2, -1  # an offset query's specs besides a time
Fence = tuple[str, int, int, int]  # (sink, writer, batch id, part) of a fenced batch
Where = tuple[str, int]  # a topic and a partition


class Produced(NamedTuple):
    """One batch's outcome: its offsets, or why not (`leader`: where to retry, or "")."""

    topic: str
    partition: int
    error: ErrorCode
    base_offset: int
    last_offset: int
    append_time_ms: int
    duplicate: bool
    leader: str


class FetchWant(NamedTuple):
    """`current_leader_epoch`: the leader epoch the reader believes current (-1: unchecked,
    as the native protocol and Kafka's Fetch before v9 ask)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    read_committed: bool = False  # up to the last stable offset (Kafka's isolation level 1)


class Fetched(NamedTuple):
    """One partition's committed batches from `FetchWant.offset`, as stored, or why not;
    for a read_committed reader, up to the last stable offset, with the aborted transactions
    whose data it must drop."""

    topic: str
    partition: int
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    leader: str
    batches: tuple[StoredBatch, ...]
    last_stable_offset: int = -1
    aborted: tuple[AbortedTxn, ...] = ()


class OffsetWant(NamedTuple):
    """`spec`: EARLIEST, LATEST, or a time (ms since the epoch) to look the offset up by;
    `current_leader_epoch` as FetchWant's."""

    topic: str
    partition: int
    spec: int
    current_leader_epoch: int = -1
    read_committed: bool = False  # LATEST is the last stable offset (isolation level 1)


class OffsetFound(NamedTuple):
    """The offset found and its leader epoch (Kafka's: the epoch of the record there, or the
    leader's for LATEST; -1 where none is known), or why not (`leader`: where to ask)."""

    topic: str
    partition: int
    error: ErrorCode
    offset: int
    leader: str
    leader_epoch: int = -1


class EpochWant(NamedTuple):
    """OffsetForLeaderEpoch's question: where `leader_epoch` ends, asked of the leader whose
    epoch the asker believes is `current_leader_epoch` (-1: unchecked)."""

    topic: str
    partition: int
    current_leader_epoch: int
    leader_epoch: int


class EpochFound(NamedTuple):
    """The epoch found (the one asked or the last before it with records) and its end offset,
    both -1 when it is undefined, or why not (`leader`: where to ask, or "")."""

    topic: str
    partition: int
    error: ErrorCode
    leader_epoch: int
    end_offset: int
    leader: str


class ProducerView(NamedTuple):
    """A producer as a partition's table holds it, with its deduplication window."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp_ms: int
    window: tuple[BatchMetadata, ...]
    coordinator_epoch: int = -1  # of the last marker it got here (-1: none)
    txn_start_offset: int = -1  # its open transaction's first offset here (-1: none with data)


class PartitionProducers(NamedTuple):
    partition: int
    error: ErrorCode
    leader: str
    producers: tuple[ProducerView, ...]


class NodeSeen(NamedTuple):
    node_id: int
    client_address: str
    reachable: bool


class RaftGroupReport(NamedTuple):
    """One Raft group of this node, its leader and replicas in sync named by node id."""

    group: str
    leader_id: int
    term: int
    commit_index: int
    last_applied: int
    is_leader: bool
    healthy: bool
    detail: str
    in_sync: tuple[int, ...]
    log_start_offset: int
    high_watermark: int
