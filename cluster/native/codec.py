"""Native frames and bodies: bytes from a socket into typed requests and responses and back.

Rules:
- A frame is a 4-byte big-endian unsigned length, then that many bytes of msgpack. A length
  above `Limits.frame_bytes_max` is refused before a byte of the body is read.
- A request body is `[PROTOCOL_VERSION, correlation_id, op, payload]`; a response body is
  `[PROTOCOL_VERSION, correlation_id, error_code, payload]`, whose payload is the response's
  fields when `error_code` is NONE and an `ErrorInfo` otherwise. `[version, correlation_id]`
  is the fixed prefix of every version, so an error can be answered to the right request.
- Decoding is strict and total: anything malformed raises `ProtocolError` and nothing else,
  carrying the correlation id whenever it could be read. Malformed content is INVALID_REQUEST,
  an unknown version or op UNSUPPORTED_VERSION, an oversize frame MESSAGE_TOO_LARGE.
- Encoding does not validate: what it writes, a decoder checks.
This is the one module of the native protocol that imports msgpack itself, for one thing:
`msgpack.Unpacker` peeks at a correlation id without decoding a whole body; the bodies go
through `statemachine.codec`.
"""

from __future__ import annotations

import asyncio
import struct

import msgpack

from cluster.config import Limits
from cluster.errors import ProtocolError
from cluster.native.messages import BY_OP
from cluster.native.messages.base import ErrorInfo, ErrorResponse, Request, Response
from cluster.native.schema import DEFAULT_WIRE_LIMITS, Struct, dump_struct, load_payload
from statemachine.codec import CodecError, pack, unpack
from statemachine.commands import INT32_MAX
from statemachine.errors import ErrorCode
from statemachine.fields import (
    known_error_code,
)

PROTOCOL_VERSION = 2  # 2: transactions (read_committed fetches, the transaction requests)
LENGTH_PREFIX = struct.Struct(">I")


# -- Frames and bodies ---------------------------------------------------------------------------


def _is_correlation_id(value: object) -> bool:
    return type(value) is int and 0 <= value <= INT32_MAX


def _frame(correlation_id: int, second: int, payload: Struct) -> bytes:
    if not _is_correlation_id(correlation_id):
        raise ValueError(f"a correlation id is an integer in [0, {INT32_MAX}]")
    body = pack([PROTOCOL_VERSION, correlation_id, second, dump_struct(payload)])
    return LENGTH_PREFIX.pack(len(body)) + body


def encode_request(correlation_id: int, request: Request) -> bytes:
    """The whole frame (length prefix included) of one request."""
    return _frame(correlation_id, int(request.OP), request)


def encode_response(
    correlation_id: int,
    answer: Response | ErrorResponse | ErrorInfo,
    error: ErrorCode = ErrorCode.NONE,
) -> bytes:
    """The whole frame of an answer: a Response, an ErrorResponse, or an ErrorInfo with `error`."""
    code, payload = _error_and_payload(answer, error)
    return _frame(correlation_id, int(code), payload)


def _error_and_payload(
    answer: Response | ErrorResponse | ErrorInfo, error: ErrorCode
) -> tuple[ErrorCode, Struct]:
    if isinstance(answer, ErrorResponse):
        if error not in (ErrorCode.NONE, answer.error):
            raise ValueError("an ErrorResponse carries its own error code")
        return answer.error, answer.info
    if isinstance(answer, ErrorInfo):
        if error == ErrorCode.NONE:
            raise ValueError("an ErrorInfo needs an error code other than NONE")
        return error, answer
    if error != ErrorCode.NONE:
        raise ValueError("an error answer carries an ErrorInfo, not a response")
    return ErrorCode.NONE, answer


def peek_correlation_id(body: bytes) -> int:
    """The correlation id of a request or response body, reading only its first items."""
    correlation_id = _peek(body)
    if correlation_id is None:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, "no readable correlation id")
    return correlation_id


def _peek(body: bytes) -> int | None:
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=max(len(body), 1))
    try:
        unpacker.feed(body)
        if unpacker.read_array_header() < 2:
            return None
        unpacker.skip()
        value = unpacker.unpack()
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    return value if _is_correlation_id(value) else None


