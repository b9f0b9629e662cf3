"""kio's own reader and writer: the reference the tests hold the codec to (the walk, kio's
entity reader, the conversion; kio's entity writer), and a client's side of the wire for the
tests. Part of the codec (cluster/kafka/codec/__init__.py has its rules).
"""

from __future__ import annotations

import io
from typing import Any

import kio.schema.errors
import kio.serial
import kio.serial.errors

from cluster.config import Limits
from cluster.kafka import messages as m
from cluster.kafka.codec.headers import SUPPORTED, Versions, _check_software, _read_header, _refused
from cluster.kafka.codec.primitives import (
    _CORRELATION_ID,
    _HEADER_FIXED,
    _INT8,
    _LEGACY_INT16_LENGTH,
    _LEGACY_INT32_LENGTH,
    _NULL_MARKER,
    _PRESENT_MARKER,
    LENGTH_PREFIX,
    _compact_length,
    _MalformedError,
    _need,
    _read_uvarint,
    _ReadLength,
    _skip_tagged_fields,
)
from cluster.kafka.codec.reader import _Budget
from cluster.kafka.codec.schemas import (
    _Field,
    _from_kio,
    _kio_fields,
    _request_schema,
    _response_schema,
    _to_kio,
)
from cluster.kafka.codec.writer import _framed


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


def kio_frame(correlation_id: int, kio_cls: type[Any], response: object) -> bytes:
    """The same frame as `_frame`, written by kio's own entity writer from kio's classes: the
    reference the tests hold `_frame` to, version by version."""
    entity = _to_kio(kio_cls, response)
    return _framed(
        correlation_id, kio_cls, lambda out: kio.serial.entity_writer(kio_cls)(out, entity)
    )


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


# -- the walk: every length checked before kio allocates anything --------------------------------


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
