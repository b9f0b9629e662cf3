"""Rows in and out: the read schema, records to Arrow batches, and rows to records to send.

Role: the one place that knows the connector's columns. The read schema is the Kafka
connector's (key, value, topic, partition, offset, timestamp, timestampType, optional headers)
plus `producerId`, `producerEpoch` and `sequence`, which let a job prove exactly-once: an
idempotent producer's (producerId, producerEpoch, sequence) names one record for good (a
transactional producer's new epoch starts its sequences at 0 again).

Rules:
- A read yields PyArrow record batches built column by column, against the exact Arrow schema
  Spark expects (`to_arrow_schema(schema, timezone="UTC")`): no per-row Python conversion.
- A write accepts the Kafka connector's columns (`topic`, `key`, `value`, `partition`,
  `headers`); `value` is required; key and value may be binary or string (UTF-8). A column it
  does not know is refused, so a misspelt `vaule` is an error and not lost data.
- `producerId`, `producerEpoch` and `sequence` are -1 for a record written without an
  idempotent producer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cluster.client import ConsumedRecord
from pipeline.broker import OutgoingRecord
from pipeline.options import OptionError

CREATE_TIME = 0  # Kafka's timestampType: the producer's timestamp, not the log append time
HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def read_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    fields += [
        StructField("producerId", LongType()),
        StructField("producerEpoch", IntegerType()),
        StructField("sequence", IntegerType()),
    ]
    return StructType(fields)


Column = Callable[[Sequence[ConsumedRecord]], list[Any]]

_COLUMNS: dict[str, Column] = {
    "key": lambda rs: [r.key for r in rs],
    "value": lambda rs: [r.value for r in rs],
    "topic": lambda rs: [r.topic for r in rs],
    "partition": lambda rs: [r.partition for r in rs],
    "offset": lambda rs: [r.offset for r in rs],
    "timestamp": lambda rs: [r.timestamp_ms * 1000 for r in rs],  # Arrow's unit here is us
    "timestampType": lambda rs: [CREATE_TIME] * len(rs),
    "headers": lambda rs: [[{"key": k, "value": v} for k, v in r.headers] for r in rs],
    "producerId": lambda rs: [r.producer_id for r in rs],
    "producerEpoch": lambda rs: [r.producer_epoch for r in rs],
    "sequence": lambda rs: [r.sequence for r in rs],
}


def check_read_schema(schema: StructType) -> None:
    """A schema the user gave may select and reorder our columns, not invent new ones."""
    full = read_schema(include_headers=True)
    for f in schema.fields:
        if f.name not in _COLUMNS:
            raise OptionError(f"column '{f.name}' is not one this source reads: {full.names}")
        expected = full[f.name].dataType
        if f.dataType != expected:
            raise OptionError(f"column '{f.name}' must be {expected.simpleString()}")


def arrow_schema(schema: StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC")


def to_arrow(records: Sequence[ConsumedRecord], schema: pa.Schema) -> pa.RecordBatch:
    arrays = [pa.array(_COLUMNS[f.name](records), type=f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- writing -----------------------------------------------------------------------------------

_BYTES_OR_TEXT = (BinaryType(), StringType())


@dataclass(frozen=True, slots=True)
class WriteColumns:
    """Where each known column is in an input row (-1: absent), fixed on the driver."""

    topic: int
    key: int
    value: int
    partition: int
    headers: int
    default_topic: str | None

    @classmethod
    def of(cls, schema: StructType, topic_option: str | None) -> WriteColumns:
        names = schema.names
        unknown = [n for n in names if n not in ("topic", "key", "value", "partition", "headers")]
        if unknown:
            raise OptionError(
                f"cannot write column(s) {unknown}: a row has topic, key, value (required), "
                "partition and headers"
            )
        if "value" not in names:
            raise OptionError("a 'value' column (binary or string) is required to write")
        if topic_option is None and "topic" not in names:
            raise OptionError("give the topic: the 'topic' option or a 'topic' column")
        for name, allowed in (
            ("topic", (StringType(),)),
            ("key", _BYTES_OR_TEXT),
            ("value", _BYTES_OR_TEXT),
            ("partition", (IntegerType(), LongType())),
        ):
            _check_type(schema, name, allowed)
        if "headers" in names:
            _check_headers(schema["headers"].dataType)

        def at(name: str) -> int:
            return names.index(name) if name in names else -1

        return cls(
            at("topic"), at("key"), at("value"), at("partition"), at("headers"), topic_option
        )

    def record(self, row: Sequence[Any]) -> OutgoingRecord:
        """One input row as a record to send; the `topic` option overrides the column."""
        topic = self.default_topic or (row[self.topic] if self.topic >= 0 else None)
        if not topic:
            raise ValueError(
                f"a row has no topic (null 'topic' column and no 'topic' option): {row}"
            )
        partition = row[self.partition] if self.partition >= 0 else None
        return OutgoingRecord(
            topic,
            _bytes(row[self.value]),
            _bytes(row[self.key]) if self.key >= 0 else None,
            int(partition) if partition is not None else None,
            _headers(row[self.headers]) if self.headers >= 0 else (),
        )


def _check_type(schema: StructType, name: str, allowed: tuple[DataType, ...]) -> None:
    if name in schema.names and schema[name].dataType not in allowed:
        kinds = " or ".join(t.simpleString() for t in allowed)
        raise OptionError(
            f"column '{name}' must be {kinds}, not {schema[name].dataType.simpleString()}"
        )


def _check_headers(data_type: DataType) -> None:
    element = data_type.elementType if isinstance(data_type, ArrayType) else None
    ok = (
        isinstance(element, StructType)
        and element.names == ["key", "value"]
        and element["key"].dataType == StringType()
        and element["value"].dataType in _BYTES_OR_TEXT
    )
    if not ok:
        raise OptionError(
            "column 'headers' must be array<struct<key:string,value:binary>>, "
            f"not {data_type.simpleString()}"
        )


def _bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"expected bytes or str, got {type(value).__name__}")


def _headers(value: Sequence[Sequence[Any]] | None) -> tuple[tuple[str, bytes], ...]:
    if not value:
        return ()
    return tuple((str(k), _bytes(v) or b"") for k, v in value)
