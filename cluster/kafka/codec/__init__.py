"""Kafka's wire protocol: the one adapter to kio (Kafka's own JSON schemas, generated as one
dataclass per message and version, decoded in Rust).

Role: bytes of a request frame in, a `KafkaRequest` in our types out (cluster/kafka/messages/);
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

Modules: `headers` (headers, versions, ApiVersions' own answers), `reader` (requests read),
`writer` (responses written), `schemas` (kio's classes and how ours map onto them),
`reference` (kio's own reader and writer, the tests' reference, and a client's side).
"""

from __future__ import annotations

from cluster.config import Limits
from cluster.kafka import messages as m
from cluster.kafka.codec.headers import (
    SUPPORTED as SUPPORTED,
)
from cluster.kafka.codec.headers import (
    KafkaProtocolError as KafkaProtocolError,
)
from cluster.kafka.codec.headers import (
    Versions as Versions,
)
from cluster.kafka.codec.headers import (
    _check_software,
    _read_header,
    _refused,
)
from cluster.kafka.codec.headers import (
    api_versions_response as api_versions_response,
)
from cluster.kafka.codec.primitives import (
    ITEMS_PER_PARTITION_BOUND as ITEMS_PER_PARTITION_BOUND,
)
from cluster.kafka.codec.primitives import (
    LENGTH_PREFIX as LENGTH_PREFIX,
)
from cluster.kafka.codec.primitives import _MalformedError
from cluster.kafka.codec.reader import _Budget, _request_reader
from cluster.kafka.codec.reference import (
    decode_api_versions_fallback as decode_api_versions_fallback,
)
from cluster.kafka.codec.reference import (
    decode_response as decode_response,
)
from cluster.kafka.codec.reference import (
    encode_request as encode_request,
)
from cluster.kafka.codec.reference import (
    kio_decode_request as kio_decode_request,
)
from cluster.kafka.codec.reference import (
    kio_frame as kio_frame,
)
from cluster.kafka.codec.schemas import (
    _kind as _kind,
)
from cluster.kafka.codec.schemas import (
    _request_schema as _request_schema,
)
from cluster.kafka.codec.schemas import (
    _response_schema as _response_schema,
)
from cluster.kafka.codec.schemas import (
    schema_exists as schema_exists,
)
from cluster.kafka.codec.writer import (
    _frame as _frame,
)


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


def encode_response(header: m.RequestHeader, response: m.ResponseBody) -> bytes:
    """The whole frame (length prefix included) answering the request of `header`."""
    kio_cls = _response_schema(header.api_key, header.api_version)
    return _frame(header.correlation_id, kio_cls, response)
