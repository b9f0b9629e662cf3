"""The producer's bound on a batch's size: its estimate of a record is never below the record's
encoding, so a batch it seals never passes batch_bytes_max, and a record too large for a batch
of its own is refused with MESSAGE_TOO_LARGE naming its size and the limit."""

from __future__ import annotations

import pytest

from cluster.client import Client, Producer, ProducerConfig
from cluster.client.batches import BATCH_BODY_BYTES_MAX, record_bytes, too_large
from statemachine.errors import ErrorCode
from statemachine.limits import DEFAULT_LIMITS
from statemachine.records import HEADER_BYTES, INT64_MAX, Record, RecordBatch

RECORDS = [
    Record(None, None, 0),
    Record(b"", b"", INT64_MAX),
    Record(b"k" * 70_000, b"v" * 70_000, 1),
    Record(b"k", b"v", 1, tuple((f"h{i}é", b"x" * i) for i in range(64))),
]


@pytest.mark.parametrize("record", RECORDS)
def test_the_estimate_is_never_below_the_encoding(record: Record) -> None:
    batch = RecordBatch(1, 0, 0, (record,) * 3).encode()
    body_array_head = 1  # three records: a fixarray
    assert len(batch) - HEADER_BYTES - body_array_head <= 3 * record_bytes(record)


def test_a_record_that_fits_alone_is_accepted_and_one_that_does_not_is_refused() -> None:
    fits = Record(None, b"v" * (BATCH_BODY_BYTES_MAX - 64), 1)
    assert too_large(fits) is None
    RecordBatch(1, 0, 0, (fits,)).encode()
    refused = too_large(Record(None, b"v" * DEFAULT_LIMITS.batch_bytes_max, 1))
    assert refused is not None
    assert refused.error == ErrorCode.MESSAGE_TOO_LARGE
    assert "a record of 1,048,576 bytes" in refused.message
    assert "batch_bytes_max is 1,048,576 bytes (1 MiB)" in refused.message


@pytest.mark.asyncio
async def test_an_error_in_a_producer_block_propagates_as_raised() -> None:
    """Not wrapped in an ExceptionGroup by the producer's task group."""
    cluster = Client(["127.0.0.1:1"])  # never dialled: a non-idempotent producer sends nothing
    try:
        with pytest.raises(KeyError, match="as raised"):
            async with Producer(cluster, ProducerConfig(idempotent=False)):
                raise KeyError("as raised")
    finally:
        await cluster.close()
