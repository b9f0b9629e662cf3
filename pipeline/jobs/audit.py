"""The audit job: read a topic completely and prove (or refute) exactly-once delivery.

Per partition it reports the records, the duplicates by (producer id, epoch, sequence) (the same
record appended twice: what an idempotent producer makes impossible), the duplicates by an
optional business key (any Spark SQL expression over the read schema, e.g. `key` or
`get_json_object(CAST(value AS STRING), '$.event_id')`, which also catches a record sent twice
by a non-idempotent producer), gaps in each producer's sequences (a record lost between two
that arrived), and the producers seen. `AuditReport.clean` is the verdict.

Rules: one batch read from `earliest` to `latest` (the committed end at the start), so the
report describes one consistent prefix of the topic; all counting is done by Spark, only the
per-partition summary rows reach the driver.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812 - Spark's own idiom

from pipeline import FORMAT
from pipeline.options import BOOTSTRAP

SEQUENCE_SPACE = 2**31
PRODUCERS_LISTED_MAX = 20


@dataclass(frozen=True, slots=True)
class PartitionAudit:
    topic: str
    partition: int
    records: int
    first_offset: int
    last_offset: int
    duplicates_by_producer_sequence: int
    duplicates_by_business_key: int
    sequence_gaps: int
    missing_sequences: int
    non_idempotent_records: int
    producers: int
    producer_ids: tuple[int, ...]  # the first PRODUCERS_LISTED_MAX, ascending


@dataclass(frozen=True, slots=True)
class AuditReport:
    topic: str
    business_key: str | None
    partitions: tuple[PartitionAudit, ...]

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def clean(self) -> bool:
        return not any(
            p.duplicates_by_producer_sequence or p.duplicates_by_business_key or p.sequence_gaps
            for p in self.partitions
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "records": self.records, "clean": self.clean}


def read_topic(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    return (
        spark.read.format(FORMAT)
        .option(BOOTSTRAP, bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )


def audit(
    spark: SparkSession, bootstrap: str, topic: str, business_key: str | None = None
) -> AuditReport:
    records = read_topic(spark, bootstrap, topic)
    if business_key is not None:
        records = records.withColumn("_business_key", F.expr(business_key))
    records = records.cache()
    try:
        rows = _per_partition(records, business_key is not None).collect()
    finally:
        records.unpersist()
    partitions = tuple(
        sorted((_partition_audit(topic, r) for r in rows), key=lambda p: p.partition)
    )
    return AuditReport(topic, business_key, partitions)


def _per_partition(records: DataFrame, keyed: bool) -> DataFrame:
    basics = records.groupBy("partition").agg(
        F.count("*").alias("records"),
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
        F.sum(F.when(F.col("producerId") < 0, 1).otherwise(0)).alias("non_idempotent_records"),
        F.countDistinct(F.when(F.col("producerId") >= 0, F.col("producerId"))).alias("producers"),
        F.sort_array(F.collect_set(F.when(F.col("producerId") >= 0, F.col("producerId")))).alias(
            "producer_ids"
        ),
    )
    idempotent = records.where(F.col("producerId") >= 0)
    joined = basics.join(
        _surplus(idempotent, ["producerId", "producerEpoch", "sequence"], "pid_dups"),
        "partition",
        "left",
    ).join(_gaps(idempotent), "partition", "left")
    if keyed:
        joined = joined.join(_surplus(records, ["_business_key"], "key_dups"), "partition", "left")
    else:
        joined = joined.withColumn("key_dups", F.lit(0))
    return joined.fillna(0, ["pid_dups", "key_dups", "gaps", "missing"])


def _surplus(records: DataFrame, columns: list[str], name: str) -> DataFrame:
    """Per partition: how many records repeat an earlier one's `columns` (count - 1 each)."""
    counted = records.groupBy("partition", *columns).count().where(F.col("count") > 1)
    return counted.groupBy("partition").agg(F.sum(F.col("count") - 1).alias(name))


def _gaps(records: DataFrame) -> DataFrame:
    """Per partition: places where a producer's next record skips sequences, and how many.

    Consecutive records of one producer session (id and epoch, by offset) must have consecutive
    sequences (mod 2^31); a repeat is a duplicate, not a gap.
    """
    order = Window.partitionBy("partition", "producerId", "producerEpoch").orderBy("offset")
    previous = F.lag("sequence").over(order)
    step = (F.col("sequence") - F.col("previous") + SEQUENCE_SPACE) % SEQUENCE_SPACE
    gapped = (
        records.withColumn("previous", previous)
        .where(F.col("previous").isNotNull())
        .withColumn("step", step)
        .where(F.col("step") > 1)
    )
    return gapped.groupBy("partition").agg(
        F.count("*").alias("gaps"), F.sum(F.col("step") - 1).alias("missing")
    )


def _partition_audit(topic: str, row: Any) -> PartitionAudit:
    return PartitionAudit(
        topic=topic,
        partition=int(row["partition"]),
        records=int(row["records"]),
        first_offset=int(row["first_offset"]),
        last_offset=int(row["last_offset"]),
        duplicates_by_producer_sequence=int(row["pid_dups"]),
        duplicates_by_business_key=int(row["key_dups"]),
        sequence_gaps=int(row["gaps"]),
        missing_sequences=int(row["missing"]),
        non_idempotent_records=int(row["non_idempotent_records"]),
        producers=int(row["producers"]),
        producer_ids=tuple(int(p) for p in row["producer_ids"][:PRODUCERS_LISTED_MAX]),
    )
