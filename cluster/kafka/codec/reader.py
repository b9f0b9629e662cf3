"""Requests read in one pass straight into our classes, by a reader put together once per class
from kio's description of the fields, every length and count checked against the bytes left
and the limits first. Part of the codec (cluster/kafka/codec/__init__.py has its rules).
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import uuid
from collections.abc import Callable
from typing import Any

import kio.schema.errors
import kio.serial
import kio.serial.errors

from cluster.config import Limits
from cluster.kafka import messages as m
from cluster.kafka.codec.primitives import (
    _LEGACY_INT16_LENGTH,
    _LEGACY_INT32_LENGTH,
    _NULL_MARKER,
    _PRESENT_MARKER,
    ITEMS_PER_PARTITION_BOUND,
    _check_fits,
    _compact_length,
    _MalformedError,
    _need,
    _read_uvarint,
    _ReadLength,
)
from cluster.kafka.codec.schemas import (
    _Field,
    _from_kio_plan,
    _kio_fields,
    _ms_to_timedelta,
    _our_kinds,
    _our_tag_default,
    _request_schema,
    _timedelta_to_ms,
)

_Read = Callable[[bytes, int, int, "_Budget"], tuple[Any, int]]


_READERS: dict[tuple[type, type | None], _Read] = {}


class _Budget:
    """What one request may still hold: the walk's bounds on arrays and items."""

    __slots__ = ("count_max", "items_left")

    def __init__(self, limits: Limits) -> None:
        per_request = limits.partitions_per_request_max
        self.count_max = per_request
        self.items_left = per_request * ITEMS_PER_PARTITION_BOUND

    def take(self, count: int, bytes_left: int) -> None:
        _check_fits(count, bytes_left)
        self.items_left -= count
        if self.items_left < 0:
            raise _MalformedError("too many items in one request")


@functools.cache
def _request_reader(api_key: int, version: int) -> _Read:
    return _reader(_request_schema(api_key, version), m.MESSAGES[m.Api(api_key)][0])


def _reader(kio_cls: type[Any], cls: type[Any] | None) -> _Read:
    """How to read kio's `kio_cls` as our `cls` (None: read, check and drop)."""
    found = _READERS.get((kio_cls, cls))
    if found is None:
        found = _READERS[kio_cls, cls] = _make_reader(kio_cls, cls)
    return found


def _make_reader(kio_cls: type[Any], cls: type[Any] | None) -> _Read:
    flexible: bool = kio_cls.__flexible__
    ours = _our_kinds(cls) if cls is not None else {}
    from_kio = {name: (how, arg) for name, how, arg in _from_kio_plan(cls, kio_cls)} if cls else {}
    plain: list[tuple[str | None, _Read]] = []
    tagged: dict[int, tuple[str | None, _Read]] = {}
    tag_defaults: dict[str, Any] = {}
    for field, kio_field in zip(_kio_fields(kio_cls), dataclasses.fields(kio_cls), strict=True):
        name = field.name if field.name in ours else None
        nested = ours[field.name].nested if name is not None else None
        read_value = _value_reader(field, flexible, nested)
        if field.tag is None:
            plain.append((name, read_value))
            continue
        tagged[field.tag] = (name, read_value)
        if name is not None:
            tag_defaults[name] = _our_tag_default(kio_field, from_kio[name])
    tags = _tags_reader(tagged) if flexible else None

    def read(buf: bytes, pos: int, end: int, budget: _Budget) -> tuple[Any, int]:
        values = dict(tag_defaults) if tag_defaults else {}
        for name, read_field in plain:
            value, pos = read_field(buf, pos, end, budget)
            if name is not None:
                values[name] = value
        if tags is not None:
            pos = tags(buf, pos, end, budget, values)
        return (None if cls is None else cls(**values)), pos

    return read


def _tags_reader(
    tagged: dict[int, tuple[str | None, _Read]],
) -> Callable[[bytes, int, int, _Budget, dict[str, Any]], int]:
    """The tagged-field section: each known tag read to exactly its size, an unknown one
    malformed (kio cannot skip one), absent ones left at their defaults."""

    def read(buf: bytes, pos: int, end: int, budget: _Budget, values: dict[str, Any]) -> int:
        count, pos = _read_uvarint(buf, pos, end)
        if not count:
            return pos
        budget.take(count, end - pos)
        for _ in range(count):
            tag, pos = _read_uvarint(buf, pos, end)
            size, pos = _read_uvarint(buf, pos, end)
            field_end = _need(pos, size, end)
            known = tagged.get(tag)
            if known is None:
                raise _MalformedError(f"unknown tagged field {tag}")
            name, read_field = known
            value, after = read_field(buf, pos, field_end, budget)
            if after != field_end:
                raise _MalformedError(f"tagged field {tag} is not {size} bytes")
            if name is not None:
                values[name] = value
            pos = field_end
        return pos

    return read


def _value_reader(field: _Field, flexible: bool, nested: type[Any] | None) -> _Read:
    """One field's value: an item, or an array of them (a tuple, None for a null one)."""
    kind = field.kind
    one_nullable = kind.nullable and not kind.array  # an array's own null is checked below
    if kind.nested is not None:
        item = _nested_reader(_reader(kind.nested, nested), nullable=one_nullable)
    else:
        item = _scalar_reader(field.kafka_type, flexible, nullable=one_nullable)
    if not kind.array:
        return item
    name, nullable = field.name, kind.nullable
    read_length = _compact_length if flexible else _LEGACY_INT32_LENGTH

    def read_array(buf: bytes, pos: int, end: int, budget: _Budget) -> tuple[Any, int]:
        count, pos = read_length(buf, pos, end)
        if count < 0:
            # kio reads a null array as None whatever the schema says, as Kafka does not.
            if not nullable:
                raise _MalformedError(f"{name}: a null array where none may be")
            return None, pos
        if count > budget.count_max:
            raise _MalformedError(f"{name}: {count} items, at most {budget.count_max}")
        budget.take(count, end - pos)
        items = []
        for _ in range(count):
            value, pos = item(buf, pos, end, budget)
            items.append(value)
        return tuple(items), pos

    return read_array


