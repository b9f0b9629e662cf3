"""Records and record batches in Kafka's record batch v2: the one format of the log.

A batch is the unit of replication, deduplication and storage: producers send batches (the
native client and every Kafka client alike), apply validates a batch against the producer
table, storage appends it whole, and Fetch (native or Kafka) hands the stored bytes back. The
encoding is Kafka's (magic 2, KIP-98), big-endian:

    base_offset i64 | batch_length i32 | partition_leader_epoch i32 | magic i8 = 2
    | crc u32 | attributes i16 | last_offset_delta i32 | base_timestamp i64
    | max_timestamp i64 | producer_id i64 | producer_epoch i16 | base_sequence i32
    | record_count i32 | records

`batch_length` counts the bytes after itself. The CRC is CRC-32C (Castagnoli) over every byte
from `attributes` on; it does not cover the first three fields, so storage assigns offsets by
patching `base_offset` (`with_base_offset`, which also sets the leader epoch; a writer
puts `stored_head` before the rest of the batch instead of copying it) without touching the
CRC, and relies on it for the rest of a stored batch (`stored_intact`). The low three bits of
`attributes` name the records' compression (none, gzip, snappy, lz4, zstd): a compressed batch
is stored as it came and decompressed only by readers (`decode_records`).

Each record: length varint | attributes i8 | timestamp_delta varlong | offset_delta varint |
key length varint (-1: null) | key | value length varint | value | header count varint |
per header: key length varint, UTF-8 key, value length varint (-1: null), value. Varints are
zigzag, as Kafka's.

Costs: apply reads only the header (`read_header`, one `struct` call). The leader checks, at
the edge, what Kafka's broker checks before a batch may enter the log (`verify_batch`: magic,
lengths, CRC-32C, the record count against `last_offset_delta`, the producer fields), without a
per-record step: the broker's cost of a batch does not grow with its records. Records are
decoded by readers, which check every record's framing (`decode_records`).

Attributes accepted from a producer: a compression codec 0..4, CreateTime, and the
transactional bit (with a producer id; statemachine/partition_txns.py decides whether the
batch's transaction is open). A control batch is refused (`UnsupportedBatchError`): markers
are the broker's to write (`seal_batch`, partition_txns.marker_batch); LogAppendTime (bit 3)
is a broker's choice, never a producer's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from statemachine.compression import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    CompressionError,
    decompressed,
)
from statemachine.limits import DEFAULT_LIMITS, StateLimits

BATCH_MAGIC = 2
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
PRODUCER_EPOCH_MAX = 32_767
SEQUENCE_MODULUS = 2**31  # sequences run 0 .. 2^31-1, then wrap to 0
INT64_MAX = 2**63 - 1

COMPRESSION_MASK = 0x07
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DATA_ATTRIBUTES = COMPRESSION_MASK | TRANSACTIONAL_BIT  # what a producer's batch may set

# base_offset, batch_length, partition_leader_epoch, magic, crc, attributes, last_offset_delta,
# base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, record_count
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES = _HEADER.size  # 61
# base_offset, batch_length, partition_leader_epoch, magic, crc
_HEAD = struct.Struct(">qiibI")
_LENGTH_END = 12  # batch_length counts every byte after this
_CRC_END = 21  # the CRC covers every byte from here on (attributes ...)
CRC_COVERED_FROM = _CRC_END
_COVERED = struct.Struct(">hiqqqhii")
assert _CRC_END + _COVERED.size == HEADER_BYTES


class BatchFormatError(ValueError):
    """A batch whose bytes are not a valid encoding: rejected at the edge or in apply
    (CORRUPT_MESSAGE)."""


class UnsupportedBatchError(BatchFormatError):
    """A well-formed batch of a kind this broker does not take yet (transactional or control
    batches): INVALID_RECORD at the edge."""


def last_sequence(base_sequence: int, record_count: int) -> int:
    """The sequence of the last record of a batch, wrapping past 2^31-1 to 0."""
    return (base_sequence + record_count - 1) % SEQUENCE_MODULUS


def next_sequence(sequence: int) -> int:
    """The sequence that must follow `sequence` in the same epoch."""
    return (sequence + 1) % SEQUENCE_MODULUS


class Record(NamedTuple):
    """One message: optional key and value, headers (a UTF-8 name and an optional value), a
    timestamp in ms.

    A NamedTuple: producers make one per record sent and consumers one per record read, and a
    frozen dataclass's __init__ costs several times as much."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


