"""The "raftbroker" PySpark data source: batch read, streaming read, and (in sink.py) writes.

Role: the Spark-facing classes. `RaftbrokerDataSource` parses and validates options on the
driver and hands out readers and writers; those are pickled to executors, so they hold only
frozen option records and open their `BrokerSession` inside `read()` / `write()`.

Rules:
- Batch read: `startingOffsets` (default earliest) and `endingOffsets` (default latest) are
  resolved to concrete offsets on the driver when partitions are planned; `endingOffsets` may
  not pass the committed end (an error, not a wait).
- Streaming read: an offset is `{"topic": {"partition": next offset}}` (pipeline.offsets). The
  end of a micro-batch is at most the committed end (LATEST is the high watermark), and
  `partitions(start, end)` depends on nothing else, so a micro-batch Spark replays after a
  restart reads exactly the same records. Nothing is committed to the broker: Spark's
  checkpoint is the consumer position, as with the Kafka connector.
- Admission control: the engine's read limit wins (ReadAllAvailable ignores the options);
  otherwise `maxOffsetsPerTrigger` caps a batch exactly and `minOffsetsPerTrigger` holds a
  batch back until enough records or `maxTriggerDelay` passed. `Trigger.AvailableNow` reads up
  to the committed end seen when the query started, in batches of `maxOffsetsPerTrigger`, and
  never waits for `minOffsetsPerTrigger`.
- A partition that appears mid-query is read from its log start; one that disappears is data
  loss (`failOnDataLoss`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pipeline import FORMAT
from pipeline.broker import BrokerSession, data_loss
from pipeline.offsets import (
    OffsetRange,
    Offsets,
    backlog,
    from_json,
    rate_limit,
    split_ranges,
    to_json,
)
from pipeline.options import (
    EARLIEST,
    LATEST,
    OptionError,
    ReadOptions,
    TopicPartition,
    option,
    parse_read_options,
    parse_write_options,
)
from pipeline.schema import WriteColumns, arrow_schema, check_read_schema, read_schema, to_arrow
from pipeline.sink import BatchWriter, StreamWriter


class RaftbrokerDataSource(DataSource):
    """`spark.read.format("raftbroker")`, `readStream`, and `df.write.format("raftbroker")`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        headers = (option(self.options, "includeHeaders") or "false").strip().lower() == "true"
        return read_schema(include_headers=headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        check_read_schema(schema)
        return BatchReader(parse_read_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        check_read_schema(schema)
        return StreamReader(parse_read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("save mode 'overwrite' is not allowed: a topic is only appended to")
        options = parse_write_options(self.options)
        return BatchWriter(options, WriteColumns.of(schema, options.topic))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        if overwrite:
            raise OptionError("output mode 'complete' is not allowed: a topic is only appended to")
        options = parse_write_options(self.options)
        return StreamWriter(options, WriteColumns.of(schema, options.topic))


class RangePartition(InputPartition):
    """One Spark partition: a half-open offset range of one topic-partition."""

    def __init__(self, offsets: OffsetRange) -> None:
        super().__init__(offsets)
        self.offsets = offsets


def read_range(
    options: ReadOptions, schema: StructType, r: OffsetRange
) -> Iterator[pa.RecordBatch]:
    """On an executor: the records of one range as Arrow batches, over a session of its own."""
    target = arrow_schema(schema)
    with BrokerSession(
        options.bootstrap, options.request_timeout_s, read_committed=options.read_committed
    ) as session:
        for records in session.read_range(r, fail_on_data_loss=options.fail_on_data_loss):
            yield to_arrow(records, target)


def read_partition(
    options: ReadOptions, schema: StructType, partition: InputPartition
) -> Iterator[pa.RecordBatch]:
    # With no partitions planned (nothing to read), Spark still runs one task, with a bare
    # InputPartition(None).
    if not isinstance(partition, RangePartition):
        return iter(())
    return read_range(options, schema, partition.offsets)


def _plan(options: ReadOptions, ranges: list[OffsetRange]) -> list[InputPartition]:
    return [RangePartition(r) for r in split_ranges(ranges, options.min_partitions)]


class BatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        with BrokerSession(
            options.bootstrap, options.request_timeout_s, read_committed=options.read_committed
        ) as session:
            tps = session.topic_partitions(options.subscription, must_exist=True)
            start = session.resolve(options.starting, tps, "startingOffsets")
            end = session.resolve(options.ending, tps, "endingOffsets")
            committed = session.list_offsets(tps, LATEST)
        return _plan(options, [_batch_range(tp, start[tp], end[tp], committed[tp]) for tp in tps])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.schema, partition)


def _batch_range(tp: TopicPartition, start: int, end: int, committed: int) -> OffsetRange:
    name = f"{tp[0]}-{tp[1]}"
    if end > committed:
        raise OptionError(
            f"endingOffsets {end} for {name} is past its committed end {committed} "
            "(use -1 or 'latest' for the committed end)"
        )
    if start > end:
        raise OptionError(f"startingOffsets {start} for {name} is after endingOffsets {end}")
    return OffsetRange(tp[0], tp[1], start, end)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over committed offsets. Lives in one driver-side process for the whole
    query, so it keeps one session (opened lazily, closed in `stop`) for its offset calls."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._session: BrokerSession | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow: read no further than this
        self._latest: Offsets | None = None
        self._last_batch_at = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_session"] = None  # a socket and a thread do not travel to executors
        return state

    def _broker(self) -> BrokerSession:
        if self._session is None:
            options = self.options
            self._session = BrokerSession(
                options.bootstrap, options.request_timeout_s, read_committed=options.read_committed
            )
            self._session.__enter__()
        return self._session

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        session = self._broker()
        tps = session.topic_partitions(self.options.subscription, must_exist=False)
        return to_json(session.resolve(self.options.starting, tps, "startingOffsets"))

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._committed_now()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        begin = from_json(start)
        latest = self._available(begin)
        self._latest = latest
        base = self._with_new_partitions(begin, latest)
        end = self._admit(base, latest, limit)
        return start if end is None else to_json(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = from_json(start)
        ranges = [
            OffsetRange(t, n, begin.get((t, n), EARLIEST), stop)
            for (t, n), stop in from_json(end).items()
        ]
        return _plan(self.options, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the broker keeps no consumer positions; Spark's checkpoint does."""

    def stop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # -- offsets -------------------------------------------------------------------------------

    def _committed_now(self) -> Offsets:
        session = self._broker()
        tps = session.topic_partitions(self.options.subscription, must_exist=False)
        return session.list_offsets(tps, LATEST)

    def _available(self, begin: Offsets) -> Offsets:
        """The committed end of every partition read, never behind `begin`, never past the
        AvailableNow target; a partition that vanished fails the query (failOnDataLoss)."""
        now = self._committed_now()
        if self._target is not None:
            now = {tp: min(end, self._target[tp]) for tp, end in now.items() if tp in self._target}
        gone = sorted(set(begin) - set(now))
        if gone and self.options.fail_on_data_loss:
            raise data_loss(f"partitions {gone} were being read and no longer exist")
        return {tp: max(end, begin.get(tp, end)) for tp, end in now.items()}

    def _with_new_partitions(self, begin: Offsets, latest: Offsets) -> Offsets:
        """`begin` plus the log start of each partition discovered since (read from there)."""
        new = [tp for tp in latest if tp not in begin]
        found = self._broker().list_offsets(new, EARLIEST) if new else {}
        return {tp: begin[tp] if tp in begin else found[tp] for tp in latest}

    def _admit(self, base: Offsets, latest: Offsets, limit: ReadLimit) -> Offsets | None:
        """The end of the next micro-batch, or None to run none yet (minOffsetsPerTrigger)."""
        if isinstance(limit, ReadAllAvailable):
            return latest
        options = self.options
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else None
        max_rows = max_rows or options.max_offsets_per_trigger
        min_rows = min_rows or options.min_offsets_per_trigger
        now = time.monotonic()
        waited_ms = (now - self._last_batch_at) * 1000
        holding = self._target is None and waited_ms < options.max_trigger_delay_ms
        if min_rows and holding and backlog(base, latest) < min_rows:
            return None
        end = rate_limit(base, latest, max_rows) if max_rows else latest
        if end != base:
            self._last_batch_at = now
        return end
