"""Kafka's request headers and the version table: a frame's header read (v1, or v2 with tagged
fields), its API and version checked against what this listener serves, ApiVersions'
own answers (KIP-511). Part of the codec (cluster/kafka/codec/__init__.py has its rules).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from cluster.errors import ProtocolError, quoted
from cluster.kafka import messages as m
from cluster.kafka.codec.primitives import _HEADER_FIXED, _MalformedError, _skip_tagged_fields
from cluster.kafka.codec.schemas import _request_schema, _response_schema
from cluster.kafka.codec.writer import _frame
from statemachine.errors import ErrorCode

# Kafka's ApiVersionsRequest.isValid: client software name and version.
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


Versions = Mapping[int, m.VersionRange]


# What this listener serves, each API from the oldest to the newest version we answer: every
# request class's own (cluster/kafka/messages/); docs: README, "Using Kafka clients".
SUPPORTED: Versions = MappingProxyType({api: cls.VERSIONS for api, cls in m.REQUESTS.items()})


class KafkaProtocolError(ProtocolError):
    """Bytes that are not a Kafka request we serve (INVALID_REQUEST). `answer`, when not None,
    is the whole frame to send back (ApiVersions newer than ours); otherwise the connection is
    closed, as Kafka does with a request it cannot parse."""

    def __init__(
        self, message: str, correlation_id: int | None = None, answer: bytes | None = None
    ) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message, correlation_id)
        self.answer = answer


# -- decoding requests ---------------------------------------------------------------------------


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
