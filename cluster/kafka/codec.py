"""Kafka's wire protocol: the one adapter to kio (Kafka's own JSON schemas, generated as one
dataclass per message and version, decoded in Rust).

Role: bytes of a request frame in, a `KafkaRequest` in our types out (cluster/kafka/messages.py);
a response in our types out as the bytes of its frame. The listener's wire (wire.py) and the
tests' own client speak only through these functions; nothing else imports kio
(tests/unit/test_import_directions.py).

Rules:
- A request is a header and a body. The header is v1 (api key, version, correlation id,
  client id), or v2 (the same, then tagged fields) when the request's version is flexible:
  ApiVersions v3+ included. A response header is v0 (the correlation id), or v1 (then tagged
  fields) for a flexible version, except ApiVersions', which is always v0 so that a client can
  read it whatever version it asked for.
- Decoding is strict and total: anything malformed raises `KafkaProtocolError`, nothing else.
  An API or version outside the table we are given is malformed, with one exception (KIP-511):
  ApiVersions newer than we know is answered in v0 format with UNSUPPORTED_VERSION and our
  versions, so the client retries with one we know (`KafkaProtocolError.answer`).
- A request is read in one pass, by a reader put together once per class from kio's
  description of its fields (`_make_reader`): every length and count must fit in the bytes
  left, every array holds at most `Limits.partitions_per_request_max` items and a request at
  most `ITEMS_PER_PARTITION_BOUND` times that many in all, and each value is accepted or
  refused as kio's own primitive readers accept or refuse it. An unknown tagged field is
  malformed (kio cannot skip one), and so is a null array in a version that allows none.
  Bytes after the request are ignored, as Kafka's parser ignores them (librdkafka's
  all-topics Metadata v9+ leaves three). `kio_decode_request` is the reference the tests hold
  it to: the walk (`_Walk`, the same bounds: kio's native reader allocates what a count
  claims before it reads the items, and a count of 2^35 aborts the process), then kio's
  reader, then `_from_kio`. A field of Kafka's type `records` (a Produce's batches) is read
  as a `memoryview` of the request's bytes, not a copy of up to a frame's size; every other
  bytes field as bytes.
- Fields map by name between kio's class of the version on the wire and ours (messages.py):
  a field a version lacks is dropped on encode and takes our default on decode. Durations and
  times are ms on our side, error codes integers.
- A response is written from our classes directly, by a writer put together once per class
  from kio's description of the fields (a row of integers is one `struct.pack`; strings and
  bytes are written here, other primitives by kio's writers), not by building kio's objects
  for kio's entity writer, which cost twice as much; the tests hold its bytes to kio's own
  writer's for every response and version (`kio_frame`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import operator
import re
import struct
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import kio.schema.errors
import kio.serial
import kio.serial.errors
from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._serialize import get_field_writer, get_writer
from kio.serial.writers import Writable, write_tagged_field

from cluster.config import Limits
from cluster.errors import ERROR_MESSAGE_CHARS_MAX, quoted
from cluster.kafka import messages as m
from cluster.protocol import ProtocolError
from statemachine.errors import ErrorCode

LENGTH_PREFIX = struct.Struct(">i")  # signed: a negative length is malformed
_HEADER_FIXED = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_CORRELATION_ID = struct.Struct(">i")
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
ITEMS_PER_PARTITION_BOUND = 8
# Kafka's ApiVersionsRequest.isValid: client software name and version.
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
_UVARINT_BYTES_MAX = 5
_UVARINT_MAX = 2**31  # a compact length or count is N+1 for N <= 2^31-1

Versions = Mapping[int, m.VersionRange]
# What this listener serves, each API from the oldest to the newest version we answer: every
# request class's own (cluster/kafka/messages/); docs: README, "Using Kafka clients".
SUPPORTED: Versions = MappingProxyType({api: cls.VERSIONS for api, cls in m.REQUESTS.items()})


class KafkaProtocolError(ProtocolError):
    """Bytes that are not a request we serve. `answer`, when not None, is the whole frame to
    send back (ApiVersions newer than ours); otherwise the connection is closed, as Kafka does
    with a request it cannot parse."""

    def __init__(
        self, message: str, correlation_id: int | None = None, answer: bytes | None = None
    ) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message, correlation_id)
        self.answer = answer


# -- decoding requests ---------------------------------------------------------------------------


def decode_request(body: bytes, limits: Limits, versions: Versions = SUPPORTED) -> m.KafkaRequest:
    """The request in a frame body (length prefix removed); KafkaProtocolError otherwise."""
    header, offset = _read_header(body, versions)
    read = _request_reader(header.api_key, header.api_version)
    try:
        request_body, _end = read(body, offset, len(body), _Budget(limits))
    except _MalformedError as exc:
        raise _refused(header, str(exc)) from None
    request = m.KafkaRequest(header, request_body)
    if isinstance(request_body, m.ApiVersionsRequest) and header.api_version >= 3:
        _check_software(request_body, header)
    return request


def kio_decode_request(
    body: bytes, limits: Limits, versions: Versions = SUPPORTED
) -> m.KafkaRequest:
    """The same request as `decode_request`, read by kio's own entity reader into kio's classes
    (after the walk) and converted to ours: the reference the tests hold `decode_request` to,
    on valid and malformed bytes alike."""
    header, offset = _read_header(body, versions)
    kio_cls = _request_schema(header.api_key, header.api_version)
    try:
        end = _Walk(body, limits).entity(kio_cls, offset, len(body))
    except _MalformedError as exc:
        raise _refused(header, str(exc)) from None
    try:
        entity, size = kio.serial.entity_reader(kio_cls)(body, offset)
    except (kio.serial.errors.SerialError, ValueError, KeyError, TypeError) as exc:
        raise _refused(header, f"{type(exc).__name__}: {exc}") from None
    assert offset + size == end, "kio read other than the walk"
    request = m.KafkaRequest(header, _from_kio(m.MESSAGES[m.Api(header.api_key)][0], entity))
    if isinstance(request.body, m.ApiVersionsRequest) and header.api_version >= 3:
        _check_software(request.body, header)
    return request


def _read_header(body: bytes, versions: Versions) -> tuple[m.RequestHeader, int]:
    if len(body) < _HEADER_FIXED.size:
        raise KafkaProtocolError(f"a request of {len(body)} bytes has no header")
    api_key, version, correlation_id, client_id_length = _HEADER_FIXED.unpack_from(body)
    supported = versions.get(api_key)
    if supported is None:
        raise KafkaProtocolError(f"unsupported API key {api_key}", correlation_id)
    if not supported.min_version <= version <= supported.max_version:
        if api_key == m.Api.API_VERSIONS and version > supported.max_version:
            answer = _unsupported_api_versions(correlation_id, versions)
            raise KafkaProtocolError("ApiVersions newer than ours", correlation_id, answer)
        message = f"unsupported version {version} of API {m.Api(api_key).name}"
        raise KafkaProtocolError(message, correlation_id)
    offset = _HEADER_FIXED.size
    client_id: str | None = None
    if client_id_length >= 0:
        end = offset + client_id_length
        if end > len(body):
            raise KafkaProtocolError("a client id past the end of the request", correlation_id)
        try:
            client_id = body[offset:end].decode()
        except UnicodeDecodeError:
            raise KafkaProtocolError("a client id that is not UTF-8", correlation_id) from None
        offset = end
    elif client_id_length != -1:
        raise KafkaProtocolError("a negative client id length", correlation_id)
    header = m.RequestHeader(api_key, version, correlation_id, client_id)
    if _request_schema(api_key, version).__flexible__:
        try:  # header tagged fields: Kafka ignores those it does not know, and so do we
            offset = _skip_tagged_fields(body, offset, len(body))
        except _MalformedError as exc:
            raise _refused(header, str(exc)) from None
    return header, offset


def _refused(header: m.RequestHeader, reason: str) -> KafkaProtocolError:
    name = m.Api(header.api_key).name
    message = f"malformed {name} v{header.api_version}: {reason}"
    return KafkaProtocolError(message[:500], header.correlation_id)


def _check_software(request: m.ApiVersionsRequest, header: m.RequestHeader) -> None:
    """KIP-511: a client software name or version that fails Kafka's check is answered with
    INVALID_REQUEST in the version asked (clients log it), on a connection that stays open."""
    for value in (request.client_software_name, request.client_software_version):
        if not _SOFTWARE.fullmatch(value):
            problem = _refused(header, f"client software {quoted(value)} is not a valid name")
            answer = m.ApiVersionsResponse(ErrorCode.INVALID_REQUEST, ())
            schema = _response_schema(header.api_key, header.api_version)
            problem.answer = _frame(header.correlation_id, schema, answer)
            raise problem


def _unsupported_api_versions(correlation_id: int, versions: Versions) -> bytes:
    """KIP-511: a v0 ApiVersions response, UNSUPPORTED_VERSION, with every range we serve."""
    response = api_versions_response(ErrorCode.UNSUPPORTED_VERSION, versions)
    return _frame(correlation_id, _response_schema(m.Api.API_VERSIONS, 0), response)


def api_versions_response(error: ErrorCode, versions: Versions) -> m.ApiVersionsResponse:
    keys = tuple(m.ApiVersion(key, *r) for key, r in sorted(versions.items()))
    return m.ApiVersionsResponse(int(error), keys)


# -- encoding responses --------------------------------------------------------------------------


def encode_response(header: m.RequestHeader, response: m.ResponseBody) -> bytes:
    """The whole frame (length prefix included) answering the request of `header`."""
    kio_cls = _response_schema(header.api_key, header.api_version)
    return _frame(header.correlation_id, kio_cls, response)


def _frame(correlation_id: int, kio_cls: type[Any], response: object) -> bytes:
    return _framed(
        correlation_id, kio_cls, lambda out: _writer(kio_cls, type(response))(out, response)
    )


def kio_frame(correlation_id: int, kio_cls: type[Any], response: object) -> bytes:
    """The same frame as `_frame`, written by kio's own entity writer from kio's classes: the
    reference the tests hold `_frame` to, version by version."""
    entity = _to_kio(kio_cls, response)
    return _framed(
        correlation_id, kio_cls, lambda out: kio.serial.entity_writer(kio_cls)(out, entity)
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


def _kio_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    assert field.default_factory is not dataclasses.MISSING, f"{field.name} has no default"
    return field.default_factory()


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


# -- the client side (tests speak to the listener through these) -------------------------------


def encode_request(header: m.RequestHeader, body: m.RequestBody) -> bytes:
    """The whole frame of a request, as a client sends it."""
    kio_cls = _request_schema(header.api_key, header.api_version)
    client_id = b"" if header.client_id is None else header.client_id.encode()
    out = io.BytesIO()
    out.write(LENGTH_PREFIX.pack(0))
    out.write(
        _HEADER_FIXED.pack(
            header.api_key,
            header.api_version,
            header.correlation_id,
            -1 if header.client_id is None else len(client_id),
        )
    )
    out.write(client_id)
    if kio_cls.__flexible__:
        out.write(b"\x00")
    kio.serial.entity_writer(kio_cls)(out, _to_kio(kio_cls, body))
    frame = out.getbuffer()
    LENGTH_PREFIX.pack_into(frame, 0, len(frame) - LENGTH_PREFIX.size)
    return bytes(frame)


def decode_response(header: m.RequestHeader, body: bytes) -> tuple[int, m.ResponseBody]:
    """The correlation id and response of a response frame body, for the request of `header`
    (a client trusts its broker: no walk before kio reads it)."""
    api = m.Api(header.api_key)
    kio_cls = _response_schema(header.api_key, header.api_version)
    (correlation_id,) = _CORRELATION_ID.unpack_from(body)
    offset = _CORRELATION_ID.size
    if kio_cls.__header_schema__.__flexible__:
        offset = _skip_tagged_fields(body, offset, len(body))
    entity, _size = kio.serial.entity_reader(kio_cls)(body, offset)
    return correlation_id, _from_kio(m.MESSAGES[api][1], entity)


def decode_api_versions_fallback(body: bytes) -> tuple[int, m.ApiVersionsResponse]:
    """A v0 ApiVersions response (what a too-new ApiVersions request is answered with)."""
    header = m.RequestHeader(m.Api.API_VERSIONS, 0, 0, None)
    correlation_id, response = decode_response(header, body)
    assert isinstance(response, m.ApiVersionsResponse)
    return correlation_id, response


# -- kio's classes -------------------------------------------------------------------------------


# Cached: kio resolves a schema's class by its module path on every call (a fifth of the cost
# of a one-record Produce, decoded and answered, before the cache).
@functools.cache
def _request_schema(api_key: int, version: int) -> type[Any]:
    try:
        return load_request_schema(api_key, version)
    except KioIndexError:
        raise AssertionError(f"no kio schema for API {api_key} v{version}") from None


@functools.cache
def _response_schema(api_key: int, version: int) -> type[Any]:
    try:
        return load_response_schema(api_key, version)
    except KioIndexError:
        raise AssertionError(f"no kio schema for API {api_key} v{version}") from None


def schema_exists(api_key: int, version: int) -> bool:
    """Whether kio knows this API version, both ways (the version table is checked with it)."""
    try:
        load_request_schema(api_key, version)
        load_response_schema(api_key, version)
    except KioIndexError:
        return False
    return True


class _Kind(NamedTuple):
    """How one field of a class is laid out: an array or not, a nested class or not."""

    array: bool
    nested: type[Any] | None  # a nested class (kio's or ours), else a primitive
    nullable: bool


def _kind(annotation: object) -> _Kind:
    nullable = False
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        annotation = args[0]
    if typing.get_origin(annotation) is tuple:
        item = typing.get_args(annotation)[0]
        is_class = isinstance(item, type) and dataclasses.is_dataclass(item)
        return _Kind(True, item if is_class else None, nullable)
    nested = (
        annotation
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation)
        else None
    )
    return _Kind(False, nested, nullable)


class _Field(NamedTuple):
    name: str
    kafka_type: str
    kind: _Kind
    tag: int | None
    required: bool  # no default: our value must be given


# Each class's fields, read once (caches: kio's classes and ours never change).
_KIO_FIELDS: dict[type, tuple[_Field, ...]] = {}
_OUR_KINDS: dict[type, dict[str, _Kind]] = {}


def _kio_fields(kio_cls: type) -> tuple[_Field, ...]:
    found = _KIO_FIELDS.get(kio_cls)
    if found is None:
        found = _KIO_FIELDS[kio_cls] = _read_kio_fields(kio_cls)
    return found


def _read_kio_fields(kio_cls: type) -> tuple[_Field, ...]:
    assert dataclasses.is_dataclass(kio_cls)
    return tuple(
        _Field(
            f.name,
            f.metadata.get("kafka_type", ""),
            _kind(f.type),
            f.metadata.get("tag"),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(kio_cls)
    )


def _our_kinds(cls: type) -> dict[str, _Kind]:
    found = _OUR_KINDS.get(cls)
    if found is None:
        assert dataclasses.is_dataclass(cls)
        hints = typing.get_type_hints(cls)
        found = _OUR_KINDS[cls] = {f.name: _kind(hints[f.name]) for f in dataclasses.fields(cls)}
    return found


# Conversions between our values and kio's, by the kio field's kafka_type.
def _ms_to_timedelta(value: Any) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _timedelta_to_ms(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def _ms_to_time(value: Any) -> datetime.datetime | None:
    return None if value < 0 else datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)


def _time_to_ms(value: Any) -> int:
    return -1 if value is None else round(value.timestamp() * 1000)


_TO_KIO: dict[str, Callable[[Any], Any]] = {
    "error_code": kio.schema.errors.ErrorCode,
    "timedelta_i32": _ms_to_timedelta,
    "timedelta_i64": _ms_to_timedelta,
    "datetime_i64": _ms_to_time,
}
_FROM_KIO: dict[str, Callable[[Any], Any]] = {
    "error_code": int,
    "timedelta_i32": _timedelta_to_ms,
    "timedelta_i64": _timedelta_to_ms,
    "datetime_i64": _time_to_ms,
}


# How a field's value crosses between the two sides: as it is, each item of a nested array,
# a nested entity, each item of an array converted, or converted.
_AS_IS, _NESTED_ARRAY, _NESTED, _CONVERT_ARRAY, _CONVERT = range(5)
_Plan = tuple[tuple[str, int, Any], ...]  # (field name, how, the nested class or converter)


def _how(
    nested: type[Any] | None, array: bool, convert: Callable[[Any], Any] | None
) -> tuple[int, Any]:
    if nested is not None:
        return (_NESTED_ARRAY if array else _NESTED), nested
    if convert is not None:
        return (_CONVERT_ARRAY if array else _CONVERT), convert
    return _AS_IS, None


_TO_KIO_PLANS: dict[tuple[type, type], _Plan] = {}
_FROM_KIO_PLANS: dict[tuple[type, type], _Plan] = {}


def _to_kio_plan(kio_cls: type[Any], cls: type[Any]) -> _Plan:
    found = _TO_KIO_PLANS.get((kio_cls, cls))
    if found is None:
        found = _TO_KIO_PLANS[kio_cls, cls] = _make_to_kio_plan(kio_cls, cls)
    return found


def _from_kio_plan(cls: type[Any], kio_cls: type[Any]) -> _Plan:
    found = _FROM_KIO_PLANS.get((cls, kio_cls))
    if found is None:
        found = _FROM_KIO_PLANS[cls, kio_cls] = _make_from_kio_plan(cls, kio_cls)
    return found


def _make_to_kio_plan(kio_cls: type[Any], cls: type[Any]) -> _Plan:
    """Once per pair of classes: which of kio's fields ours gives, and how. A field of kio's
    that ours lacks is left to kio's default (it must have one)."""
    ours = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    plan = []
    for field in _kio_fields(kio_cls):
        if field.name not in ours and not isinstance(getattr(cls, field.name, None), property):
            assert not field.required, f"{cls.__name__} lacks {field.name}"
            continue
        how = _how(field.kind.nested, field.kind.array, _TO_KIO.get(field.kafka_type))
        plan.append((field.name, *how))
    return tuple(plan)


