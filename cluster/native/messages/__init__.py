"""Every request and response of the native protocol, one module per family: cluster.py
(Metadata, topics, ClusterStatus), records.py (Produce, FencedProduce, Fetch, ListOffsets),
producers.py (InitProducerId, DescribeProducers), groups.py (the consumer groups' requests,
TxnOffsetCommit among them), txns.py (the transactions');
base.py what they all are. `REQUEST_TYPES` and `BY_OP`, the table the codec dispatches on, are
built here and checked: one request class per `Op`.
"""

from __future__ import annotations

from cluster.native.messages.base import Op, Request
from cluster.native.messages.cluster import ClusterStatus, CreateTopic, DeleteTopic, Metadata
from cluster.native.messages.groups import (
    DeleteGroup,
    DescribeGroup,
    FindCoordinator,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    ListGroups,
    OffsetCommit,
    OffsetFetch,
    SyncGroup,
    TxnOffsetCommit,
)
from cluster.native.messages.producers import DescribeProducers, InitProducerId
from cluster.native.messages.records import FencedProduce, Fetch, ListOffsets, Produce
from cluster.native.messages.txns import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    DescribeTransactions,
    EndTxn,
    ListTransactions,
    PartitionTxnEntry,
    WriteTxnMarkers,
)

REQUEST_TYPES: tuple[type[Request], ...] = (
    Metadata,
    CreateTopic,
    DeleteTopic,
    InitProducerId,
    Produce,
    Fetch,
    ListOffsets,
    DescribeProducers,
    ClusterStatus,
    FencedProduce,
    FindCoordinator,
    JoinGroup,
    SyncGroup,
    Heartbeat,
    LeaveGroup,
    OffsetCommit,
    OffsetFetch,
    DescribeGroup,
    ListGroups,
    DeleteGroup,
    AddPartitionsToTxn,
    AddOffsetsToTxn,
    EndTxn,
    WriteTxnMarkers,
    TxnOffsetCommit,
    DescribeTransactions,
    ListTransactions,
    PartitionTxnEntry,
)


def _request_types_by_op() -> dict[int, type[Request]]:
    by_op: dict[int, type[Request]] = {int(cls.OP): cls for cls in REQUEST_TYPES}
    assert sorted(by_op) == sorted(int(op) for op in Op), "one request type per Op"
    return by_op


BY_OP = _request_types_by_op()
