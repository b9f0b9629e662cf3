"""The settlement_totals job: running per-merchant totals of settlement events.

Reads settlement events (pipeline/jobs/settlements.py) from a topic as a stream, drops events
whose `event_id` was seen before (within the watermark: a producer that was not idempotent, or
an upstream replay), and keeps per merchant the total in cents and the event count. Two sinks,
each its own query with its own checkpoint under `checkpoint/`:
- `totals` topic, through fenced writes (`pipeline.sink.fenced_foreach_batch`: a Python
  streaming sink only appends, and totals are updates): on each micro-batch the merchants whose
  totals changed, as JSON keyed by merchant id (the latest record per key is the current
  total); a replayed micro-batch adds nothing twice.
- `parquet` directory: the whole totals table, rewritten each micro-batch (complete mode via
  foreachBatch; a reader sees the last successful batch).

With `available_now` the job processes what is committed and stops (tests, backfills);
otherwise it runs until stopped.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own idiom
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipeline import FORMAT
from pipeline.options import BOOTSTRAP
from pipeline.sink import fenced_foreach_batch

EVENT = StructType(
    [
        StructField("event_id", StringType()),
        StructField("merchant_id", StringType()),
        StructField("amount_cents", LongType()),
        StructField("currency", StringType()),
        StructField("ts_ms", LongType()),
    ]
)
DEDUP_WATERMARK = "1 hour"


WAIT_STEP_S = 1  # how often (s) a run checks whether it was asked to stop


@dataclass(frozen=True, slots=True)
class TotalsJob:
    bootstrap: str
    source_topic: str
    totals_topic: str
    parquet_dir: Path
    checkpoint_dir: Path
    max_offsets_per_trigger: int | None = None
    available_now: bool = False
    trigger_interval: str = "5 seconds"


def totals(spark: SparkSession, job: TotalsJob) -> DataFrame:
    reader = (
        spark.readStream.format(FORMAT)
        .option(BOOTSTRAP, job.bootstrap)
        .option("subscribe", job.source_topic)
        .option("startingOffsets", "earliest")
    )
    if job.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(job.max_offsets_per_trigger))
    events = (
        reader.load()
        .select(F.from_json(F.col("value").cast("string"), EVENT).alias("e"), "timestamp")
        .select("e.*", "timestamp")
        .where(F.col("event_id").isNotNull() & F.col("merchant_id").isNotNull())
        .withWatermark("timestamp", DEDUP_WATERMARK)
        .dropDuplicatesWithinWatermark(["event_id"])
    )
    return events.groupBy("merchant_id").agg(
        F.sum("amount_cents").alias("total_cents"), F.count("*").alias("events")
    )


def replace_directory(new: Path, target: Path) -> None:
    """Put `new` where `target` is. A directory that is not empty cannot be replaced by one
    rename, so the old one steps aside first: the target is missing only between two renames."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def start(spark: SparkSession, job: TotalsJob) -> list[StreamingQuery]:
    table = totals(spark, job)
    to_topic = (
        table.select(
            F.col("merchant_id").alias("key"),
            F.to_json(F.struct("merchant_id", "total_cents", "events")).alias("value"),
        )
        .writeStream.outputMode("update")
        .foreachBatch(fenced_foreach_batch(job.bootstrap, job.totals_topic))
        .option("checkpointLocation", str(job.checkpoint_dir / "topic"))
    )
    parquet_dir = job.parquet_dir

    def rewrite_parquet(batch: DataFrame, _batch_id: int) -> None:
        # Written beside the table, then swapped in: a reader, or a run stopped mid-write,
        # finds the previous table or the new one, never a directory half rewritten.
        staging = parquet_dir.with_name(parquet_dir.name + ".next")
        batch.coalesce(1).write.mode("overwrite").parquet(str(staging))
        replace_directory(staging, parquet_dir)

    to_parquet = (
        table.writeStream.outputMode("complete")
        .foreachBatch(rewrite_parquet)
        .option("checkpointLocation", str(job.checkpoint_dir / "parquet"))
    )
    if job.available_now:
        return [w.trigger(availableNow=True).start() for w in (to_topic, to_parquet)]
    interval = job.trigger_interval
    return [w.trigger(processingTime=interval).start() for w in (to_topic, to_parquet)]


def run(
    spark: SparkSession,
    job: TotalsJob,
    timeout_s: float | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Start both queries and wait until they finish (available_now), one fails, `timeout_s`
    passes or `stop()` says so (Ctrl-C, which the caller turns into a flag: interrupting a call
    into Spark's JVM half way leaves py4j logging a traceback), then stop them."""
    queries = start(spark, job)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while any(q.isActive for q in queries) and not stop():
            if deadline is not None and time.monotonic() >= deadline:
                break
            for query in queries:
                query.awaitTermination(WAIT_STEP_S)
                error = query.exception()
                if error is not None:
                    raise RuntimeError(f"query {query.name or query.id} failed: {error}")
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
