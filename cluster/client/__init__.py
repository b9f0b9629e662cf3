"""The client library: what applications, the CLI, the Spark data source and the tests import.

Role: talk to a raftbroker cluster as Kafka's clients talk to Kafka: find the leader of each
partition from metadata, send it requests, and ride out dead nodes and leader changes until a
call's own timeout (then fail with one line naming what it waited for). Split by role, as
aiokafka splits its producer, consumer and protocol:

    errors.py      ClientError (a RaftbrokerError), ProducerFencedError
    retry.py       RetryPolicy, CallTimeoutError, `retrying`: how a call rides out failures
    connection.py  Connection: one TCP connection, pipelined requests matched to answers
    metadata.py    Client: bootstrap addresses, a connection per broker, the metadata cache,
                   leader lookup and routing that rides out dead nodes and leader changes
    admin.py       Admin: topics, producer state, cluster status, offsets
    batches.py     record sizes, stable_partition, reading fetched batches
    producer.py    Producer (idempotent), RecordMetadata, ProducerConfig
    consumer.py    Consumer, ConsumerConfig, ConsumedRecord
    group_consumer.py  GroupConsumer, GroupConfig, GroupMetadata, CommitFailedError: a
                   consumer group member
    groups.py      Groups: list, describe (with lag), delete groups, reset their offsets
    consumer_protocol.py  Kafka's consumer-protocol bytes and its range assignor
    transactions.py  TransactionalProducer, TxnAbortableError: Kafka's transactions
    txn_admin.py   Transactions: list, describe, find hanging ones, abort them
    fenced.py      FencedWriter: a streaming sink's micro-batch, appended exactly once
    sync.py        SyncClient: the async client driven from a synchronous thread

Rules: the client speaks only the wire protocol (cluster/native/); it never imports the
broker or the Raft layer. Everything public is re-exported here, so
`from cluster.client import Client, Producer, ...` is the way in.
"""

from __future__ import annotations

from cluster.client.admin import Admin
from cluster.client.batches import stable_partition
from cluster.client.connection import Connection
from cluster.client.consumer import ConsumedRecord, Consumer, ConsumerConfig
from cluster.client.errors import ClientError, ProducerFencedError
from cluster.client.group_consumer import (
    CommitFailedError,
    GroupConfig,
    GroupConsumer,
    GroupMetadata,
)
from cluster.client.groups import Groups
from cluster.client.metadata import Client, PartitionInfo
from cluster.client.producer import (
    Producer,
    ProducerConfig,
    RecordMetadata,
)
from cluster.client.retry import CallTimeoutError, RetryPolicy, retrying
from cluster.client.transactions import (
    PreparedTxn,
    TransactionalProducer,
    TxnAbortableError,
    abort_open,
    end_prepared,
)
from cluster.client.txn_admin import HangingTxn, OpenTxn, Transactions, TxnListing

__all__ = [
    "Admin",
    "CallTimeoutError",
    "Client",
    "ClientError",
    "CommitFailedError",
    "Connection",
    "ConsumedRecord",
    "Consumer",
    "ConsumerConfig",
    "GroupConfig",
    "GroupConsumer",
    "GroupMetadata",
    "Groups",
    "HangingTxn",
    "OpenTxn",
    "PartitionInfo",
    "PreparedTxn",
    "Producer",
    "ProducerConfig",
    "ProducerFencedError",
    "RecordMetadata",
    "RetryPolicy",
    "TransactionalProducer",
    "Transactions",
    "TxnAbortableError",
    "TxnListing",
    "abort_open",
    "end_prepared",
    "retrying",
    "stable_partition",
]
