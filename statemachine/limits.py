"""Bounds on replicated state and on what one entry may carry.

A limit on everything: each table a state machine keeps has a maximum size, and each field of
an entry a maximum length. The same `StateLimits` must be given to every replica of a group
(a different bound would let replicas answer differently), so the cluster passes the defaults
below; changing one is a versioned upgrade, not a node setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from statemachine.fields import check_positive_ints

KIB = 1024
MIB = 1024 * KIB
WINDOW_BATCHES = 5  # batches per producer whose metadata a partition retains for dedup
SEQUENCE_SPACE = 2**31


@dataclass(frozen=True, slots=True)
class StateLimits:
    """Cluster-wide bounds; every value is a positive count or size with its unit last."""

    entry_bytes_max: int = 2 * MIB
    batch_bytes_max: int = 1 * MIB
    batch_records_max: int = 65_536
    record_headers_max: int = 64
    decompressed_batch_bytes_max: int = 64 * MIB  # what a reader inflates one batch to
    producers_per_partition_max: int = 20_000
    sink_writers_per_partition_max: int = 10_000
    leader_epochs_per_partition_max: int = 1_024  # Raft terms in which records were appended
    txn_producers_per_partition_max: int = 10_000  # producers with transactions here
    aborted_txns_per_partition_max: int = 10_000  # aborted transactions with data still kept
    brokers_max: int = 256
    topics_max: int = 10_000
    partitions_per_topic_max: int = 1_024
    replication_factor_max: int = 7
    transactional_ids_max: int = 100_000
    transaction_timeout_ms_max: int = 900_000
    txn_partitions_max: int = 1_000  # partitions (and offsets partitions) of one transaction
    pid_block_size_max: int = 1_000_000
    name_length_max: int = 249
    address_length_max: int = 261  # a DNS name (253) + ":" + a port
    groups_per_partition_max: int = 10_000  # consumer groups an offsets partition holds
    group_offsets_max: int = 10_000  # committed partitions per group
    offset_metadata_bytes_max: int = 4_096  # Kafka's offset.metadata.max.bytes

    def __post_init__(self) -> None:
        check_positive_ints(self)
        if WINDOW_BATCHES * self.batch_records_max >= SEQUENCE_SPACE:
            # The producer table's fast path relies on a window never wrapping the sequences.
            raise ValueError("StateLimits.batch_records_max: 5 batches must not wrap 2^31")
        if self.batch_bytes_max > self.entry_bytes_max - KIB:
            raise ValueError("StateLimits.batch_bytes_max must leave 1 KiB of entry_bytes_max free")


DEFAULT_LIMITS = StateLimits()