def _make_from_kio_plan(cls: type[Any], kio_cls: type[Any]) -> _Plan:
    """Once per pair of classes: which of our fields this version of kio's class carries (the
    others take our defaults), and how."""
    kio_fields = {f.name: f for f in _kio_fields(kio_cls)}
    plan = []
    for name, kind in _our_kinds(cls).items():
        field = kio_fields.get(name)
        if field is None:
            continue
        # A nested value is an array by our annotation, a converted one by kio's.
        array = kind.array if kind.nested is not None else field.kind.array
        plan.append((name, *_how(kind.nested, array, _FROM_KIO.get(field.kafka_type))))
    return tuple(plan)


def _convert(how: int, arg: Any, value: Any, nested: Callable[[Any, Any], Any]) -> Any:
    if how == _NESTED_ARRAY:
        return tuple([nested(arg, item) for item in value])
    if how == _NESTED:
        return nested(arg, value)
    if how == _CONVERT_ARRAY:
        return tuple(map(arg, value))
    return arg(value)


def _to_kio(kio_cls: type[Any], ours: object) -> Any:
    return _mapped(kio_cls, ours, _to_kio_plan(kio_cls, type(ours)), _to_kio)


def _from_kio(cls: type[Any], entity: object) -> Any:
    return _mapped(cls, entity, _from_kio_plan(cls, type(entity)), _from_kio)


