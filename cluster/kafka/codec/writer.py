"""Responses written from our classes by a writer put together once per class from kio's
description of the fields, and their frames. Part of the codec (cluster/kafka/codec/__init__.py
has its rules).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import operator
import struct
from collections.abc import Callable
from typing import Any

from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._serialize import get_field_writer, get_writer
from kio.serial.writers import Writable, write_tagged_field

from cluster.errors import ERROR_MESSAGE_CHARS_MAX
from cluster.kafka.codec.primitives import (
    _CORRELATION_ID,
    _INT8,
    _INT16,
    _INT32,
    _NULL_MARKER,
    _PRESENT_MARKER,
    LENGTH_PREFIX,
)
from cluster.kafka.codec.schemas import (
    _AS_IS,
    _CONVERT,
    _CONVERT_ARRAY,
    _convert,
    _from_kio_plan,
    _Kind,
    _kind,
    _kio_default,
    _our_tag_default,
    _to_kio,
    _to_kio_plan,
)

# -- encoding responses --------------------------------------------------------------------------


def _frame(correlation_id: int, kio_cls: type[Any], response: object) -> bytes:
    return _framed(
        correlation_id, kio_cls, lambda out: _writer(kio_cls, type(response))(out, response)
    )


def _framed(
    correlation_id: int, kio_cls: type[Any], write_body: Callable[[io.BytesIO], None]
) -> bytes:
    """A response frame: length prefix, header (v0, or v1 for a flexible version), body."""
    out = io.BytesIO()
    out.write(LENGTH_PREFIX.pack(0))
    out.write(_CORRELATION_ID.pack(correlation_id))
    if kio_cls.__header_schema__.__flexible__:
        out.write(b"\x00")  # no tagged fields in the response header
    write_body(out)
    frame = out.getbuffer()
    LENGTH_PREFIX.pack_into(frame, 0, len(frame) - LENGTH_PREFIX.size)
    return bytes(frame)


# -- writing responses: kio's schemas, fed from our classes ---------------------------------------
#
# kio's entity writer wants kio's own objects: building them from ours (`_to_kio`) and walking
# them field by field was about 50 us of a Produce's answer in place (bench/HISTORY.md, tenth
# session). The writer of a class is put together here once per pair of classes, from kio's
# description of the fields (types, order, tags, flexible or not) and kio's own primitive
# writers: each plain field is read from our object and written at once. Tagged fields (rare,
# and skipped when they hold their default) go through kio's path, exactly as kio writes them.
# tests/unit/test_kafka_codec.py holds every response of every version to kio's bytes.


_Write = Callable[[Writable, Any], None]


_WRITERS: dict[tuple[type, type], _Write] = {}


_UVARINT_ONE_BYTE_MAX = 0x7F


_ONE_BYTE = tuple(bytes((i,)) for i in range(_UVARINT_ONE_BYTE_MAX + 1))


# A field's (or a row's) step: how to get our value (None: kio's default, given), the writer.
_Step = tuple[Callable[[Any], Any] | None, Any, _Write]


def _writer(kio_cls: type[Any], cls: type[Any]) -> _Write:
    found = _WRITERS.get((kio_cls, cls))
    if found is None:
        found = _WRITERS[kio_cls, cls] = _make_writer(kio_cls, cls)
    return found


def _write_uvarint(out: Writable, value: int) -> None:
    if value <= _UVARINT_ONE_BYTE_MAX:
        out.write(_ONE_BYTE[value])
        return
    encoded = bytearray()
    while value > _UVARINT_ONE_BYTE_MAX:
        encoded.append((value & 0x7F) | 0x80)
        value >>= 7
    encoded.append(value)
    out.write(encoded)


def _write_length(out: Writable, length: int | None, flexible: bool) -> None:
    """An array's length: compact (N+1, 0 for null) in a flexible version, else an int32."""
    if flexible:
        _write_uvarint(out, 0 if length is None else length + 1)
    else:
        out.write(_INT32.pack(-1 if length is None else length))


