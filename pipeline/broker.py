"""The data source's conversations with the cluster: topics, offsets, reading ranges, producing.

Role: the only module of `pipeline/` that talks to brokers. It wraps `cluster.client.sync`
(one event loop on a thread) in a `BrokerSession` that a Spark task opens and closes itself.

Rules:
- A session is opened inside `read()` / `write()` / the driver's offset calls and closed there:
  readers and writers are pickled to executors, so nothing here lives in their `__init__`.
- Only committed data is ever offered: LATEST is the high watermark the leader reports (the
  last stable offset, read_committed, the default: no aborted transaction's record is read
  either), and Fetch serves only applied entries. A range ending above the committed end means
  data loss (or a leader not yet caught up): it is waited for up to the request timeout, then
  reported.
- A start offset below the log start is data loss: with `failOnDataLoss` it fails with a
  message that says how to skip, otherwise reading skips ahead to the log start.
- Every call rides out dead nodes and leader changes for the request timeout
  (`raftbroker.request.timeout.ms`), then fails with the client's one-line CallTimeoutError. A
  partition whose leader does not answer is such a failure, never taken for data loss.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from cluster.client import (
    ClientError,
    ConsumedRecord,
    Consumer,
    ConsumerConfig,
    GroupMetadata,
    Groups,
    PreparedTxn,
    Producer,
    ProducerConfig,
    RecordMetadata,
    TransactionalProducer,
    abort_open,
    end_prepared,
)
from cluster.client.sync import SyncClient, SyncProducer
from pipeline.offsets import OffsetRange, Offsets
from pipeline.options import EARLIEST, LATEST, OffsetSpec, Subscription, TopicPartition

FETCH_WAIT_MS = 200  # a fetch of committed data answers at once; this only paces a stall
SEND_CHUNK = 1_000  # records handed to the producer per hop onto the client's loop


class DataLossError(RuntimeError):
    """Records the query expected are gone (deleted by retention, or never committed)."""


class TopicError(ValueError):
    """A topic or partition the options name does not exist."""


def data_loss(message: str) -> DataLossError:
    return DataLossError(
        f"{message}. Some data may have been lost. If you want the query to go on, skipping "
        "what is missing, set the source option failOnDataLoss to false."
    )


class BrokerSession:
    """A client for one task or one driver call: `with BrokerSession(...) as session:`."""

    def __init__(
        self, bootstrap: Iterable[str], request_timeout_s: float, *, read_committed: bool = True
    ) -> None:
        self._bootstrap = list(bootstrap)
        self.request_timeout_s = request_timeout_s
        # A read_committed session's end is the last stable offset, and it reads no record of
        # an aborted transaction (the broker drops them).
        self.read_committed = read_committed
        self._client: SyncClient | None = None

    def __enter__(self) -> BrokerSession:
        self._client = SyncClient(
            self._bootstrap,
            request_timeout_s=self.request_timeout_s,
            call_timeout_s=self.request_timeout_s,
        )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def client(self) -> SyncClient:
        assert self._client is not None, "use `with BrokerSession(...)`"
        return self._client

    # -- topics and offsets ----------------------------------------------------------------

    def topic_partitions(
        self, subscription: Subscription, *, must_exist: bool
    ) -> list[TopicPartition]:
        """The partitions a subscription covers now. With `must_exist`, a named topic or an
        assigned partition that does not exist is an error (a streaming subscribe waits)."""
        names = () if subscription.kind == "subscribePattern" else self._named(subscription)
        meta = self.client.describe_topics(names)
        found = {
            t.name: [pm.partition for pm in t.partitions]
            for t in meta.topics
            if t.error == 0 and subscription.matches(t.name)
        }
        if subscription.kind == "assign":
            return self._check_assigned(subscription, found)
        missing = sorted(set(names) - set(found))
        if missing and must_exist:
            raise TopicError(f"topic(s) do not exist: {', '.join(missing)}")
        return sorted((t, n) for t, parts in found.items() for n in parts)

    @staticmethod
    def _named(subscription: Subscription) -> tuple[str, ...]:
        if subscription.kind == "assign":
            return tuple(sorted({t for t, _ in subscription.assigned}))
        return subscription.topics

    @staticmethod
    def _check_assigned(
        subscription: Subscription, found: dict[str, list[int]]
    ) -> list[TopicPartition]:
        missing = [(t, n) for t, n in subscription.assigned if n not in found.get(t, [])]
        if missing:
            raise TopicError(f"assign names partitions that do not exist: {missing}")
        return list(subscription.assigned)

    def list_offsets(self, partitions: Iterable[TopicPartition], spec: int) -> Offsets:
        """EARLIEST (log start) or LATEST (committed end: the high watermark, or for a
        read_committed session the last stable offset) per partition."""
        admin, committed = self.client.admin, self.read_committed
        return {
            (t, n): self.client.call(admin.list_offsets(t, n, spec, read_committed=committed))
            for t, n in partitions
        }

    def resolve(self, spec: OffsetSpec, partitions: list[TopicPartition], name: str) -> Offsets:
        """Concrete offsets for `partitions`: every -2 / -1 looked up, specific ones checked."""
        specific = spec.as_dict()
        if specific is not None and set(specific) != set(partitions):
            raise TopicError(
                f"{name} must give an offset for every partition read (-2 earliest, -1 "
                f"latest): missing {sorted(set(partitions) - set(specific))}, "
                f"not read {sorted(set(specific) - set(partitions))}"
            )
        wanted = specific if specific is not None else dict.fromkeys(partitions, spec.default)
        earliest = self.list_offsets([tp for tp, o in wanted.items() if o == EARLIEST], EARLIEST)
        latest = self.list_offsets([tp for tp, o in wanted.items() if o == LATEST], LATEST)
        return {tp: earliest.get(tp, latest.get(tp, o)) for tp, o in wanted.items()}

    # -- reading -------------------------------------------------------------------------------

    def read_range(
        self, r: OffsetRange, *, fail_on_data_loss: bool
    ) -> Iterator[list[ConsumedRecord]]:
        """The records of `[r.start, r.end)` in offset order, in chunks as fetched."""
        position = self._first_offset(r, fail_on_data_loss)
        if position >= r.end:
            return
        config = ConsumerConfig(max_wait_ms=FETCH_WAIT_MS, read_committed=self.read_committed)
        consumer = Consumer(self.client.cluster, config)
        self.client.call(consumer.seek(r.topic, r.partition, position))
        progress_at = time.monotonic()
        while position < r.end:
            records = self._poll(consumer, r, fail_on_data_loss)
            wanted = [rec for rec in records if rec.offset < r.end]
            if wanted:
                progress_at = time.monotonic()
                yield wanted
            position = consumer.positions[(r.topic, r.partition)].offset
            if not records and time.monotonic() - progress_at > self.request_timeout_s:
                if consumer.stalled:  # its leader does not answer: a failover, not data loss
                    stalled_too_long = consumer.stall_error(self.request_timeout_s)
                    if stalled_too_long is not None:
                        raise stalled_too_long
                    continue
                if fail_on_data_loss:
                    raise data_loss(
                        f"{r.topic}-{r.partition}: offsets up to {r.end} were planned but the "
                        f"committed end stayed at {position} for {self.request_timeout_s:.0f} s"
                    )
                return

    def _first_offset(self, r: OffsetRange, fail_on_data_loss: bool) -> int:
        log_start = self.list_offsets([(r.topic, r.partition)], EARLIEST)[(r.topic, r.partition)]
        if r.start == EARLIEST or r.start >= log_start:
            return max(r.start, log_start)
        if fail_on_data_loss:
            raise data_loss(
                f"{r.topic}-{r.partition}: the read starts at offset {r.start} but the log now "
                f"starts at {log_start}"
            )
        return log_start

    def _poll(
        self, consumer: Consumer, r: OffsetRange, fail_on_data_loss: bool
    ) -> list[ConsumedRecord]:
        try:
            return self.client.call(consumer.poll(), self.request_timeout_s + 10)
        except ClientError as exc:
            if exc.error.name != "OFFSET_OUT_OF_RANGE":
                raise
        # Retention deleted records under our position mid-read: skip or fail, as at the start.
        position = consumer.positions[(r.topic, r.partition)].offset
        skip_to = self._first_offset(
            OffsetRange(r.topic, r.partition, position, r.end), fail_on_data_loss
        )
        self.client.call(consumer.seek(r.topic, r.partition, skip_to))
        return []

    # -- producing -----------------------------------------------------------------------------

    def producer(self, config: ProducerConfig) -> RecordSender:
        return RecordSender(self.client, Producer(self.client.cluster, config))

    def end_prepared(self, prepared: Iterable[PreparedTxn], *, commit: bool) -> None:
        """Commit or abort transactions that tasks prepared (a Spark driver's commit)."""
        cluster, timeout_s = self.client.cluster, self.request_timeout_s
        for one in prepared:
            self.client.call(end_prepared(cluster, one, commit=commit, timeout_s=timeout_s))

    def abort_open(self, txn_ids: Iterable[str]) -> None:
        """Abort whatever these transactional ids have open (a failed job's tasks')."""
        for txn_id in txn_ids:
            self.client.call(abort_open(self.client.cluster, txn_id))

    def transactional_producer(self, txn_id: str, config: ProducerConfig) -> TxnRecordSender:
        return TxnRecordSender(
            self.client, TransactionalProducer(self.client.cluster, txn_id, config)
        )


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass(slots=True)
class SendStats:
    """What one producer wrote: touched only on the client's loop, read after a flush."""

    records: int = 0
    duplicates: int = 0
    # (topic, partition) -> [first offset, last offset] acknowledged
    ranges: dict[TopicPartition, list[int]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    producer_id: int = -1
    producer_epoch: int = -1

    def acknowledged(self, done: asyncio.Future[RecordMetadata]) -> None:
        if done.cancelled():
            self.errors.append(asyncio.CancelledError())
            return
        error = done.exception()
        if error is not None:
            self.errors.append(error)
            return
        meta = done.result()
        self.records += 1
        self.duplicates += meta.duplicate
        self.producer_id, self.producer_epoch = meta.producer_id, meta.producer_epoch
        span = self.ranges.setdefault((meta.topic, meta.partition), [meta.offset, meta.offset])
        span[0], span[1] = min(span[0], meta.offset), max(span[1], meta.offset)


class RecordSender(SyncProducer):
    """One idempotent producer fed from a synchronous iterator, in chunks.

    Records are handed to the loop `SEND_CHUNK` at a time (one thread hop per chunk, not per
    record, unlike `SyncProducer.send`); the producer's own buffer limit gives back-pressure.
    A batch writer uses one per task (`with`: the producer's session and its flush)."""

    def __init__(self, client: SyncClient, producer: Producer | TransactionalProducer) -> None:
        super().__init__(client, producer)
        self.stats = SendStats()
        self._chunk: list[OutgoingRecord] = []

    def add(self, record: OutgoingRecord) -> None:
        self._chunk.append(record)
        if len(self._chunk) >= SEND_CHUNK:
            self._send_chunk()

    def finish(self) -> SendStats:
        """Until every record is acknowledged; raises the first failure of any record."""
        self._send_chunk()
        self.flush()
        self._client.call(asyncio.sleep(0))  # let acknowledgement callbacks already queued run
        if self.stats.errors:
            raise self.stats.errors[0]
        return self.stats

    def _send_chunk(self) -> None:
        chunk, self._chunk = self._chunk, []
        if chunk:
            self._client.call(self._queue(chunk))

    async def _queue(self, chunk: list[OutgoingRecord]) -> None:
        for r in chunk:
            future = await self._producer.send(
                r.topic, r.value, r.key, headers=r.headers, partition=r.partition
            )
            future.add_done_callback(self.stats.acknowledged)


class TxnRecordSender(RecordSender):
    """A `RecordSender` whose records are one transaction (`begin` ... `prepare`, for the
    driver to commit; leaving the `with` before `prepare` aborts it), which can carry a
    streaming sink's progress: the micro-batch it writes, as the offset of a group named after
    its transactional id, so a micro-batch run again finds itself committed
    (`committed_through`)."""

    _producer: TransactionalProducer

    def begin(self) -> None:
        self._producer.begin()

    def committed_through(self) -> int:
        """The last micro-batch a committed transaction of this id wrote (-1: none); a
        transaction of it still ending is waited for (require_stable)."""
        producer = self._producer
        groups = Groups(self._client.cluster)
        done = self._client.call(groups.committed(producer.transactional_id, require_stable=True))
        return max(done.values(), default=0) - 1

    def mark(self, batch_id: int) -> None:
        """Batch `batch_id` is this transaction's (on the partition of its first record)."""
        first = min(self.stats.ranges, default=None)
        if first is None:
            return  # nothing written: nothing to replay either
        group = GroupMetadata(self._producer.transactional_id)
        self._client.call(self._producer.send_offsets({first: batch_id + 1}, group))

    def prepare(self) -> PreparedTxn:
        """Every record acknowledged; the transaction left open for `end_prepared`."""
        return self._client.call(self._producer.prepare(), self._flush_timeout_s)
