"""The Kafka listener's wire: Kafka's framing, and whole-request refusals as each API answers.

Role: the `Wire` the node's `Server` (cluster/broker/server.py) speaks on the Kafka port, so
that every limit of the native listener holds here too. Frames and requests go through the codec
(cluster/kafka/codec/); answers are the frontend's responses, in the version asked.

Rules:
- A frame is a signed 4-byte big-endian length and that many bytes. A negative length, or one
  above `Limits.frame_bytes_max`, closes the connection before a byte of the body is read, as
  Kafka closes it (it has no error frame to send).
- A request that does not decode closes the connection, as Kafka does, except ApiVersions newer
  than ours, which is answered in v0 format (the codec builds that answer, KIP-511).
- Kafka has no generic error response: a request refused whole (`RaftbrokerError`: a deadline,
  a bug answered UNKNOWN_SERVER_ERROR) is answered with its API's own response carrying the
  code where that API carries codes, per topic and partition, group or member (each request
  class's `refusal`, cluster/kafka/messages/).
- A Produce with acks=0 is never answered, whatever its outcome.
"""

from __future__ import annotations

from cluster.broker.connection import Undecodable
from cluster.config import Limits
from cluster.errors import RaftbrokerError
from cluster.kafka import codec
from cluster.kafka import messages as m


class KafkaWire:
    """Kafka's protocol on the node's `Server`."""

    def __init__(
        self, limits: Limits, versions: codec.Versions = codec.SUPPORTED, name: str = "kafka"
    ) -> None:
        self._limits = limits
        self._versions = versions
        self.name = name  # the listener's, in logs and metrics: "kafka", "kafka_external"

    def take_frame(self, buf: bytearray, offset: int) -> tuple[bytes, int] | None:
        prefix = codec.LENGTH_PREFIX.size
        if len(buf) - offset < prefix:
            return None
        (length,) = codec.LENGTH_PREFIX.unpack_from(buf, offset)
        if length < 0:
            raise Undecodable(f"a negative frame length ({length})")
        if length > self._limits.frame_bytes_max:
            limit = self._limits.frame_bytes_max
            raise Undecodable(f"a frame of {length} bytes exceeds frame_bytes_max ({limit})")
        start = offset + prefix
        end = start + length
        if end > len(buf):
            return None
        with memoryview(buf) as view:  # one copy: a slice of the bytearray would be a second
            return bytes(view[start:end]), end

    def decode(self, body: bytes) -> tuple[int, m.KafkaRequest]:
        try:
            request = codec.decode_request(body, self._limits, self._versions)
        except codec.KafkaProtocolError as exc:
            answer = exc.answer
            raise Undecodable(exc.message, answer, keep_open=answer is not None) from None
        return request.header.correlation_id, request

    def encode(
        self,
        correlation_id: int,  # noqa: ARG002 - the request's header carries it
        request: m.KafkaRequest,
        outcome: m.ResponseBody | RaftbrokerError,
    ) -> bytes | None:
        body = request.body
        if isinstance(body, m.ProduceRequest) and body.acks == 0:
            return None
        if isinstance(outcome, RaftbrokerError):  # refused whole: its API's own answer
            outcome = body.refusal(int(outcome.error), outcome.message)
        return codec.encode_response(request.header, outcome)

    def describe(self, request: m.KafkaRequest) -> str:
        return f"{m.Api(request.api_key).name} v{request.api_version}"