def _nested_reader(read_entity: _Read, *, nullable: bool) -> _Read:
    if not nullable:
        return read_entity

    def read(buf: bytes, pos: int, end: int, budget: _Budget) -> tuple[Any, int]:
        after = _need(pos, 1, end)
        marker = buf[pos] - 256 if buf[pos] > 127 else buf[pos]  # KIP-893's int8 marker
        if marker == _NULL_MARKER:
            return None, after
        if marker != _PRESENT_MARKER:
            raise _MalformedError(f"bad nullable-struct marker {marker}")
        return read_entity(buf, after, end, budget)

    return read


def _scalar_reader(kafka_type: str, flexible: bool, *, nullable: bool) -> _Read:
    fixed = _FIXED_READS.get(kafka_type)
    if fixed is not None:
        return _fixed_reader(*fixed)
    if kafka_type == "string":
        length = _compact_length if flexible else _LEGACY_INT16_LENGTH
        return _sized_reader(length, nullable=nullable, text=True)
    if kafka_type in ("bytes", "records"):
        length = _compact_length if flexible else _LEGACY_INT32_LENGTH
        # A Produce's records, up to a frame's size, are passed on as a view of the request:
        # its copy would be the largest work of the whole decode.
        view = kafka_type == "records"
        return _sized_reader(length, nullable=nullable, text=False, view=view)
    raise AssertionError(f"no reader for kafka_type {kafka_type!r}")


def _fixed_reader(layout: struct.Struct, check: Callable[[Any], Any] | None) -> _Read:
    size, unpack = layout.size, layout.unpack_from

    def read(buf: bytes, pos: int, end: int, _budget: _Budget) -> tuple[Any, int]:
        after = pos + size
        if after > end:
            raise _MalformedError(f"{size} bytes wanted, {end - pos} left")
        return unpack(buf, pos)[0], after

    if check is None:
        return read
    convert = check

    # `read` again with the check, not a call of `read`: a frame less per field of a request.
    def read_checked(buf: bytes, pos: int, end: int, _budget: _Budget) -> tuple[Any, int]:
        after = pos + size
        if after > end:
            raise _MalformedError(f"{size} bytes wanted, {end - pos} left")
        return convert(unpack(buf, pos)[0]), after

    return read_checked


def _sized_reader(
    read_length: _ReadLength, *, nullable: bool, text: bool, view: bool = False
) -> _Read:
    def read(buf: bytes, pos: int, end: int, _budget: _Budget) -> tuple[Any, int]:
        length, pos = read_length(buf, pos, end)
        if length < 0:
            if not nullable:
                raise _MalformedError("a null where none may be")
            return None, pos
        after = pos + length
        if after > end:
            raise _MalformedError(f"{length} bytes wanted, {end - pos} left")
        if view:
            return memoryview(buf)[pos:after], after
        if not text:
            return buf[pos:after], after
        try:
            return str(buf[pos:after], "utf-8"), after
        except UnicodeDecodeError:
            raise _MalformedError("a string that is not UTF-8") from None

    return read


# Values as kio's primitive readers accept them (the same refused), in our form.
def _boolean(value: int) -> bool:
    if value not in (0, 1):
        raise _MalformedError(f"a boolean of {value}")
    return value == 1


def _uuid(value: bytes) -> uuid.UUID | None:
    return None if value == _ZERO_UUID else uuid.UUID(bytes=value)


def _error_code(value: int) -> int:
    if value not in _KIO_ERROR_CODES:
        raise _MalformedError(f"unknown error code {value}")
    return value


def _long_duration(value: int) -> int:
    # kio holds it as a timedelta of microseconds in an int64, and `_from_kio` gives it back
    # through a float: the same bound, and the same value.
    if abs(value) > _DURATION_MS_MAX:
        raise _MalformedError(f"a duration of {value} ms")
    return _timedelta_to_ms(_ms_to_timedelta(value))


_DURATION_MS_MAX = (2**63 - 1) // 1000


_ZERO_UUID = bytes(16)


_KIO_ERROR_CODES = frozenset(int(code) for code in kio.schema.errors.ErrorCode)


_FIXED_READS: dict[str, tuple[struct.Struct, Callable[[Any], Any] | None]] = {
    "bool": (struct.Struct(">B"), _boolean),
    "int8": (struct.Struct(">b"), None),
    "uint8": (struct.Struct(">B"), None),
    "int16": (struct.Struct(">h"), None),
    "uint16": (struct.Struct(">H"), None),
    "error_code": (struct.Struct(">h"), _error_code),
    "int32": (struct.Struct(">i"), None),
    "uint32": (struct.Struct(">I"), None),
    "timedelta_i32": (struct.Struct(">i"), None),  # ms both sides, and always a timedelta
    "int64": (struct.Struct(">q"), None),
    "uint64": (struct.Struct(">Q"), None),
    "float64": (struct.Struct(">d"), None),
    "timedelta_i64": (struct.Struct(">q"), _long_duration),
    "uuid": (struct.Struct("16s"), _uuid),
}