def _mapped(
    target: type[Any], source: object, plan: _Plan, nested: Callable[[Any, Any], Any]
) -> Any:
    """`target` built from `source`'s fields as `plan` says, nested ones through `nested`."""
    values: dict[str, Any] = {}
    for name, how, arg in plan:
        value = getattr(source, name)
        if how and value is not None:
            value = _convert(how, arg, value, nested)
        values[name] = value
    return target(**values)


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

_Read = Callable[[bytes, int, int, "_Budget"], tuple[Any, int]]
_ReadLength = Callable[[bytes, int, int], tuple[int, int]]  # (length or count, -1: null; pos)
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


def _our_tag_default(field: dataclasses.Field[Any], how: tuple[int, Any]) -> Any:
    """What our field holds when its tag is absent: kio's default, converted as `_from_kio`
    converts it (`how`: the field's step of `_from_kio_plan`)."""
    has_default = (
        field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    )
    value = _kio_default(field) if has_default else get_tagged_field_default(field)
    if how[0] == _AS_IS or value is None:
        return value
    return _convert(how[0], how[1], value, _from_kio)


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


# -- the walk: every length checked before kio allocates anything --------------------------------


class _MalformedError(Exception):
    """What the walk found wrong (turned into a KafkaProtocolError by the caller)."""


