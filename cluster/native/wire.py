"""The native listener's wire: how its frames become requests and its answers frames.

Role: the `Wire` (cluster/broker/connection.py) the node's `Server` uses for the native
protocol, over its codec (codec.py). Kafka's twin is cluster/kafka/wire.py.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster.broker.connection import Undecodable
from cluster.config import Limits
from cluster.errors import ERROR_MESSAGE_CHARS_MAX, ProtocolError, RaftbrokerError
from cluster.native.codec import decode_request, encode_response, take_frame
from cluster.native.messages.base import ErrorInfo, Request, Response
from statemachine.errors import ErrorCode

# What a native handler answers a request with: a response, or an exception. A
# `RaftbrokerError` (a `RequestRefusedError` above all) is a whole-request refusal, answered with
# its code; any other exception is a bug, logged and answered UNKNOWN_SERVER_ERROR.
Outcome = Response | Exception
Respond = Callable[[Outcome], None]


class NativeWire:
    """The native protocol (cluster/native/): an oversize frame is answered
    MESSAGE_TOO_LARGE (its body never read) and the connection closed; a body that does not
    decode is answered when its correlation id can be read, else the connection is closed."""

    name = "client"

    def __init__(self, limits: Limits) -> None:
        self._limits = limits

    def take_frame(self, buf: bytearray, offset: int) -> tuple[bytes, int] | None:
        try:
            return take_frame(buf, offset, self._limits.frame_bytes_max)
        except ProtocolError as exc:
            raise Undecodable(exc.message, _error_frame(0, exc.error, exc.message)) from None

    def decode(self, body: bytes) -> tuple[int, Request]:
        try:
            return decode_request(body, self._limits)
        except ProtocolError as exc:
            if exc.correlation_id is None:
                raise Undecodable(exc.message) from None
            answer = _error_frame(exc.correlation_id, exc.error, exc.message)
            raise Undecodable(exc.message, answer, keep_open=True) from None

    def encode(
        self, correlation_id: int, request: Request, outcome: Response | RaftbrokerError
    ) -> bytes:
        del request  # a native answer needs only the correlation id
        if isinstance(outcome, RaftbrokerError):
            return _error_frame(correlation_id, outcome.error, outcome.message, outcome.leader)
        return encode_response(correlation_id, outcome)

    def describe(self, request: Request) -> str:
        return type(request).__name__


def _error_frame(correlation_id: int, error: ErrorCode, message: str, leader: str = "") -> bytes:
    """A whole-request refusal, its message cut short (the wire would take TEXT_CHARS_MAX)."""
    return encode_response(
        correlation_id, ErrorInfo(message[:ERROR_MESSAGE_CHARS_MAX], leader), error
    )
