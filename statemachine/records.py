"""Records and record batches, and their one encoding.

A batch is the unit of replication, deduplication and storage: producers send batches, apply
validates a batch against the producer table, storage appends it whole. Its encoding is a fixed
binary header followed by a msgpack body of records:

    magic u8 | crc u32 | attributes i16 | producer_id i64 | producer_epoch i16
    | base_sequence i32 | record_count i32 | max_timestamp_ms i64 | body

The CRC (CRC-32 of zlib) covers every byte after the crc field. Apply reads only the header
(`read_header`, one `struct` call), so the cost of a batch in apply does not grow with its
records; the leader checks the CRC and the body once at the edge (`verify_batch`) before the
batch enters the log, and storage checks the CRC again on recovery.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from statemachine.codec import CodecError, pack, unpack
from statemachine.limits import DEFAULT_LIMITS, StateLimits

BATCH_MAGIC = 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
PRODUCER_EPOCH_MAX = 32_767
SEQUENCE_MODULUS = 2**31  # sequences run 0 .. 2^31-1, then wrap to 0
INT64_MAX = 2**63 - 1

_HEADER = struct.Struct(">BIhqhiiq")
_MAGIC_AND_CRC = struct.Struct(">BI")
_COVERED = struct.Struct(">hqhiiq")  # BatchHeader's fields: the rest of the header
HEADER_BYTES = _HEADER.size
_CRC_END = _MAGIC_AND_CRC.size  # the CRC covers everything from here on
assert _CRC_END + _COVERED.size == HEADER_BYTES


class BatchFormatError(ValueError):
    """A batch whose bytes are not a valid encoding: rejected at the edge or in apply."""


def last_sequence(base_sequence: int, record_count: int) -> int:
    """The sequence of the last record of a batch, wrapping past 2^31-1 to 0."""
    return (base_sequence + record_count - 1) % SEQUENCE_MODULUS


def next_sequence(sequence: int) -> int:
    """The sequence that must follow `sequence` in the same epoch."""
    return (sequence + 1) % SEQUENCE_MODULUS


class Record(NamedTuple):
    """One message: optional key and value, string-keyed headers, a producer timestamp.

    A NamedTuple: producers make one per record sent and consumers one per record read, and a
    frozen dataclass's __init__ costs several times as much."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()