def _make_writer(kio_cls: type[Any], cls: type[Any]) -> _Write:
    flexible: bool = kio_cls.__flexible__
    plan = {name: (how, arg) for name, how, arg in _to_kio_plan(kio_cls, cls)}
    plain: list[_Step] = []
    run: list[dataclasses.Field[Any]] = []  # fixed-size integers of ours, in a row
    tagged = []
    for field in dataclasses.fields(kio_cls):
        ours = field.name if field.name in plan else None
        if ours is not None and field.metadata.get("tag") is None and _packable(field):
            run.append(field)
            continue
        plain.extend(_run_writer(run))
        run = []
        if field.metadata.get("tag") is not None:
            tagged.append((field, ours))
            continue
        default = None if ours is not None else _kio_default(field)
        get = None if ours is None else operator.attrgetter(ours)
        plain.append((get, default, _field_writer(field, flexible, plan.get(field.name))))
    plain.extend(_run_writer(run))
    tags = _tags_writer(tagged, plan, kio_cls, cls) if flexible else None

    def write(out: Writable, value: object) -> None:
        for get, default, write_field in plain:
            write_field(out, default if get is None else get(value))
        if tags is not None:
            tags(out, value)

    return write


# Integers written as they are, ours and kio's alike (an error code and a duration are ms or
# codes on both sides once kio's writer has turned them back): a row of them is one pack.
_PACKED = {
    "int8": "b",
    "int16": "h",
    "int32": "i",
    "int64": "q",
    "uint8": "B",
    "uint16": "H",
    "uint32": "I",
    "uint64": "Q",
    "error_code": "h",
    "timedelta_i32": "i",
    "timedelta_i64": "q",
}


def _packable(field: dataclasses.Field[Any]) -> bool:
    kind = _kind(field.type)
    return not kind.array and not kind.nullable and field.metadata.get("kafka_type") in _PACKED


def _run_writer(run: list[dataclasses.Field[Any]]) -> list[_Step]:
    """A row of fixed-size integer fields, written by one `struct.pack` of all of them."""
    if not run:
        return []
    pack = struct.Struct(">" + "".join(_PACKED[f.metadata["kafka_type"]] for f in run)).pack
    if len(run) == 1:

        def write_one(out: Writable, value: Any) -> None:
            out.write(pack(value))

        return [(operator.attrgetter(run[0].name), None, write_one)]

    def write_row(out: Writable, values: Any) -> None:
        out.write(pack(*values))

    return [(operator.attrgetter(*(f.name for f in run)), None, write_row)]


def _field_writer(
    field: dataclasses.Field[Any], flexible: bool, how: tuple[int, Any] | None
) -> _Write:
    """One plain field: our value converted as `_to_kio` would, and written by kio's writer
    of its type; a nested entity or array of them by this module's writers."""
    kind = _kind(field.type)
    if kind.nested is not None:
        return _nested_writer(kind, flexible)
    scalar = _scalar_writer(
        field.metadata["kafka_type"], flexible, kind.nullable and not kind.array
    )
    if field.name in _MESSAGE_FIELDS:
        scalar = _converted(scalar, _message, none_passes=True)
    convert = how[1] if how is not None and how[0] in (_CONVERT, _CONVERT_ARRAY) else None
    if kind.array:
        item = scalar if convert is None else _converted(scalar, convert)

        def write_array(out: Writable, items: Any) -> None:
            _write_length(out, None if items is None else len(items), flexible)
            for value in items or ():
                item(out, value)

        return write_array
    if convert is None:
        return scalar
    return _converted(scalar, convert, none_passes=kind.nullable)


def _scalar_writer(kafka_type: str, flexible: bool, nullable: bool) -> _Write:
    """kio's writer of a primitive, but for strings and bytes (the most of an answer, and
    kio's check of their types costs more than writing them): the same bytes, written here."""
    if kafka_type == "string":
        return _sized_writer(flexible, _INT16, nullable=nullable, text=True)
    if kafka_type in ("bytes", "records"):
        return _sized_writer(flexible, _INT32, nullable=nullable, text=False)
    return get_writer(kafka_type, flexible, nullable)


