"""Writes: rows to records, one client per Spark task.

Role: `BatchWriter` (`df.write.format("raftbroker")`) and `StreamWriter`
(`df.writeStream.format("raftbroker")`). Both run on executors, open their own session, send
every row of the task, wait for every acknowledgement and return a summary for the driver.

Guarantees:
- Batch write, through the idempotent producer: within one task attempt every row is appended
  exactly once (the producer's retries are deduplicated by the broker: producer id +
  sequence). A task attempt that fails and is retried by Spark uses a new producer id, so the
  rows the failed attempt had already appended are appended again: across task retries a batch
  write is at-least-once, and a failed job leaves whatever was acknowledged (there is nothing
  to roll back, as with Kafka).
- Streaming write, through fenced writes (cluster/fenced.py): each task writes micro-batch
  `batch_id` as writer `partition id` of sink `query id` (Spark's `streaming.sql.batchId` and
  `sql.streaming.queryId`, the same on every run of a batch from the same checkpoint). A part
  a partition already appended for that (sink, writer) is skipped in the same Raft entry that
  would append it, so a micro-batch Spark runs again after a crash or a task retry adds nothing
  twice: exactly-once per micro-batch, provided the rerun gives each task the same rows in the
  same order (a deterministic query over a replayable source, such as this connector's reader).
- Transactional writes (`raftbroker.transactional.id.prefix` P, batch or streaming): a
  two-phase commit, as Flink's Kafka sink. Each task writes its rows as one Kafka transaction
  of transactional id `P/<task partition>` (a stream's: `P/<query id>/<task partition>`) and
  only prepares it (every record acknowledged, the transaction left open); the driver
  commits every task's transaction once all tasks succeeded (`commit`, EndTxn with each
  one's producer id and epoch), and aborts them all if any failed (`abort`: InitProducerId
  for each task's id, which aborts what it left open, prepared or not). A read_committed
  reader (this connector's default, librdkafka's, Kafka Streams') so sees a job's rows all at
  once, or none: not those of a task attempt Spark retried (the retry's InitProducerId, with
  the same id, aborts it), nor those of a task whose input ended early because its upstream
  failed. A stream's transaction also carries, as one of its group's offsets, the
  micro-batch it wrote; a micro-batch Spark runs again finds that (once committed) and writes
  nothing: exactly once per micro-batch for read_committed readers, on the same condition
  as fenced writes. A read_uncommitted reader sees every attempt's rows (at-least-once). A
  prepared transaction the driver never ends (the driver died) is aborted by the next run of
  its task's id, or by its transaction timeout (`raftbroker.transaction.timeout.ms`, 10 min by
  default; read_committed readers of its partitions wait that long).

Rules:
- Nothing is opened in `__init__`: writers are pickled to executors.
- A row goes to its `partition` column if given, else by `stable_partition(key)` (CRC32,
  the same in every process), else round-robin: the producer's own choice.
- A task fails if any of its records is not acknowledged; the summary counts broker-side
  duplicates, which are the producer's deduplicated retries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from pyspark import TaskContext
from pyspark.sql import DataFrame, Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from cluster.client import PreparedTxn, ProducerConfig
from cluster.client.fenced import FencedWriter, FencedWriterConfig, SinkRecord
from pipeline import FORMAT
from pipeline.broker import BrokerSession, SendStats
from pipeline.options import BOOTSTRAP, FENCE_BATCH, FENCE_SINK, WriteOptions
from pipeline.schema import WriteColumns

# Local properties Spark gives every task of a streaming micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class WriteSummary(WriterCommitMessage):
    """What one task wrote: per partition the first and last offset acknowledged."""

    records: int
    duplicates: int
    producer_id: int
    producer_epoch: int
    ranges: tuple[tuple[str, int, int, int], ...]  # (topic, partition, first, last)
    # A transactional write's prepared transaction (id, producer id, epoch), for the driver.
    prepared: tuple[str, int, int] | None = None

    @classmethod
    def of(cls, stats: SendStats) -> WriteSummary:
        ranges = tuple(sorted((t, n, lo, hi) for (t, n), (lo, hi) in stats.ranges.items()))
        return cls(stats.records, stats.duplicates, stats.producer_id, stats.producer_epoch, ranges)


def producer_config(options: WriteOptions) -> ProducerConfig:
    return ProducerConfig(
        idempotent=True,
        linger_ms=options.linger_ms,
        request_timeout_ms=int(options.request_timeout_s * 1000),
    )


def write_rows(options: WriteOptions, columns: WriteColumns, rows: Iterator[Row]) -> WriteSummary:
    """Send every row through one idempotent producer; return when all are acknowledged."""
    with (
        BrokerSession(options.bootstrap, options.request_timeout_s) as session,
        session.producer(producer_config(options)) as sender,
    ):
        for row in rows:
            sender.add(columns.record(row))
        return WriteSummary.of(sender.finish())


def task_txn_id(prefix: str, task: int, query_id: str | None = None) -> str:
    """A task's transactional id: `prefix/task`, a stream's `prefix/query id/task`."""
    return f"{prefix}/{task}" if query_id is None else f"{prefix}/{query_id}/{task}"


def write_in_txn(
    options: WriteOptions,
    columns: WriteColumns,
    rows: Iterator[Row],
    context: TaskContext,
    micro_batch: tuple[str, int] | None,
) -> WriteSummary:
    """Send the task's rows as one transaction and prepare it, for the driver to commit
    (module docstring); a stream's `micro_batch` (query id, batch id) is recorded in it, and
    skipped when a committed one holds it already."""
    assert options.txn_prefix is not None
    query_id = None if micro_batch is None else micro_batch[0]
    txn_id = task_txn_id(options.txn_prefix, context.partitionId(), query_id)
    config = replace(producer_config(options), transaction_timeout_ms=options.txn_timeout_ms)
    with (
        BrokerSession(options.bootstrap, options.request_timeout_s) as session,
        session.transactional_producer(txn_id, config) as sender,
    ):
        if micro_batch is not None and sender.committed_through() >= micro_batch[1]:
            return WriteSummary.of(sender.stats)  # a run of it committed: nothing again
        sender.begin()
        for row in rows:
            sender.add(columns.record(row))
        stats = sender.finish()
        if micro_batch is not None:
            sender.mark(micro_batch[1])
        prepared = sender.prepare()
    return replace(WriteSummary.of(stats), prepared=(prepared[0], prepared[1], prepared[2]))


def end_transactions(
    options: WriteOptions, messages: list[WriterCommitMessage | None], *, commit: bool
) -> None:
    """The driver's end of a transactional write: commit every task's prepared transaction,
    or abort what each task's id has open (a failed task's, prepared or not)."""
    summaries = [m for m in messages if isinstance(m, WriteSummary)]
    prepared = [PreparedTxn(*m.prepared) for m in summaries if m.prepared is not None]
    with BrokerSession(options.bootstrap, options.request_timeout_s) as session:
        if commit:
            session.end_prepared(prepared, commit=True)
            return
        assert options.txn_prefix is not None
        ids = {txn_id for txn_id, _pid, _epoch in prepared}
        if options.fence is None:  # a batch job: every task's id is known
            ids |= {task_txn_id(options.txn_prefix, i) for i in range(len(messages))}
        session.abort_open(sorted(ids))


class BatchWriter(DataSourceWriter):
    def __init__(self, options: WriteOptions, columns: WriteColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[Row]) -> WriteSummary | FencedSummary:
        if self.options.txn_prefix is not None:
            return write_in_txn(
                self.options, self.columns, iterator, _task_context(), self.options.fence
            )
        if self.options.fence is not None:  # one micro-batch of a stream (foreachBatch)
            writer = _task_context().partitionId()
            return write_fenced(self.options, self.columns, iterator, self.options.fence, writer)
        return write_rows(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Transactional writes: every task's transaction committed. Otherwise nothing to
        do: every record was committed by Raft when it was acknowledged."""
        if self.options.txn_prefix is not None:
            end_transactions(self.options, messages, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Transactional writes: every task's transaction aborted. Otherwise nothing to
        undo: acknowledged records stay (see the module's guarantee)."""
        if self.options.txn_prefix is not None:
            end_transactions(self.options, messages, commit=False)


@dataclass
class FencedSummary(WriterCommitMessage):
    """What one streaming task did: rows appended now, rows an earlier run had appended."""

    sink: str
    writer: int
    batch_id: int
    appended: int
    replayed: int
    parts: int


def micro_batch_of(context: TaskContext) -> tuple[str, int]:
    """(query id, batch id) of the micro-batch this task belongs to."""
    batch_id, sink = (context.getLocalProperty(p) for p in (BATCH_ID_PROPERTY, QUERY_ID_PROPERTY))
    if batch_id is None or sink is None:
        raise RuntimeError("a streaming write outside a micro-batch: no batch id or query id")
    return sink, int(batch_id)


def write_fenced(
    options: WriteOptions,
    columns: WriteColumns,
    rows: Iterator[Row],
    fence: tuple[str, int],
    writer: int,
) -> FencedSummary:
    """Write the task's rows as writer `writer` of batch `fence`, fenced (module docstring)."""
    sink, batch_id = fence
    records = [_sink_record(columns, row) for row in rows]
    with BrokerSession(options.bootstrap, options.request_timeout_s) as session:
        client = session.client
        config = FencedWriterConfig(request_timeout_s=options.request_timeout_s)
        fenced = FencedWriter(client.cluster, sink, writer, config)
        # As long as the parts may take to ride out failovers, and a little more.
        report = client.call(fenced.write(batch_id, records), config.delivery_timeout_s + 10)
    return FencedSummary(
        sink, writer, batch_id, report.appended_records, report.replayed_records, report.parts
    )


def fenced_foreach_batch(
    bootstrap: str, topic: str | None = None, **options: str
) -> Callable[[DataFrame, int], None]:
    """A `foreachBatch` function that writes each micro-batch with fenced writes.

    For output modes the streaming sink cannot take (update: a Python data source sink only
    appends): the same exactly-once guarantee, with the micro-batch's id from Spark and the
    query id (from the driver's local properties, as the streaming sink gets it) as the sink.
    """

    def write(batch: DataFrame, batch_id: int) -> None:
        context = batch.sparkSession.sparkContext
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        if query_id is None:
            raise RuntimeError("fenced_foreach_batch runs inside a streaming query's foreachBatch")
        writer = batch.write.format(FORMAT).option(BOOTSTRAP, bootstrap).options(**options)
        if topic is not None:
            writer = writer.option("topic", topic)
        writer.option(FENCE_SINK, query_id).option(FENCE_BATCH, str(batch_id)).mode("append").save()

    return write


def _sink_record(columns: WriteColumns, row: Row) -> SinkRecord:
    r = columns.record(row)
    return SinkRecord(r.topic, r.key, r.value, r.partition, r.headers)


class StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: WriteOptions, columns: WriteColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[Row]) -> FencedSummary | WriteSummary:
        context = _task_context()
        if self.options.txn_prefix is not None:
            batch = micro_batch_of(context)
            return write_in_txn(self.options, self.columns, iterator, context, batch)
        return write_fenced(
            self.options, self.columns, iterator, micro_batch_of(context), context.partitionId()
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803, ARG002
        """Transactional writes: every task's transaction committed (with the batch's
        marker). Fenced ones: nothing to do, every part was committed with its fence."""
        if self.options.txn_prefix is not None:
            end_transactions(self.options, messages, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803, ARG002
        """Transactional writes: the prepared transactions aborted (a failed task's open one
        is aborted by its id's next run, or its timeout). Fenced ones: nothing to undo,
        appended parts stay and their fences make a rerun skip them."""
        if self.options.txn_prefix is not None:
            end_transactions(self.options, messages, commit=False)


def _task_context() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a writer's write() runs in a Spark task")
    return context
