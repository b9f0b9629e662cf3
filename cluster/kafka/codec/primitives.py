"""The wire's primitives: the struct layouts of headers and lengths, unsigned varints, and
the checks a reader makes before it takes anything (a length or count must fit the bytes
left). Part of the codec (cluster/kafka/codec/__init__.py has its rules).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

_NULL_MARKER, _PRESENT_MARKER = -1, 1  # a nullable struct's leading int8 (KIP-893)


LENGTH_PREFIX = struct.Struct(">i")  # signed: a negative length is malformed


_HEADER_FIXED = struct.Struct(">hhih")  # api key, version, correlation id, client id length


_CORRELATION_ID = struct.Struct(">i")


_INT8 = struct.Struct(">b")


_INT16 = struct.Struct(">h")


_INT32 = struct.Struct(">i")


ITEMS_PER_PARTITION_BOUND = 8


_UVARINT_BYTES_MAX = 5


_UVARINT_MAX = 2**31  # a compact length or count is N+1 for N <= 2^31-1


class _MalformedError(Exception):
    """What the walk found wrong (turned into a KafkaProtocolError by the caller)."""


# -- reading requests: kio's schemas, straight into our classes -----------------------------------
#
# kio's native entity reader is quick, but it allocates what a count claims (so the walk had to
# go first) and builds kio's objects (so `_from_kio` had to follow): three passes, about 40 us
# of a one-record Produce in place, where our native protocol's read takes 17 (bench/HISTORY.md,
# fourteenth session). The reader of a class is put together here once per pair of classes,
# from kio's description of the fields: one pass that checks each length and count against the
# bytes left and the request's budget (the walk's rules), reads the value as kio's primitive
# reader would (the same values accepted, the same refused), and builds our object. A field our
# class lacks is read and checked all the same, then dropped. tests/unit/test_kafka_codec.py
# holds it to `kio_decode_request` on every version and on fuzzed bytes.


_ReadLength = Callable[[bytes, int, int], tuple[int, int]]  # (length or count, -1: null; pos)


def _compact_length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A flexible version's length or count: N+1 as an unsigned varint, 0 for null (-1)."""
    if pos < end and buf[pos] < 0x80:  # nearly always one byte
        return buf[pos] - 1, pos + 1
    value, pos = _read_uvarint(buf, pos, end)
    return value - 1, pos


def _legacy_length(layout: struct.Struct) -> _ReadLength:
    """An older version's length or count: a signed int16 (strings) or int32, -1 for null."""
    size, unpack = layout.size, layout.unpack_from

    def read(buf: bytes, pos: int, end: int) -> tuple[int, int]:
        after = pos + size
        if after > end:
            raise _MalformedError(f"{size} bytes wanted, {end - pos} left")
        (value,) = unpack(buf, pos)
        if value < -1:
            raise _MalformedError(f"negative length {value}")
        return value, after

    return read


_LEGACY_INT16_LENGTH = _legacy_length(_INT16)  # strings


_LEGACY_INT32_LENGTH = _legacy_length(_INT32)  # bytes, records, arrays


def _read_uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(_UVARINT_BYTES_MAX):
        if pos + i >= end:
            raise _MalformedError("a varint past the end")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value > _UVARINT_MAX:
                raise _MalformedError(f"a length or count of {value}")
            return value, pos + i + 1
        shift += 7
    raise _MalformedError("a varint longer than 5 bytes")


def _skip_tagged_fields(buf: bytes, pos: int, end: int) -> int:
    """Past a header's tagged fields, whatever their tags (nearly always none: one byte)."""
    if pos < end and buf[pos] == 0:
        return pos + 1
    count, pos = _read_uvarint(buf, pos, end)
    _check_fits(count, end - pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(buf, pos, end)
        size, pos = _read_uvarint(buf, pos, end)
        pos = _need(pos, size, end)
    return pos


def _check_fits(count: int, bytes_left: int) -> None:
    # Every item takes at least a byte on the wire, so a count beyond the bytes left lies.
    if count > bytes_left:
        raise _MalformedError(f"{count} items in {bytes_left} bytes")


def _need(pos: int, size: int, end: int) -> int:
    if size > end - pos:
        raise _MalformedError(f"{size} bytes wanted, {end - pos} left")
    return pos + size