def _sized_writer(flexible: bool, legacy: struct.Struct, *, nullable: bool, text: bool) -> _Write:
    """A length (compact N+1 or legacy, null as kio writes it) and the bytes."""
    pack = legacy.pack

    def write(out: Writable, value: Any) -> None:
        if value is None:
            assert nullable, "a null where the schema allows none"
            out.write(b"\x00" if flexible else pack(-1))
            return
        data = value.encode() if text else value
        if flexible:
            _write_uvarint(out, len(data) + 1)
        else:
            out.write(pack(len(data)))
        out.write(data)

    return write


# An error message is cut to ERROR_MESSAGE_CHARS_MAX characters (at most 2 KiB of UTF-8), so it
# fits a legacy string of every version whatever client input it quotes.
_MESSAGE_FIELDS = frozenset(("error_message", "batch_index_error_message"))


def _message(text: str) -> str:
    return text[:ERROR_MESSAGE_CHARS_MAX]


def _converted(scalar: _Write, convert: Callable[[Any], Any], none_passes: bool = False) -> _Write:
    def write(out: Writable, value: Any) -> None:
        scalar(out, value if none_passes and value is None else convert(value))

    return write


def _nested_writer(kind: _Kind, flexible: bool) -> _Write:
    nested = kind.nested
    assert nested is not None

    def write_one(out: Writable, value: Any) -> None:
        _writer(nested, type(value))(out, value)

    if kind.array:

        def write_array(out: Writable, items: Any) -> None:
            _write_length(out, None if items is None else len(items), flexible)
            for value in items or ():
                write_one(out, value)

        return write_array
    if kind.nullable:  # KIP-893: a nullable struct leads with an int8 marker

        def write_nullable(out: Writable, value: Any) -> None:
            out.write(_INT8.pack(_NULL_MARKER if value is None else _PRESENT_MARKER))
            if value is not None:
                write_one(out, value)

        return write_nullable
    return write_one


def _tags_writer(
    tagged: list[Any], plan: dict[str, tuple[int, Any]], kio_cls: type[Any], cls: type[Any]
) -> _Write:
    """The tagged-field section, as kio writes it: each field whose value is not its default,
    in tag order, converted to kio's form (as `plan` says) and written by kio's writer (a count
    of 0 when none is set, which is nearly always). A field ours lacks always holds kio's
    default; one of ours is compared with that default in our form first, without converting
    it (the conversion is what costs)."""
    from_kio = {name: (how, arg) for name, how, arg in _from_kio_plan(cls, kio_cls)}
    entries = sorted(
        (
            (field, ours, _our_tag_default(field, from_kio[ours]) if ours in from_kio else _NEVER)
            for field, ours in tagged
            if ours is not None
        ),
        key=lambda t: t[0].metadata["tag"],
    )
    if not entries:
        return _write_no_tags

    def write(out: Writable, value: object) -> None:
        written = []
        for field, ours, our_default in entries:
            our_value = getattr(value, ours)
            if our_value == our_default:
                continue
            kio_value = _as_kio(our_value, plan[ours])
            if kio_value == field.default or (
                field.default is dataclasses.MISSING
                and kio_value == get_tagged_field_default(field)
            ):
                continue
            buffer = io.BytesIO()
            write_tagged_field(buffer, field.metadata["tag"], _kio_tag_writer(field), kio_value)
            written.append(buffer.getvalue())
        _write_uvarint(out, len(written))
        for encoded in written:
            out.write(encoded)

    return write


_NEVER = object()  # equal to no value of ours: a field given by a property is always converted


def _write_no_tags(out: Writable, _value: object) -> None:
    out.write(b"\x00")


def _as_kio(value: Any, how: tuple[int, Any]) -> Any:
    if how[0] == _AS_IS or value is None:
        return value
    return _convert(how[0], how[1], value, _to_kio)


@functools.cache
def _kio_tag_writer(field: dataclasses.Field[Any]) -> Any:
    return get_field_writer(field, flexible=True, is_request_header=False, is_tag=True)
