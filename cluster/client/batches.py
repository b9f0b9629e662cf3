"""Record batches on the client: what a producer's record takes in a batch, and reading what a
consumer fetched (its cost per record).

Role: size records for the producers' batches (`record_bytes`, `too_large`) and pick a key's
partition (`stable_partition`); turn a fetched batch (Kafka's record batch v2,
`statemachine/records.py`) into `Record`s. The one user of aiokafka: its record reader is C
(Cython), several times faster per record than any Python loop (bench/RESULTS.md: the consume
scenario), and reads exactly the format Kafka's clients write.
`statemachine.records.decode_records` stays the reference reader, in Python, and reads
compressed batches here, because it bounds what they inflate to
(`StateLimits.decompressed_batch_bytes_max`) and aiokafka does not.

Rules: the header and CRC-32C are checked first (`verify_batch`); whatever the reader raises on
a malformed record is a `BatchFormatError`, as the reference reader's failures are; a batch
yields exactly the records its header counts.
"""

from __future__ import annotations

import zlib

from aiokafka.record.default_records import DefaultRecordBatch

from cluster.client.errors import ClientError
from statemachine.errors import ErrorCode
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.records import (
    COMPRESSION_MASK,
    HEADER_BYTES,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchFormatError,
    BatchHeader,
    Record,
    RecordBatch,
    decode_records,
    verify_batch,
)

_new_record = tuple.__new__  # Record's own __new__ is a Python function: skip its frame


def read_batch(
    data: bytes, limits: StateLimits = DEFAULT_LIMITS
) -> tuple[BatchHeader, tuple[Record, ...]]:
    """The verified header and the records of a stored batch; BatchFormatError if malformed."""
    header = verify_batch(data, limits)
    if header.attributes & COMPRESSION_MASK:
        return header, decode_records(data, limits)
    new = _new_record
    try:
        records = tuple(
            new(Record, (r.key, r.value, r.timestamp, tuple(r.headers)))
            for r in DefaultRecordBatch(data)
        )
    except Exception as exc:  # noqa: BLE001 - the C reader's own errors: a malformed record
        raise BatchFormatError(f"a record does not decode: {exc}") from None
    if len(records) != header.record_count:
        raise BatchFormatError("the records disagree with the header's count")
    return header, records


# A record's bytes in a batch beyond its key and value: its varints (length, timestamp delta,
# offset delta, key and value lengths, header count: at most 36 bytes) and its attributes byte.
RECORD_OVERHEAD_BYTES = 40
HEADER_OVERHEAD_BYTES = 10  # one header's two varint lengths
# What a batch's records may hold by that estimate: the limit less the batch header.
BATCH_BODY_BYTES_MAX = DEFAULT_LIMITS.batch_bytes_max - HEADER_BYTES


def record_bytes(record: Record) -> int:
    """A record's size in a batch, never less than its encoding (headers are rare)."""
    size = len(record.value or b"") + len(record.key or b"") + RECORD_OVERHEAD_BYTES
    for name, value in record.headers:
        size += len(name.encode()) + len(value or b"") + HEADER_OVERHEAD_BYTES
    return size


def too_large(record: Record) -> ClientError | None:
    """MESSAGE_TOO_LARGE if `record` cannot fit in a batch of its own; encodes it only when
    the estimate says it might not."""
    if record_bytes(record) <= BATCH_BODY_BYTES_MAX:
        return None
    try:
        RecordBatch(NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, (record,)).encode()
    except BatchFormatError:
        limit = DEFAULT_LIMITS.batch_bytes_max
        size = len(record.value or b"") + len(record.key or b"")
        return ClientError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"a record of {size:,} bytes does not fit in a batch: batch_bytes_max is "
            f"{limit:,} bytes ({limit // (1 << 20)} MiB), a cluster-wide limit",
        )
    return None


def stable_partition(key: bytes, partitions: int) -> int:
    """Key hashing that every process agrees on (not Python's salted hash())."""
    return zlib.crc32(key) % partitions
