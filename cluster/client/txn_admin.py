"""Transactions for administrators, as `kafka-transactions.sh` has them: list, describe,
find-hanging and abort.

Rules: ListTransactions asks every node (each lists the ids it coordinates) and fails only when
none answers; DescribeTransactions goes to the id's coordinator. A transaction hangs on a
partition (Kafka's FindHangingTransactions) when the partition holds it open longer than the
largest transaction timeout (15 minutes by default) and its coordinator does not hold it open
there: its id is not found, or is in another state, another epoch, or without that partition.
`abort` writes an abort marker for such a transaction on its partition (WriteTxnMarkers, with
the coordinator epoch the partition knows); named by its first offset, as Kafka's tool, or by
its producer. A transaction its coordinator still knows ends as the coordinator decides on
its other partitions, so aborting it here can tear it: the tool's user checks first.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import NamedTuple

from cluster import native as p
from cluster.client.admin import Admin
from cluster.client.errors import ClientError
from cluster.client.metadata import Client
from cluster.clock import wall_ms
from statemachine.errors import ErrorCode

MAX_TRANSACTION_TIMEOUT_MS = 15 * 60_000  # Kafka's transaction.max.timeout.ms default


class TxnListing(NamedTuple):
    transactional_id: str
    producer_id: int
    state: str


class OpenTxn(NamedTuple):
    """A producer's transaction open on one partition, as the partition sees it."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp_ms: int


class HangingTxn(NamedTuple):
    open: OpenTxn
    transactional_id: str  # "" when no coordinator knows the producer
    why: str


def hanging_reason(
    txn: OpenTxn, described: p.DescribedTxn | None, now_ms: int, max_timeout_ms: int
) -> str | None:
    """Why `txn` hangs, given its coordinator's view (`described`: None if no coordinator
    lists its producer); None when it does not (too young, or its coordinator holds it)."""
    if now_ms - txn.last_timestamp_ms <= max_timeout_ms:
        return None
    if described is None or described.error != ErrorCode.NONE:
        return "no coordinator knows its producer"
    if described.state != "Ongoing":
        return f"its coordinator has it {described.state}"
    if described.producer_epoch != txn.producer_epoch:
        return f"its coordinator is at epoch {described.producer_epoch}"
    if p.TxnPartition(txn.topic, txn.partition) not in described.partitions:
        return "its coordinator's transaction does not hold this partition"
    return None


class Transactions:
    """The transactions of a cluster."""

    def __init__(self, cluster: Client) -> None:
        self.cluster = cluster
        self.admin = Admin(cluster)

    async def list(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        running_ms_min: int = -1,
        *,
        timeout_s: float | None = None,
    ) -> list[TxnListing]:
        """Every transactional id in `states` (any: none given; Kafka's names, "Ongoing"), of
        `producer_ids` (any: none), open longer than `running_ms_min` (-1: any), by id."""
        request = p.ListTransactions(tuple(states), tuple(producer_ids), running_ms_min)
        found: dict[str, TxnListing] = {}
        for response in await self.cluster.ask_every_broker(request, timeout_s):
            assert isinstance(response, p.ListTransactionsResponse)
            if response.unknown_states:
                unknown = ", ".join(response.unknown_states)
                raise ClientError(ErrorCode.INVALID_REQUEST, f"no transaction state {unknown}")
            for t in response.transactions:
                found[t.transactional_id] = TxnListing(t.transactional_id, t.producer_id, t.state)
        return [found[txn_id] for txn_id in sorted(found)]

    async def describe(self, txn_id: str, *, timeout_s: float | None = None) -> p.DescribedTxn:
        """The id's transaction, from its coordinator; TRANSACTIONAL_ID_NOT_FOUND raised."""
        request = p.DescribeTransactions((txn_id,))
        response = await self.cluster.call_coordinator(
            txn_id, request, timeout_s=timeout_s, key_type=p.TXN_KEY
        )
        assert isinstance(response, p.DescribeTransactionsResponse)
        (described,) = response.transactions
        if described.error != ErrorCode.NONE:
            raise ClientError(ErrorCode(described.error), f"transactional id {txn_id!r}")
        return described

    async def open_on(
        self, topic: str, partitions: Iterable[int] | None = None, *, timeout_s: float | None = None
    ) -> builtins.list[OpenTxn]:
        """The transactions the partitions of `topic` hold open (DescribeProducers)."""
        found = []
        for result in await self.admin.describe_producers(topic, partitions, timeout_s=timeout_s):
            for d in result.producers:
                if d.txn_start_offset >= 0:
                    found.append(
                        OpenTxn(
                            topic,
                            result.partition,
                            d.producer_id,
                            d.epoch,
                            max(d.coordinator_epoch, 0),
                            d.txn_start_offset,
                            d.last_timestamp_ms,
                        )
                    )
        return found

    async def find_hanging(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        *,
        max_timeout_ms: int = MAX_TRANSACTION_TIMEOUT_MS,
        timeout_s: float | None = None,
    ) -> builtins.list[HangingTxn]:
        """The transactions hanging on the partitions of `topic` (`hanging_reason`)."""
        now_ms = wall_ms()
        hanging = []
        for txn in await self.open_on(topic, partitions, timeout_s=timeout_s):
            if now_ms - txn.last_timestamp_ms <= max_timeout_ms:
                continue  # too young to hang: no coordinator lookups for it
            listed = await self.list(producer_ids=(txn.producer_id,), timeout_s=timeout_s)
            described = None
            txn_id = listed[0].transactional_id if listed else ""
            if txn_id:
                described = (await self._describe_any(txn_id, timeout_s)) or None
            why = hanging_reason(txn, described, now_ms, max_timeout_ms)
            if why is not None:
                hanging.append(HangingTxn(txn, txn_id, why))
        return hanging

    async def _describe_any(self, txn_id: str, timeout_s: float | None) -> p.DescribedTxn | None:
        try:
            return await self.describe(txn_id, timeout_s=timeout_s)
        except ClientError as exc:
            if exc.error == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                return None
            raise

    async def abort(
        self,
        topic: str,
        partition: int,
        *,
        start_offset: int | None = None,
        producer: tuple[int, int, int] | None = None,
        timeout_s: float | None = None,
    ) -> OpenTxn | None:
        """Abort the transaction open on the partition that starts at `start_offset`, or of
        `producer` (its id, epoch and the partition's coordinator epoch); the transaction
        aborted (None: named by its producer)."""
        if (start_offset is None) == (producer is None):
            raise ValueError("name the transaction by start_offset or by producer, one of them")
        found = None
        if start_offset is not None:
            open_here = await self.open_on(topic, [partition], timeout_s=timeout_s)
            found = next((t for t in open_here if t.start_offset == start_offset), None)
            if found is None:
                where = f"{topic}-{partition}"
                message = f"no transaction open on {where} starts at offset {start_offset}"
                raise ClientError(ErrorCode.INVALID_TXN_STATE, message)
            producer = (found.producer_id, found.producer_epoch, found.coordinator_epoch)
        assert producer is not None
        request = p.WriteTxnMarkers(topic, partition, *producer)
        response = await self.cluster.call_leader(topic, partition, request, timeout_s=timeout_s)
        assert isinstance(response, p.TxnErrorResponse)
        if response.error != ErrorCode.NONE:
            raise ClientError(ErrorCode(response.error), f"abort on {topic}-{partition}")
        return found