_FIXED_BYTES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_NULL_MARKER, _PRESENT_MARKER = -1, 1  # a nullable struct's leading int8 (KIP-893)


class _Walk:
    """One pass over a request body that reads only lengths, counts and tags."""

    __slots__ = ("_body", "_budget")

    def __init__(self, body: bytes, limits: Limits) -> None:
        self._body = body
        self._budget = _Budget(limits)

    def entity(self, cls: type[Any], pos: int, end: int) -> int:
        """The position after an entity of kio class `cls` that starts at `pos`."""
        flexible = cls.__flexible__
        tags: dict[int, _Field] = {}
        for field in _kio_fields(cls):
            if field.tag is not None:
                tags[field.tag] = field
            else:
                pos = self._field(field, flexible, pos, end)
        if flexible:
            pos = self._tagged_fields(tags, flexible, pos, end)
        return pos

    def _tagged_fields(self, tags: dict[int, _Field], flexible: bool, pos: int, end: int) -> int:
        count, pos = _read_uvarint(self._body, pos, end)
        self._budget.take(count, end - pos)
        for _ in range(count):
            tag, pos = _read_uvarint(self._body, pos, end)
            size, pos = _read_uvarint(self._body, pos, end)
            field_end = _need(pos, size, end)
            field = tags.get(tag)
            if field is None:
                raise _MalformedError(f"unknown tagged field {tag}")
            if self._field(field, flexible, pos, field_end) != field_end:
                raise _MalformedError(f"tagged field {tag} is not {size} bytes")
            pos = field_end
        return pos

    def _field(self, field: _Field, flexible: bool, pos: int, end: int) -> int:
        kind = field.kind
        if not kind.array:
            return self._item(field, flexible, pos, end)
        count, pos = self._length(flexible, pos, end, legacy=_LEGACY_INT32_LENGTH)
        if count < 0:
            # kio reads a null array as None whatever the schema says, as Kafka does not.
            if not kind.nullable:
                raise _MalformedError(f"{field.name}: a null array where none may be")
            return pos
        if count > self._budget.count_max:
            raise _MalformedError(f"{field.name}: {count} items, at most {self._budget.count_max}")
        self._budget.take(count, end - pos)
        for _ in range(count):
            pos = self._item(field, flexible, pos, end)
        return pos

    def _item(self, field: _Field, flexible: bool, pos: int, end: int) -> int:
        nested = field.kind.nested
        if nested is not None:
            if field.kind.nullable and not field.kind.array:
                after = _need(pos, 1, end)
                (marker,) = _INT8.unpack_from(self._body, pos)
                pos = after
                if marker == _NULL_MARKER:
                    return pos
                if marker != _PRESENT_MARKER:
                    raise _MalformedError(f"{field.name}: bad nullable-struct marker {marker}")
            return self.entity(nested, pos, end)
        kafka_type = field.kafka_type
        size = _FIXED_BYTES.get(kafka_type)
        if size is not None:
            return _need(pos, size, end)
        if kafka_type == "string":
            legacy = _LEGACY_INT16_LENGTH
        elif kafka_type in ("bytes", "records"):
            legacy = _LEGACY_INT32_LENGTH
        else:
            raise AssertionError(f"the walk does not know kafka_type {kafka_type!r}")
        length, pos = self._length(flexible, pos, end, legacy=legacy)
        return pos if length < 0 else _need(pos, length, end)

    def _length(
        self, flexible: bool, pos: int, end: int, *, legacy: _ReadLength
    ) -> tuple[int, int]:
        """A length or count, -1 for null: compact (unsigned varint N+1) in flexible
        versions, else `legacy` (a signed int16 for strings, int32 for bytes and arrays)."""
        return (_compact_length if flexible else legacy)(self._body, pos, end)
