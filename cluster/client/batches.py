"""Reading record batches on the client: the consumer's cost per record.

Role: turn a fetched batch (Kafka's record batch v2, `statemachine/records.py`) into `Record`s.
The one user of aiokafka: its record reader is C (Cython), several times faster per record than
any Python loop (bench/RESULTS.md: the consume scenario), and reads exactly the format Kafka's
clients write. `statemachine.records.decode_records` stays the reference reader, in Python, and
reads compressed batches here, because it bounds what they inflate to
(`StateLimits.decompressed_batch_bytes_max`) and aiokafka does not.

Rules: the header and CRC-32C are checked first (`verify_batch`); whatever the reader raises on
a malformed record is a `BatchFormatError`, as the reference reader's failures are; a batch
yields exactly the records its header counts.
"""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatch

from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.records import (
    COMPRESSION_MASK,
    BatchFormatError,
    BatchHeader,
    Record,
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
