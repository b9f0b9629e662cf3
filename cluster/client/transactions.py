"""The transactional producer: several partitions, and a consumer group's offsets, written
atomically (Kafka's transactions over the native protocol).

Rules (docs/semantics.md, "Transactions"; Kafka's producer API, as confluent-kafka's):
- `async with TransactionalProducer(client, id)` is InitProducerId for the id at its
  coordinator: the id's producer id and a new epoch, which fences every older instance and
  aborts a transaction one left open.
- `begin()`, then `send`s: before its first record to a partition, the partition joins the
  transaction (AddPartitionsToTxn: answered once the partition's own Raft group registered
  it), so no batch of it is appended outside a transaction the coordinator knows. Batches are
  marked transactional; a read_committed reader sees none of them until the commit marker.
- `send_offsets(offsets, group)`: the group's offsets join the transaction (AddOffsetsToTxn,
  then TxnOffsetCommit to the group's coordinator): consume-transform-produce exactly once.
- `commit()` waits for every record sent to be acknowledged, then EndTxn: answered once the
  decision is committed at the coordinator (the markers follow; a read_committed reader sees
  the records once its partition took the marker). A record that failed makes the
  transaction abortable: commit raises `TxnAbortableError`, and `abort()` ends it.
- `abort()` waits for what was sent, then EndTxn(abort): none of the transaction is ever
  read by a read_committed reader. PRODUCER_FENCED (a newer instance) is fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import NamedTuple

from cluster import native as p
from cluster.client.errors import ClientError, ProducerFencedError
from cluster.client.group_consumer import GroupMetadata
from cluster.client.metadata import Client
from cluster.client.producer import FENCED, Producer, ProducerConfig, RecordMetadata
from statemachine.errors import ErrorCode


class PreparedTxn(NamedTuple):
    """A transaction whose records are all acknowledged and which nobody has ended yet: any
    client holding its producer id and epoch ends it (`end_prepared`), as Flink's two-phase
    commit does, so a Spark driver commits what its tasks wrote. It stays open until then, or
    until its transaction timeout aborts it."""

    transactional_id: str
    producer_id: int
    epoch: int


class TxnAbortableError(ClientError):
    """The transaction cannot commit (a record of it failed, or its coordinator aborted it):
    `abort()` it, then begin another."""


class TransactionalProducer:
    """Kafka's transactional producer: `begin`, `send`, `send_offsets`, `commit` or `abort`."""

    def __init__(
        self, cluster: Client, transactional_id: str, config: ProducerConfig | None = None
    ) -> None:
        if not transactional_id:
            raise ValueError("a transactional producer needs a transactional id")
        base = replace(
            config or ProducerConfig(), transactional_id=transactional_id, idempotent=True
        )
        self.cluster = cluster
        self.transactional_id = transactional_id
        self.producer = Producer(cluster, base, transactional=True)
        self._timeout_s = base.delivery_timeout_ms / 1000
        self._open = False
        self._partitions: set[tuple[str, int]] = set()
        self._groups: set[str] = set()
        self._sent: list[asyncio.Future[RecordMetadata]] = []
        self._epoch_at_begin = -1

    async def __aenter__(self) -> TransactionalProducer:
        await self.producer.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        """An open transaction is aborted (as Kafka's `close` leaves it to time out, this
        ends it at once)."""
        if self._open and self.producer.fatal is None:
            with contextlib.suppress(ClientError):
                await self.abort()
        await self.producer.__aexit__(exc_type, exc, tb)
        for future in self._sent:  # their failures are the transaction's, told already
            if future.done() and not future.cancelled():
                future.exception()

    @property
    def in_transaction(self) -> bool:
        return self._open

    @property
    def config(self) -> ProducerConfig:
        return self.producer.config

    async def flush(self) -> None:
        """Until every record of the open transaction is acknowledged; its first failure
        raised, as `TxnAbortableError` (the transaction can only be aborted)."""
        failed = await self._settled()
        if failed is not None:
            raise TxnAbortableError(failed.error, f"a record of the transaction failed: {failed}")

    def begin(self) -> None:
        if self.producer.fatal is not None:
            raise self.producer.fatal
        if self._open:
            raise ClientError(ErrorCode.INVALID_TXN_STATE, "a transaction is already open")
        self._open = True
        self._partitions.clear()
        self._groups.clear()
        self._sent = []
        self._epoch_at_begin = self.producer.epoch

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        headers: tuple[tuple[str, bytes], ...] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """`Producer.send` inside the open transaction."""
        self._check_open()
        where = (topic, await self.producer.partition_for(topic, key, partition))
        if where not in self._partitions:
            await self._add_partitions([where])
        future = await self.producer.send(
            topic, value, key, headers=headers, partition=where[1], timestamp_ms=timestamp_ms
        )
        self._sent.append(future)
        return future

    async def send_offsets(
        self, offsets: Mapping[tuple[str, int], int], group: GroupMetadata
    ) -> None:
        """The group's next offsets (`offsets`: the position after the last record consumed),
        committed if and only if the transaction commits."""
        self._check_open()
        if group.group not in self._groups:
            request = p.AddOffsetsToTxn(
                self.transactional_id, self.producer.producer_id, self.producer.epoch, group.group
            )
            self._raise_for(await self._call(request), "AddOffsetsToTxn")
            self._groups.add(group.group)
        commit = p.TxnOffsetCommit(
            self.transactional_id,
            group.group,
            self.producer.producer_id,
            self.producer.epoch,
            group.generation,
            group.member_id,
            group.instance_id,
            tuple(p.CommitEntry(t, n, offset, "") for (t, n), offset in sorted(offsets.items())),
        )
        response = await self.cluster.call_coordinator(
            group.group, commit, timeout_s=self._timeout_s
        )
        assert isinstance(response, p.OffsetCommitResponse)
        for result in response.results:
            self._raise_for_code(result.error, f"TxnOffsetCommit {result.topic}-{result.partition}")

    async def commit(self) -> None:
        """Every record of the transaction acknowledged, then the commit decided; on
        `TxnAbortableError` the transaction is still open, for `abort()`."""
        await self._all_acknowledged()
        await self._end(commit=True)

    async def prepare(self) -> PreparedTxn:
        """Every record of the transaction acknowledged, the transaction left open for
        `end_prepared`: this producer is done with it (leaving the `with` does not abort it)."""
        await self._all_acknowledged()
        self._open = False
        return PreparedTxn(self.transactional_id, self.producer.producer_id, self.producer.epoch)

    async def abort(self) -> None:
        """None of the transaction is ever read by a read_committed reader."""
        self._check_open()
        await self._settled()
        if self.producer.epoch != self._epoch_at_begin:
            self._open = False  # its new session's InitProducerId aborted it already
            return
        await self._end(commit=False)

    async def _all_acknowledged(self) -> None:
        """What a commit (or a prepare) needs first: the transaction open, every record of it
        acknowledged, in the session that began it; `TxnAbortableError` otherwise."""
        self._check_open()
        await self.flush()
        if self.producer.epoch != self._epoch_at_begin:
            raise TxnAbortableError(
                ErrorCode.INVALID_PRODUCER_EPOCH, "the producer's session was renewed: aborted"
            )

    # -- the coordinator's requests --------------------------------------------------------------

    async def _add_partitions(self, partitions: Iterable[tuple[str, int]]) -> None:
        asked = tuple(p.TxnPartition(t, n) for t, n in partitions)
        request = p.AddPartitionsToTxn(
            self.transactional_id, self.producer.producer_id, self.producer.epoch, asked
        )
        response = await self._call(request)
        assert isinstance(response, p.AddPartitionsToTxnResponse)
        for result in response.results:
            self._raise_for_code(
                result.error, f"AddPartitionsToTxn {result.topic}-{result.partition}"
            )
        self._partitions.update((x.topic, x.partition) for x in asked)

    async def _end(self, *, commit: bool) -> None:
        request = p.EndTxn(
            self.transactional_id, self.producer.producer_id, self.producer.epoch, commit
        )
        self._raise_for(await self._call(request), "EndTxn")
        self._open = False

    async def _call(self, request: p.Request) -> p.Response:
        try:
            return await self.cluster.call_coordinator(
                self.transactional_id, request, timeout_s=self._timeout_s, key_type=p.TXN_KEY
            )
        except ClientError as exc:
            self._raise_for_code(exc.error, type(request).__name__)
            raise

    def _raise_for(self, response: p.Response, what: str) -> None:
        assert isinstance(response, p.TxnErrorResponse)
        self._raise_for_code(response.error, what)

    def _raise_for_code(self, error: int, what: str) -> None:
        code = ErrorCode(error)
        if code == ErrorCode.NONE:
            return
        message = f"{self.transactional_id}: {what} refused"
        if code in FENCED:
            fenced = ProducerFencedError(code, f"{message}: a newer instance took over")
            self.producer.fatal = fenced
            raise fenced
        raise ClientError(code, message)

    async def _settled(self) -> ClientError | None:
        """Until every record sent in the transaction is acknowledged or failed: the first
        failure, if any."""
        if self._sent:
            await asyncio.wait(self._sent)
        # Every failure is looked at: an exception nobody retrieved is logged at collection.
        errors = [e for e in (f.exception() for f in self._sent) if e is not None]
        if not errors:
            return None
        first = errors[0]
        if isinstance(first, ClientError):
            return first
        return ClientError(ErrorCode.UNKNOWN_SERVER_ERROR, repr(first))

    def _check_open(self) -> None:
        if self.producer.fatal is not None:
            raise self.producer.fatal
        if not self._open:
            raise ClientError(ErrorCode.INVALID_TXN_STATE, "no transaction is open: begin() first")


async def end_prepared(
    cluster: Client, prepared: PreparedTxn, *, commit: bool, timeout_s: float | None = None
) -> None:
    """Commit or abort a prepared transaction (EndTxn with its producer id and epoch), from
    any client; a retry after it ended the same way is answered NONE."""
    txn_id = prepared.transactional_id
    request = p.EndTxn(txn_id, prepared.producer_id, prepared.epoch, commit)
    response = await cluster.call_coordinator(
        txn_id, request, timeout_s=timeout_s, key_type=p.TXN_KEY
    )
    assert isinstance(response, p.TxnErrorResponse)
    if response.error != ErrorCode.NONE:
        what = "commit" if commit else "abort"
        raise ClientError(ErrorCode(response.error), f"{txn_id}: the prepared {what} refused")


async def abort_open(cluster: Client, txn_id: str, config: ProducerConfig | None = None) -> None:
    """Abort whatever transaction `txn_id` has open, prepared or not (InitProducerId bumps its
    epoch, which fences its producer and aborts it, as a new instance's start does)."""
    async with TransactionalProducer(cluster, txn_id, config):
        pass