def _unpack(body: bytes, limits: Limits) -> object:
    if len(body) > limits.frame_bytes_max:
        message = f"a body of {len(body)} bytes exceeds the limit of {limits.frame_bytes_max}"
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message, _peek(body))
    try:
        return unpack(body, size_max=limits.frame_bytes_max)
    except CodecError as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, str(exc), _peek(body)) from None


def _header(raw: object) -> tuple[int, object, object]:
    """The correlation id, op-or-error and payload of a body, or ProtocolError."""
    if type(raw) is not tuple or len(raw) < 2 or not _is_correlation_id(raw[1]):
        message = "a body is [version, correlation_id, ...]"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, None)
    version, correlation_id = raw[0], raw[1]
    if type(version) is not int or version != PROTOCOL_VERSION:
        message = f"unsupported protocol version {version!r}"
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, message, correlation_id)
    if len(raw) != 4:
        message = f"a body of version {PROTOCOL_VERSION} has 4 items, not {len(raw)}"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, correlation_id)
    return correlation_id, raw[2], raw[3]


def decode_request(body: bytes, limits: Limits) -> tuple[int, Request]:
    """The correlation id and request of a frame body; ProtocolError for anything else."""
    correlation_id, op, payload = _header(_unpack(body, limits))
    cls = BY_OP.get(op) if type(op) is int else None
    if cls is None:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"unknown op {op!r}", correlation_id)
    return correlation_id, load_payload(cls, payload, limits, correlation_id)


def decode_response(
    body: bytes, request_type: type[Request], limits: Limits = DEFAULT_WIRE_LIMITS
) -> tuple[int, Response | ErrorResponse]:
    """The correlation id and answer of a frame body sent for a `request_type` request."""
    correlation_id, error, payload = split_response(body, limits)
    return correlation_id, load_response(correlation_id, error, payload, request_type, limits)


def split_response(body: bytes, limits: Limits = DEFAULT_WIRE_LIMITS) -> tuple[int, object, object]:
    """A response body's correlation id, error code and payload, still raw: a client reads
    which request it answers from the one decode of the body, then `load_response`s it."""
    return _header(_unpack(body, limits))


def load_response(
    correlation_id: int,
    error: object,
    payload: object,
    request_type: type[Request],
    limits: Limits = DEFAULT_WIRE_LIMITS,
) -> Response | ErrorResponse:
    """The answer in a `split_response` body sent for a `request_type` request."""
    code = known_error_code(error)
    if code is None:
        message = f"unknown error code {error!r}"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, correlation_id)
    if code != ErrorCode.NONE:
        return ErrorResponse(code, load_payload(ErrorInfo, payload, limits, correlation_id))
    return load_payload(request_type.RESPONSE, payload, limits, correlation_id)


async def read_frame(reader: asyncio.StreamReader, frame_bytes_max: int) -> bytes:
    """The body of the next frame; ProtocolError (body unread) if its length exceeds the limit.

    Raises asyncio.IncompleteReadError at end of stream; the caller applies timeouts.
    """
    (length,) = LENGTH_PREFIX.unpack(await reader.readexactly(LENGTH_PREFIX.size))
    _check_frame_length(length, frame_bytes_max)
    return await reader.readexactly(length)


def take_frame(buf: bytearray, offset: int, frame_bytes_max: int) -> tuple[bytes, int] | None:
    """`read_frame` for a protocol's input buffer: the body of the frame at `offset` and the
    offset after it, or None until all of it has arrived; ProtocolError (body unread) if its
    length exceeds the limit."""
    if len(buf) - offset < LENGTH_PREFIX.size:
        return None
    (length,) = LENGTH_PREFIX.unpack_from(buf, offset)
    _check_frame_length(length, frame_bytes_max)
    start = offset + LENGTH_PREFIX.size
    end = start + length
    if end > len(buf):
        return None
    with memoryview(buf) as view:  # one copy: a slice of the bytearray would be a second
        return bytes(view[start:end]), end


def whole_frame(data: bytes, frame_bytes_max: int) -> bool:
    """Whether `data` is exactly one frame, whole, of an allowed length."""
    if len(data) < LENGTH_PREFIX.size:
        return False
    length: int = LENGTH_PREFIX.unpack_from(data)[0]
    return length <= frame_bytes_max and len(data) == LENGTH_PREFIX.size + length


def _check_frame_length(length: int, frame_bytes_max: int) -> None:
    if length > frame_bytes_max:
        message = f"a frame of {length} bytes exceeds the limit of {frame_bytes_max}"
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message)