class BatchHeader(NamedTuple):
    """The fixed-size head of an encoded batch: all that apply needs to see."""

    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    max_timestamp_ms: int

    @property
    def idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        return last_sequence(self.base_sequence, self.record_count)


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Records from one producer session, with the sequence of the first record."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[Record, ...]

    @property
    def record_count(self) -> int:
        return len(self.records)

    @property
    def max_timestamp_ms(self) -> int:
        return max(r.timestamp_ms for r in self.records)

    @property
    def last_sequence(self) -> int:
        return last_sequence(self.base_sequence, self.record_count)

    def encode(self) -> bytes:
        """The batch's bytes, CRC included; raises BatchFormatError for an invalid batch."""
        records = self.records
        if not records:
            raise BatchFormatError("a batch holds at least one record")
        for r in records:  # refuse here what verify_batch would refuse at the leader
            _check_record(r.timestamp_ms, r.key, r.value, r.headers, DEFAULT_LIMITS)
        try:
            body = pack([[r.timestamp_ms, r.key, r.value, r.headers] for r in records])
        except CodecError as exc:  # e.g. a header name that is not valid UTF-8
            raise BatchFormatError(str(exc)) from exc
        if len(body) + HEADER_BYTES > DEFAULT_LIMITS.batch_bytes_max:
            raise BatchFormatError(f"batch exceeds {DEFAULT_LIMITS.batch_bytes_max} bytes")
        header = BatchHeader(
            0,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.record_count,
            self.max_timestamp_ms,
        )
        _check_header(header, DEFAULT_LIMITS)
        covered = _COVERED.pack(*header)  # the header fields after the CRC, which covers them
        crc = zlib.crc32(body, zlib.crc32(covered))
        return _MAGIC_AND_CRC.pack(BATCH_MAGIC, crc) + covered + body

    @classmethod
    def decode(cls, data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> RecordBatch:
        """Decode and fully verify a batch (CRC, header, every record), decoding it once."""
        header, records = _verified(data, limits)
        return cls(header.producer_id, header.producer_epoch, header.base_sequence, records)


def _check_header(header: BatchHeader, limits: StateLimits) -> None:
    if header.attributes != 0:
        raise BatchFormatError(f"unsupported batch attributes {header.attributes}")
    if not 1 <= header.record_count <= limits.batch_records_max:
        raise BatchFormatError(f"record count {header.record_count} is out of range")
    if header.max_timestamp_ms < 0:
        raise BatchFormatError("timestamps must not be negative")
    if header.producer_id == NO_PRODUCER_ID:
        if (header.producer_epoch, header.base_sequence) != (NO_PRODUCER_EPOCH, NO_SEQUENCE):
            raise BatchFormatError("a batch without producer id has epoch and sequence -1")
        return
    if header.producer_id < 0:
        raise BatchFormatError(f"invalid producer id {header.producer_id}")
    if not 0 <= header.producer_epoch <= PRODUCER_EPOCH_MAX:
        raise BatchFormatError(f"invalid producer epoch {header.producer_epoch}")
    if not 0 <= header.base_sequence < SEQUENCE_MODULUS:
        raise BatchFormatError(f"invalid base sequence {header.base_sequence}")


_new_header = tuple.__new__  # BatchHeader's own __new__ is a Python function: skip its frame


def read_header(data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> BatchHeader:
    """Parse and range-check the header without touching the body or the CRC (apply's path).

    The length and magic checks, then `_check_header`'s in its order, on locals: one call.
    """
    size = len(data)
    if size > limits.batch_bytes_max:
        raise BatchFormatError(f"batch of {size} bytes exceeds {limits.batch_bytes_max}")
    if size < HEADER_BYTES:
        raise BatchFormatError(f"batch of {size} bytes is shorter than its header")
    fields = _HEADER.unpack_from(data)
    magic, _crc, attributes, producer_id, epoch, base_sequence, count, max_timestamp_ms = fields
    if magic != BATCH_MAGIC:
        raise BatchFormatError(f"unknown batch magic {magic}")
    if (
        attributes != 0
        or not 1 <= count <= limits.batch_records_max
        or max_timestamp_ms < 0
        or (
            producer_id == NO_PRODUCER_ID
            and (epoch != NO_PRODUCER_EPOCH or base_sequence != NO_SEQUENCE)
        )
        or (
            producer_id != NO_PRODUCER_ID
            and (
                producer_id < 0
                or not 0 <= epoch <= PRODUCER_EPOCH_MAX
                or not 0 <= base_sequence < SEQUENCE_MODULUS
            )
        )
    ):
        _check_header(BatchHeader(*fields[2:]), limits)  # raises, with the precise message
        raise AssertionError("unreachable")
    header: BatchHeader = _new_header(BatchHeader, fields[2:])
    return header


def verify_batch(data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> BatchHeader:
    """Everything the leader checks before a batch may enter the log."""
    return _verified(data, limits)[0]


def _verified(data: bytes, limits: StateLimits) -> tuple[BatchHeader, tuple[Record, ...]]:
    header = read_header(data, limits)
    crc = int.from_bytes(data[1:_CRC_END], "big")
    if zlib.crc32(memoryview(data)[_CRC_END:]) != crc:
        raise BatchFormatError("batch CRC mismatch")
    records = _decode_records(data, header, limits)
    if max(r.timestamp_ms for r in records) != header.max_timestamp_ms:
        raise BatchFormatError("header max timestamp disagrees with the records")
    return header, records


def decode_records(data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> tuple[Record, ...]:
    """The records of a batch already verified once (storage reads, consumers)."""
    return _decode_records(data, read_header(data, limits), limits)


def _decode_records(data: bytes, header: BatchHeader, limits: StateLimits) -> tuple[Record, ...]:
    try:
        raw = unpack(memoryview(data)[HEADER_BYTES:], size_max=limits.batch_bytes_max)
    except CodecError as exc:
        raise BatchFormatError(str(exc)) from exc
    if not isinstance(raw, tuple) or len(raw) != header.record_count:
        raise BatchFormatError("record count disagrees with the body")
    return tuple(_record(item, limits) for item in raw)


def _record(item: object, limits: StateLimits) -> Record:
    if not (isinstance(item, tuple) and len(item) == 4):
        raise BatchFormatError("a record is [timestamp_ms, key, value, headers]")
    timestamp_ms, key, value, headers = item
    _check_record(timestamp_ms, key, value, headers, limits)
    return Record(key, value, timestamp_ms, headers)


def _check_record(
    timestamp_ms: object, key: object, value: object, headers: object, limits: StateLimits
) -> None:
    if type(timestamp_ms) is not int or not 0 <= timestamp_ms <= INT64_MAX:
        raise BatchFormatError(f"invalid record timestamp {timestamp_ms!r}")
    if not (_is_optional_bytes(key) and _is_optional_bytes(value)):
        raise BatchFormatError("record key and value are bytes or null")
    if not isinstance(headers, tuple) or len(headers) > limits.record_headers_max:
        raise BatchFormatError("record headers are a bounded list")
    for header in headers:
        if not (
            isinstance(header, tuple)
            and len(header) == 2
            and isinstance(header[0], str)
            and isinstance(header[1], bytes)
        ):
            raise BatchFormatError("a record header is [str, bytes]")


def _is_optional_bytes(value: object) -> bool:
    return value is None or isinstance(value, bytes)