class BatchHeader(NamedTuple):
    """What apply needs to see of a batch: fields of its fixed-size head."""

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
        """The batch's bytes (uncompressed, base offset 0), CRC included; raises
        BatchFormatError for an invalid batch."""
        return encode_batch(self.producer_id, self.producer_epoch, self.base_sequence, self.records)

    @classmethod
    def decode(cls, data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> RecordBatch:
        """Decode and fully verify a batch (CRC, header, every record), decoding it once."""
        header = verify_batch(data, limits)
        records = decode_records(data, limits)
        return cls(header.producer_id, header.producer_epoch, header.base_sequence, records)


def encode_batch(
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    records: tuple[Record, ...],
    *,
    transactional: bool = False,
) -> bytes:
    """`RecordBatch(...).encode()` without the object: a producer seals its batches here."""
    if not records:
        raise BatchFormatError("a batch holds at least one record")
    base_timestamp = records[0].timestamp_ms
    count = len(records)
    max_timestamp_ms = base_timestamp if count == 1 else max(r.timestamp_ms for r in records)
    attributes = TRANSACTIONAL_BIT if transactional else COMPRESSION_NONE
    fields = (attributes, producer_id, producer_epoch, base_sequence, count, max_timestamp_ms)
    _check_fields(fields, DEFAULT_LIMITS)
    return seal_batch(fields, base_timestamp, b"".join(encode_records(records, base_timestamp)))


def seal_batch(
    fields: tuple[int, int, int, int, int, int], base_timestamp: int, body: bytes
) -> bytes:
    """A batch of records encoded as `body`, with a `BatchHeader`'s `fields` (checked by the
    caller), base offset 0 and its CRC-32C (encode_batch, and the broker's control batches)."""
    size = HEADER_BYTES + len(body)
    if size > DEFAULT_LIMITS.batch_bytes_max:
        raise BatchFormatError(f"batch exceeds {DEFAULT_LIMITS.batch_bytes_max} bytes")
    attributes, producer_id, producer_epoch, base_sequence, count, max_timestamp_ms = fields
    covered = _COVERED.pack(
        attributes,
        count - 1,
        base_timestamp,
        max_timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    crc = crc32c(body, crc32c(covered))
    head = _HEAD.pack(0, size - _LENGTH_END, NO_PARTITION_LEADER_EPOCH, BATCH_MAGIC, crc)
    return b"".join((head, covered, body))


def _check_header(header: BatchHeader, limits: StateLimits) -> None:
    attributes = header.attributes
    if attributes & CONTROL_BIT:
        raise UnsupportedBatchError("control batches are written by the broker, not sent to it")
    if attributes & ~DATA_ATTRIBUTES or attributes & COMPRESSION_MASK > COMPRESSION_ZSTD:
        raise BatchFormatError(f"unsupported batch attributes {attributes:#x}")
    if not 1 <= header.record_count <= limits.batch_records_max:
        raise BatchFormatError(f"record count {header.record_count} is out of range")
    if header.max_timestamp_ms < 0:
        raise BatchFormatError("timestamps must not be negative")
    if header.producer_id == NO_PRODUCER_ID:
        if (header.producer_epoch, header.base_sequence) != (NO_PRODUCER_EPOCH, NO_SEQUENCE):
            raise BatchFormatError("a batch without producer id has epoch and sequence -1")
        if attributes & TRANSACTIONAL_BIT:
            raise BatchFormatError("a transactional batch needs a producer id")
        return
    if header.producer_id < 0:
        raise BatchFormatError(f"invalid producer id {header.producer_id}")
    if not 0 <= header.producer_epoch <= PRODUCER_EPOCH_MAX:
        raise BatchFormatError(f"invalid producer epoch {header.producer_epoch}")
    if not 0 <= header.base_sequence < SEQUENCE_MODULUS:
        raise BatchFormatError(f"invalid base sequence {header.base_sequence}")


_new_header = tuple.__new__  # BatchHeader's own __new__ is a Python function: skip its frame


def read_header(data: bytes | memoryview, limits: StateLimits = DEFAULT_LIMITS) -> BatchHeader:
    """Parse and range-check the header without touching the records or the CRC (apply's path).

    The length and magic checks, then `_check_fields` on the unpacked fields.
    """
    size = len(data)
    if size > limits.batch_bytes_max:
        raise BatchFormatError(f"batch of {size} bytes exceeds {limits.batch_bytes_max}")
    if size < HEADER_BYTES:
        raise BatchFormatError(f"batch of {size} bytes is shorter than its header")
    (_, length, _, magic, _, attributes, last_delta, _, max_timestamp_ms,
     producer_id, epoch, base_sequence, count) = _HEADER.unpack_from(data)  # fmt: skip
    if magic != BATCH_MAGIC:
        raise BatchFormatError(f"unknown batch magic {magic}")
    if length != size - _LENGTH_END:
        raise BatchFormatError(f"batch length {length} disagrees with its {size} bytes")
    if last_delta != count - 1:
        raise BatchFormatError(f"record count {count} disagrees with last offset delta")
    fields = (attributes, producer_id, epoch, base_sequence, count, max_timestamp_ms)
    _check_fields(fields, limits)
    header: BatchHeader = _new_header(BatchHeader, fields)
    return header


def _check_fields(fields: tuple[int, int, int, int, int, int], limits: StateLimits) -> None:
    """`_check_header` on a header's fields, for the batch read and the batch written: the
    common header passes in one expression; any other goes to `_check_header`, which raises
    naming the rule it breaks. `fields` are a `BatchHeader`'s, in its order."""
    attributes, producer_id, epoch, base_sequence, count, max_timestamp_ms = fields
    if (
        attributes & ~DATA_ATTRIBUTES
        or attributes & COMPRESSION_MASK > COMPRESSION_ZSTD
        or not 1 <= count <= limits.batch_records_max
        or max_timestamp_ms < 0
        or (
            producer_id == NO_PRODUCER_ID
            and (
                epoch != NO_PRODUCER_EPOCH
                or base_sequence != NO_SEQUENCE
                or attributes & TRANSACTIONAL_BIT
            )
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
        _check_header(BatchHeader(*fields), limits)  # raises, with the precise message
        raise AssertionError("unreachable")


def verify_batch(data: bytes | memoryview, limits: StateLimits = DEFAULT_LIMITS) -> BatchHeader:
    """Everything the leader checks before a batch may enter the log: the header's fields,
    lengths and ranges (`read_header`) and the CRC-32C. Per batch, never per record."""
    header = read_header(data, limits)
    if not crc_holds(data):
        raise BatchFormatError("batch CRC mismatch")
    return header


def is_control_batch(data: bytes | memoryview) -> bool:
    """Whether a stored batch is a transaction marker, which readers skip (Kafka's consumers
    never hand one to the application)."""
    return len(data) >= HEADER_BYTES and bool(data[_CRC_END + 1] & CONTROL_BIT)


# A stored batch's attributes and producer id, from the attributes on (CRC_COVERED_FROM).
TXN_HEAD = struct.Struct(">h20xq")


def crc_holds(data: bytes | memoryview) -> bool:
    """Whether a batch's CRC-32C matches the bytes it covers (`verify_batch`, `stored_intact`)."""
    if len(data) < HEADER_BYTES:
        return False
    crc = int.from_bytes(data[17:_CRC_END], "big")
    return bool(crc32c(memoryview(data)[_CRC_END:]) == crc)


def stored_intact(data: bytes | memoryview) -> bool:
    """Whether a stored batch is whole and undamaged as far as its own fields tell: its length
    field counts exactly the bytes after it, and its CRC-32C holds (storage's recovery; the
    rest of its header was checked before it was stored)."""
    return (
        len(data) >= HEADER_BYTES
        and _HEAD.unpack_from(data)[1] == len(data) - _LENGTH_END
        and crc_holds(data)
    )


def with_base_offset(
    data: bytes, base_offset: int, leader_epoch: int = NO_PARTITION_LEADER_EPOCH
) -> bytes:
    """The batch as storage keeps it: its first record at `base_offset`, and as its partition
    leader epoch the term of the entry that appended it (a producer's value means nothing to a
    reader; -1, unknown, where none is given). The CRC covers neither field."""
    head = stored_head(data, base_offset, leader_epoch)
    if data[:STORED_HEAD_BYTES] == head:
        return data
    return head + data[STORED_HEAD_BYTES:]


def stored_head(
    data: bytes, base_offset: int, leader_epoch: int = NO_PARTITION_LEADER_EPOCH
) -> bytes:
    """The first `STORED_HEAD_BYTES` of `with_base_offset(data, base_offset, leader_epoch)`:
    what a writer puts before the rest of the batch as it is, with no copy of the whole."""
    length = _HEAD.unpack_from(data)[1]
    return _STORED_HEAD.pack(base_offset, length, leader_epoch)


_STORED_HEAD = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch
STORED_HEAD_BYTES = _STORED_HEAD.size


# -- records ---------------------------------------------------------------------------------


def _zigzag_bytes(value: int) -> bytes:
    """A zigzag varint (Kafka's varint and varlong)."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Varints of the small values that almost every length, delta and count is: a lookup.
_SMALL_MAX = 1 << 14
_SMALL = tuple(_zigzag_bytes(v) for v in range(_SMALL_MAX))
_NULL = _zigzag_bytes(-1)


def _varint(value: int) -> bytes:
    return _SMALL[value] if 0 <= value < _SMALL_MAX else _zigzag_bytes(value)


def _sized(value: bytes | None) -> bytes:
    if value is None:
        return _NULL
    return _varint(len(value)) + value


def encode_records(records: tuple[Record, ...], base_timestamp: int) -> list[bytes]:
    """Each record's bytes in a batch's body: offset deltas from 0, timestamps as deltas from
    `base_timestamp` (encode_batch, and the broker's control batches)."""
    parts: list[bytes] = []
    append = parts.append
    small, small_max = _SMALL, _SMALL_MAX
    for delta, (key, value, timestamp_ms, headers) in enumerate(records):
        # `_check_record`'s rules, at once for the common record (bytes or None, no
        # headers); it decides on any other, and says what is wrong with it.
        if not (
            type(timestamp_ms) is int
            and 0 <= timestamp_ms <= INT64_MAX
            and (key is None or type(key) is bytes)
            and (value is None or type(value) is bytes)
            and headers == ()
        ):
            _check_record(timestamp_ms, key, value, headers)
        ts = timestamp_ms - base_timestamp
        body = b"".join(
            (
                b"\x00",
                small[ts] if 0 <= ts < small_max else _zigzag_bytes(ts),
                small[delta] if delta < small_max else _zigzag_bytes(delta),
                _sized(key),
                _sized(value),
                _encode_headers(headers) if headers else b"\x00",
            )
        )
        append(_varint(len(body)))
        append(body)
    return parts


def _encode_headers(headers: tuple[tuple[str, bytes | None], ...]) -> bytes:
    parts = [_varint(len(headers))]
    for name, value in headers:
        parts.append(_sized(name.encode()))
        parts.append(_sized(value))
    return b"".join(parts)


def _check_record(timestamp_ms: object, key: object, value: object, headers: object) -> None:
    if type(timestamp_ms) is not int or not 0 <= timestamp_ms <= INT64_MAX:
        raise BatchFormatError(f"invalid record timestamp {timestamp_ms!r}")
    if not (_is_optional_bytes(key) and _is_optional_bytes(value)):
        raise BatchFormatError("record key and value are bytes or null")
    if not isinstance(headers, tuple) or len(headers) > DEFAULT_LIMITS.record_headers_max:
        raise BatchFormatError("record headers are a bounded tuple")
    for header in headers:
        if not (
            isinstance(header, tuple)
            and len(header) == 2
            and isinstance(header[0], str)
            and _is_optional_bytes(header[1])
        ):
            raise BatchFormatError("a record header is (str, bytes or None)")
        try:
            header[0].encode()
        except UnicodeEncodeError as exc:
            raise BatchFormatError(f"a header name is not valid UTF-8: {exc}") from None


def _is_optional_bytes(value: object) -> bool:
    return value is None or isinstance(value, bytes)


def decode_records(data: bytes, limits: StateLimits = DEFAULT_LIMITS) -> tuple[Record, ...]:
    """The records of a batch, every record's framing checked (storage reads, consumers).

    The CRC is the caller's to check once (`verify_batch`); a compressed batch is
    decompressed here, its output bounded by `limits.batch_bytes_max` per record count."""
    header = read_header(data, limits)
    base_timestamp = int.from_bytes(data[27:35], "big", signed=True)
    codec, bound = header.attributes & COMPRESSION_MASK, limits.decompressed_batch_bytes_max
    try:
        body = decompressed(memoryview(data)[HEADER_BYTES:], codec, bound)
    except CompressionError as exc:
        raise BatchFormatError(str(exc)) from exc
    return _read_records(body, base_timestamp, header.record_count, limits)


def _slow_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint of more than one byte at `pos`: its value and the position after it."""
    n, shift = 0, 0
    while True:
        byte = buf[pos]  # IndexError past the end: the caller's BatchFormatError
        pos += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise BatchFormatError("a varint runs past 10 bytes")


def _read_records(
    buf: bytes, base_timestamp: int, count: int, limits: StateLimits
) -> tuple[Record, ...]:
    """Every record of an uncompressed body, each length checked against its bytes.

    One function with the one-byte varints inlined: the consumer's cost per record of a
    compressed batch (it reads uncompressed ones through cluster/client/batches.py)."""
    try:
        return _walk_records(buf, base_timestamp, count, limits)
    except IndexError:
        raise BatchFormatError("a record runs past its batch") from None


def _walk_records(  # noqa: PLR0912 - one loop on locals, for speed
    buf: bytes, base_timestamp: int, count: int, limits: StateLimits
) -> tuple[Record, ...]:
    out: list[Record] = []
    append, new, end, pos = out.append, _new_record, len(buf), 0
    for index in range(count):
        byte = buf[pos]
        if byte < 0x80:
            length, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        else:
            length, pos = _slow_varint(buf, pos)
        record_end = pos + length
        pos += 1  # the record's attributes: unused in v2
        byte = buf[pos]
        if byte < 0x80:
            delta, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        else:
            delta, pos = _slow_varint(buf, pos)
        timestamp_ms = base_timestamp + delta
        byte = buf[pos]
        if byte < 0x80:
            delta, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        else:
            delta, pos = _slow_varint(buf, pos)
        if delta != index:
            raise BatchFormatError("record offset deltas are not 0, 1, 2, ...")
        byte = buf[pos]
        if byte < 0x80:
            size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        else:
            size, pos = _slow_varint(buf, pos)
        key = None if size == -1 else buf[pos : pos + size]
        pos += max(size, 0)
        sized = size
        byte = buf[pos]
        if byte < 0x80:
            size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        else:
            size, pos = _slow_varint(buf, pos)
        value = None if size == -1 else buf[pos : pos + size]
        pos += max(size, 0)
        if sized < -1 or size < -1:
            raise BatchFormatError("a negative field length")
        byte = buf[pos]
        if byte == 0:
            pos += 1
            headers: tuple[tuple[str, bytes | None], ...] = ()
        else:
            headers, pos = _read_headers(buf, pos, limits)
        if (
            pos != record_end
            or record_end > end
            or length < 0
            or not 0 <= timestamp_ms <= INT64_MAX
        ):
            raise BatchFormatError("a record's length or timestamp is inconsistent")
        append(new(Record, (key, value, timestamp_ms, headers)))
    if pos != end:
        raise BatchFormatError("bytes after the last record")
    return tuple(out)


_new_record = tuple.__new__  # Record's own __new__ is a Python function: skip its frame


def _read_headers(
    buf: bytes, pos: int, limits: StateLimits
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    count, pos = _slow_varint(buf, pos)
    if not 0 < count <= limits.record_headers_max:
        raise BatchFormatError(f"a record's header count {count} is out of range")
    headers = []
    for _ in range(count):
        size, pos = _slow_varint(buf, pos)
        if size < 0:
            raise BatchFormatError("a header name is null")
        try:
            name = buf[pos : pos + size].decode()
        except UnicodeDecodeError:
            raise BatchFormatError("a header name is not valid UTF-8") from None
        pos += size
        size, pos = _slow_varint(buf, pos)
        value = None
        if size >= 0:
            value, pos = buf[pos : pos + size], pos + size
        elif size != -1:
            raise BatchFormatError("a negative header value length")
        headers.append((name, value))
    return tuple(headers), pos
