"""The internal topics' shared rules: a key's partition, its coordinator (the partition's
leader), and the topic created through the metadata group on first need.

Role: consumer groups (`__consumer_offsets`, cluster/broker/groups.py) and transactions
(`__transaction_state`, cluster/broker/txns.py) each keep their state in the partitions of an
internal topic, a key's partition chosen by a CRC of the key; both create their topic the same
way, as Kafka does, on the first FindCoordinator for a key of theirs, and answer
COORDINATOR_NOT_AVAILABLE (retriable) until it exists.
"""

from __future__ import annotations

import contextlib
import logging
import zlib

from cluster.broker.node import OFFSETS_TOPIC, Node
from cluster.broker.peers import PeerWatcher
from cluster.raft import ProposalError
from statemachine.commands import CreateTopic
from statemachine.errors import ErrorCode, Rejected
from statemachine.metadata import TopicInfo

log = logging.getLogger(__name__)
INTERNAL_TOPIC_REPLICATION = 3  # or every broker, if fewer


def partition_of(key: str, partitions: int) -> int:
    """The partition of an internal topic that holds `key` (a group id, a transactional id)."""
    return zlib.crc32(key.encode()) % partitions


def internal_topic(node: Node, name: str) -> TopicInfo | None:
    return node.metadata_replica.machine.topics.get(name)


async def ensure_internal_topic(
    node: Node, name: str, partitions: int, timeout_s: float
) -> ErrorCode:
    """NONE once the topic exists; else its creation is proposed and COORDINATOR_NOT_AVAILABLE
    is the answer meanwhile, as Kafka's."""
    if internal_topic(node, name) is not None:
        return ErrorCode.NONE
    brokers = len(node.metadata_replica.machine.brokers)
    if brokers == 0:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    replication = min(INTERNAL_TOPIC_REPLICATION, brokers)
    command = CreateTopic(name, partitions, replication, -1, -1).encode()
    with contextlib.suppress(ProposalError):
        result = await node.metadata.propose(command, timeout_s, forward=True)
        if isinstance(result, Rejected) and result.error != ErrorCode.TOPIC_ALREADY_EXISTS:
            log.warning("could not create %s: %s", name, result.error.name)
    return ErrorCode.NONE if internal_topic(node, name) else ErrorCode.COORDINATOR_NOT_AVAILABLE


async def ensure_offsets_topic(node: Node, timeout_s: float) -> ErrorCode:
    """`ensure_internal_topic` of the consumer groups' topic, its partitions as configured."""
    partitions = node.config.limits.offsets_topic_partitions
    return await ensure_internal_topic(node, OFFSETS_TOPIC, partitions, timeout_s)


def offsets_partition(node: Node, group_id: str) -> int | None:
    """The offsets partition that holds `group_id` (None until the topic exists): its group
    coordinator's, and the one a transaction with the group's offsets registers."""
    topic = internal_topic(node, OFFSETS_TOPIC)
    return None if topic is None else partition_of(group_id, topic.partitions)


def coordinator_of(node: Node, peers: PeerWatcher, name: str, key: str) -> tuple[ErrorCode, int]:
    """FindCoordinator's answer for `key`: the leader of its partition of topic `name`, known
    here when this node hosts a replica of it, else from the peers' status reports;
    COORDINATOR_NOT_AVAILABLE (retriable) while the topic or a leader is missing."""
    topic = internal_topic(node, name)
    node_id = None
    if topic is not None:
        partition = partition_of(key, topic.partitions)
        hosted = node.offsets if name == OFFSETS_TOPIC else node.txn_states
        handle = hosted.get((name, partition))
        if handle is not None:
            node_id = peers.node_of_raft_address(handle.group.leader_address)
        else:
            node_id = peers.leader_of(name, partition)
    if node_id is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1
    return ErrorCode.NONE, node_id
