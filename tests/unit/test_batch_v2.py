"""Record batch v2 against an independent implementation: kafka-python's record codec.

Our encoder's bytes must read back in kafka-python exactly (offsets, keys, values, headers,
timestamps, producer fields, CRC-32C), and batches kafka-python builds (uncompressed and gzip,
the codecs it has without optional packages) must decode here to the same records. The other
codecs are covered end to end by librdkafka in the Kafka-client tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from cluster.client.batches import read_batch
from statemachine.compression import COMPRESSION_GZIP
from statemachine.limits import StateLimits
from statemachine.records import (
    HEADER_BYTES,
    BatchFormatError,
    Record,
    RecordBatch,
    decode_records,
    verify_batch,
    with_base_offset,
)

T = TypeVar("T")

RECORDS = (
    Record(b"key-0", b"value-0", 1_700_000_000_000, (("trace", b"\x00\x01"), ("none", None))),
    Record(None, b"v" * 300, 1_700_000_000_250),  # a two-byte length varint
    Record(b"", None, 1_699_999_999_000),  # an earlier timestamp: a negative delta
    Record(b"k" * 20_000, b"", 1_700_000_000_000),  # a three-byte length varint
)


def test_our_batches_read_back_in_kafka_python() -> None:
    data = with_base_offset(RecordBatch(4_711, 3, 2_147_483_646, RECORDS).encode(), 1_000)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    assert (theirs.base_offset, theirs.producer_id, theirs.producer_epoch) == (1_000, 4_711, 3)
    assert (theirs.base_sequence, theirs.compression_type) == (2_147_483_646, 0)
    read = list(theirs)
    assert [r.offset for r in read] == [1_000, 1_001, 1_002, 1_003]
    assert [(r.key, r.value, r.timestamp) for r in read] == [
        (r.key, r.value, r.timestamp_ms) for r in RECORDS
    ]
    assert [tuple(r.headers) for r in read] == [r.headers for r in RECORDS]


@pytest.mark.parametrize("codec", [0, COMPRESSION_GZIP])
def test_kafka_python_batches_decode_here(codec: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=9,
        producer_epoch=1,
        base_sequence=40,
        batch_size=1 << 20,
    )
    for i, r in enumerate(RECORDS):
        builder.append(i, timestamp=r.timestamp_ms, key=r.key, value=r.value, headers=r.headers)
    data = bytes(builder.build())
    header = verify_batch(data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 1, 40)
    assert (header.attributes, header.record_count) == (codec, len(RECORDS))
    assert decode_records(data) == RECORDS
    assert RecordBatch.decode(data).records == RECORDS


def test_a_compressed_batch_that_inflates_past_the_bound_is_refused() -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=COMPRESSION_GZIP,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(0, timestamp=1, key=None, value=b"\x00" * 900_000, headers=[])
    data = bytes(builder.build())
    assert len(data) < 5_000  # a bomb in miniature: 900 kB of zeros in a few kB
    limits = StateLimits(decompressed_batch_bytes_max=500_000)
    with pytest.raises(BatchFormatError, match="within 500000 bytes"):
        decode_records(data, limits)
    assert decode_records(data)[0].value == b"\x00" * 900_000  # the default bound takes it


def test_records_that_do_not_decompress_are_refused() -> None:
    data = bytearray(RecordBatch(-1, -1, -1, RECORDS).encode())
    data[22] = COMPRESSION_GZIP  # say gzip over records that are not
    forged = bytes(data[:17]) + _crc(bytes(data[21:])) + bytes(data[21:])
    verify_batch(forged)
    with pytest.raises(BatchFormatError, match="gzip"):
        decode_records(forged)


def _crc(covered: bytes) -> bytes:
    return crc32c(covered).to_bytes(4, "big")


def test_the_fast_reader_agrees_with_the_reference_on_mutated_records() -> None:
    """The consumer's C reader (aiokafka's, through cluster/client/batches.py) against the
    reference reader on batches whose record bytes are mutated under a correct CRC: each
    refuses with BatchFormatError only, and where both read a batch they read the same records.
    (Either may be the stricter: the reference refuses a length below -1, the C reader a header
    name that is not UTF-8 only when it reads it.)"""
    rng = random.Random(21)
    good = bytearray(RecordBatch(7, 0, 0, RECORDS[:3]).encode())
    both_read = 0
    for _ in range(2_000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(HEADER_BYTES, len(data))] = rng.randrange(256)
        forged = bytes(data[:17]) + _crc(bytes(data[21:])) + bytes(data[21:])
        expected, read = _or_none(decode_records, forged), _or_none(read_batch, forged)
        if expected is not None and read is not None:
            assert read[1] == expected
            both_read += 1
    assert both_read > 200, "the mutations must leave many batches readable to compare"


def _or_none(reader: Callable[[bytes], T], data: bytes) -> T | None:
    try:
        return reader(data)
    except BatchFormatError:
        return None


def test_a_record_timestamp_past_int64_is_refused() -> None:
    """A base timestamp and a record's delta whose sum passes int64 (Hypothesis found one):
    the reader refused a negative sum but handed this one on, and the batch it read could not
    be written again. It is refused as every other inconsistent record is."""
    records = (Record(None, b"a", 0), Record(None, b"b", 2**62))
    batch = bytearray(RecordBatch(-1, -1, -1, records).encode())
    base_timestamp_at = 27  # base offset 8, length 4, leader epoch 4, magic 1, CRC 4, attrs 2, ...
    batch[base_timestamp_at : base_timestamp_at + 8] = (2**63 - 2**61).to_bytes(8, "big")
    batch[17:21] = crc32c(bytes(batch[21:])).to_bytes(4, "big")
    with pytest.raises(BatchFormatError, match="length or timestamp"):
        RecordBatch.decode(bytes(batch))
