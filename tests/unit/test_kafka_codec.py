"""The Kafka codec (cluster/kafka/codec/): every supported API version round trips both ways,
headers v1 and v2, the ApiVersions answer for a version newer than ours (KIP-511), and the
decode path's one error type, whatever the bytes (a Hypothesis fuzz of random and mutated
frames, and lengths that claim more than there is: kio's native reader would allocate them).
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.protocol import commit as aio_commit
from aiokafka.protocol import group as aio_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import groups as kp3_admin
from kafka.protocol.consumer import group as kp3_group
from kafka.protocol.old import commit as kp2_commit
from kafka.protocol.old import group as kp2_group

from cluster.config import Limits
from cluster.kafka import codec
from cluster.kafka import messages as m
from statemachine.errors import ErrorCode
from tests.kafka_samples import REQUESTS, RESPONSES

LIMITS = Limits()


def every_version() -> Iterator[tuple[m.Api, int]]:
    for api, (low, high) in sorted(codec.SUPPORTED.items()):
        for version in range(low, high + 1):
            yield m.Api(api), version


VERSIONS = list(every_version())
IDS = [f"{api.name}-v{version}" for api, version in VERSIONS]


def header(api: m.Api, version: int, correlation_id: int = 7) -> m.RequestHeader:
    return m.RequestHeader(api, version, correlation_id, "test-client")


def test_the_table_covers_what_the_clients_need() -> None:
    for api, version in VERSIONS:
        assert codec.schema_exists(api, version), f"kio has no {api.name} v{version}"
    assert codec.SUPPORTED[m.Api.API_VERSIONS].min_version == 0  # aiokafka asks v0 first
    assert codec.SUPPORTED[m.Api.INIT_PRODUCER_ID].min_version == 0  # aiokafka knows only v0


@pytest.mark.parametrize(("api", "version"), VERSIONS, ids=IDS)
def test_a_request_round_trips(api: m.Api, version: int) -> None:
    frame = codec.encode_request(header(api, version), REQUESTS[api])
    request = codec.decode_request(frame[4:], LIMITS)
    assert request.header == header(api, version)
    assert codec.encode_request(request.header, request.body) == frame
    assert request == codec.kio_decode_request(frame[4:], LIMITS)


@pytest.mark.parametrize(("api", "version"), VERSIONS, ids=IDS)
def test_a_response_round_trips(api: m.Api, version: int) -> None:
    frame = codec.encode_response(header(api, version), RESPONSES[api])
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    correlation_id, response = codec.decode_response(header(api, version), frame[4:])
    assert correlation_id == 7
    assert codec.encode_response(header(api, version), response) == frame


def test_fields_a_version_lacks_take_our_defaults() -> None:
    frame = codec.encode_request(header(m.Api.METADATA, 3), REQUESTS[m.Api.METADATA])
    body = codec.decode_request(frame[4:], LIMITS).body
    assert isinstance(body, m.MetadataRequest)
    assert body.allow_auto_topic_creation is True  # v4 brought the field
    assert body.topics is not None
    assert [t.name for t in body.topics] == ["orders", "b"]
    assert {t.topic_id for t in body.topics} == {None}  # v10 brought topic ids


def test_header_v1_and_v2() -> None:
    v1 = codec.encode_request(header(m.Api.METADATA, 8), m.MetadataRequest(None))
    v2 = codec.encode_request(header(m.Api.METADATA, 9), m.MetadataRequest(None))
    # v1: key, version, correlation id, client id; v2 the same and an empty tagged-field list
    client = b"\x00\x0btest-client"
    assert v1[4:] == struct.pack(">hhi", 3, 8, 7) + client + v1[4 + 8 + len(client) :]
    assert v2[4 + 8 + len(client)] == 0  # no header tags
    # Kafka ignores header tags it does not know: tag 9 of 2 bytes
    tagged = v2[4 : 4 + 8 + len(client)] + b"\x01\x09\x02ab" + v2[4 + 8 + len(client) + 1 :]
    assert codec.decode_request(tagged, LIMITS).header.correlation_id == 7
    # a null client id
    null_client = struct.pack(">hhih", 3, 8, 9, -1) + v1[4 + 8 + len(client) :]
    assert codec.decode_request(null_client, LIMITS).header.client_id is None


def test_api_versions_request_header_is_v2_and_its_response_header_v0() -> None:
    frame = codec.encode_request(header(m.Api.API_VERSIONS, 3), REQUESTS[m.Api.API_VERSIONS])
    assert frame[4 + 8 + len("test-client") + 2] == 0  # the header's tagged fields
    answer = codec.encode_response(header(m.Api.API_VERSIONS, 3), RESPONSES[m.Api.API_VERSIONS])
    # v0 header (correlation id only), then error code 0 and a compact array of one key
    assert answer[4:12] == struct.pack(">ih", 7, 0) + b"\x02\x00"


def test_api_versions_newer_than_ours_is_answered_in_v0_with_our_versions() -> None:
    body = struct.pack(">hhih", 18, 99, 41, -1) + b"\x00garbage we cannot know"
    with pytest.raises(codec.KafkaProtocolError) as refused:
        codec.decode_request(body, LIMITS)
    answer = refused.value.answer
    assert answer is not None
    correlation_id, response = codec.decode_api_versions_fallback(answer[4:])
    assert correlation_id == 41
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == {
        k: tuple(r) for k, r in codec.SUPPORTED.items()
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\x00\x03\x00", "no header"),
        (struct.pack(">hhih", 999, 0, 1, -1), "unsupported API key"),
        (struct.pack(">hhih", 3, 99, 1, -1), "unsupported version"),
        (struct.pack(">hhih", 3, 1, 1, 5) + b"ab", "client id past the end"),
        (struct.pack(">hhih", 3, 1, 1, 2) + b"\xff\xfe" + b"\xff\xff\xff\xff", "not UTF-8"),
        (struct.pack(">hhih", 3, 1, 1, -7), "negative client id"),
        (struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", -5), "negative length"),
        (struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 2**31 - 1), "items"),
        (struct.pack(">hhih", 3, 12, 1, -1) + b"\x00\xff\xff\xff\xff\x0f", "length or count"),
        (struct.pack(">hhih", 3, 12, 1, -1) + b"\x00\x80\x80\x80\x80\x80\x01", "longer than 5"),
        (struct.pack(">hhih", 3, 12, 1, -1) + b"\x00\x01\x00\x00\x01\x05\x00", "tagged"),
        # a null array where the version allows none: OffsetFetch v1's topics (v2+ may be null)
        (struct.pack(">hhih", 9, 1, 1, -1) + b"\x00\x01g" + struct.pack(">i", -1), "null array"),
        (struct.pack(">hhih", 42, 0, 1, -1) + struct.pack(">i", -1), "null array"),
    ],
)
def test_malformed_requests_raise_the_one_error(body: bytes, why: str) -> None:
    with pytest.raises(codec.KafkaProtocolError, match=why):
        codec.decode_request(body, LIMITS)


def test_a_null_array_is_read_where_the_version_allows_one() -> None:
    body = struct.pack(">hhih", 9, 2, 1, -1) + b"\x00\x01g" + struct.pack(">i", -1)
    assert codec.decode_request(body, LIMITS).body == m.OffsetFetchRequest("g", None)


def test_bytes_after_the_request_are_ignored_as_kafka_ignores_them() -> None:
    # librdkafka 2.16's all-topics Metadata v13: a 4-byte placeholder where the compact null
    # array (one byte) belongs, so three bytes follow what Kafka's parser reads.
    body = bytes.fromhex("0003000d00000003000772646b61666b610000000000010000")
    request = codec.decode_request(body, LIMITS)
    assert request.body == m.MetadataRequest(None, allow_auto_topic_creation=False)


def test_counts_are_bounded_by_the_limits() -> None:
    small = Limits(partitions_per_request_max=2)
    topics = tuple(m.MetadataRequestTopic(f"t{i}") for i in range(3))
    frame = codec.encode_request(header(m.Api.METADATA, 12), m.MetadataRequest(topics))
    with pytest.raises(codec.KafkaProtocolError, match="at most 2"):
        codec.decode_request(frame[4:], small)
    assert codec.decode_request(frame[4:], LIMITS).body == m.MetadataRequest(topics)


def test_every_truncation_of_every_request_is_refused() -> None:
    for api, version in VERSIONS:
        frame = codec.encode_request(header(api, version), REQUESTS[api])
        for cut in range(4, len(frame) - 1):
            with pytest.raises(codec.KafkaProtocolError):
                codec.decode_request(frame[4:cut], LIMITS)


def test_api_versions_with_a_bad_software_name_is_refused() -> None:
    bad = m.ApiVersionsRequest("-bad name", "1.0")
    frame = codec.encode_request(header(m.Api.API_VERSIONS, 3), bad)
    with pytest.raises(codec.KafkaProtocolError, match="client software"):
        codec.decode_request(frame[4:], LIMITS)


# -- the fuzz: only KafkaProtocolError, whatever comes --------------------------------------------

VALID_FRAMES = [
    codec.encode_request(header(api, version), REQUESTS[api])[4:] for api, version in VERSIONS
]
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(decode: Any, body: bytes) -> m.KafkaRequest | str:
    try:
        return decode(body, LIMITS)  # type: ignore[no-any-return]
    except codec.KafkaProtocolError as exc:
        return f"refused, correlation id {exc.correlation_id}, answer {exc.answer!r}"


def decodes_or_refuses(body: bytes) -> None:
    """KafkaProtocolError or a request, and the same as kio's own reader after the walk (the
    reference): the same request read, or both refused."""
    ours = outcome(codec.decode_request, body)
    reference = outcome(codec.kio_decode_request, body)
    assert ours == reference, (ours, reference)


@pytest.mark.parametrize("byte", [0x02, 0xFF])
def test_every_byte_of_every_request_replaced_reads_as_kio_reads_it(byte: int) -> None:
    """Each byte of each valid request in turn: a boolean of 2, a length of 255 or -1, a
    varint that goes on, a bad UTF-8 byte; read as kio reads it, or refused as kio refuses."""
    for body in VALID_FRAMES:
        for at in range(len(body)):
            decodes_or_refuses(body[:at] + bytes((byte,)) + body[at + 1 :])


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes(body: bytes) -> None:
    decodes_or_refuses(body)


@FUZZ
@given(st.sampled_from(VERSIONS), st.binary(max_size=200))
def test_random_bodies_behind_valid_headers(version: tuple[m.Api, int], tail: bytes) -> None:
    api, v = version
    head = struct.pack(">hhih", api, v, 1, -1)
    decodes_or_refuses(head + tail)
    decodes_or_refuses(head + b"\x00" + tail)  # flexible: an empty tagged-field list first


@FUZZ
@given(
    st.sampled_from(VALID_FRAMES),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    st.sampled_from(["replace", "insert", "delete"]),
)
def test_mutated_valid_requests(body: bytes, edits: list[tuple[int, int]], how: str) -> None:
    mutated = bytearray(body)
    for where, byte in edits:
        at = where % (len(mutated) + 1)
        if how == "insert":
            mutated.insert(at, byte)
        elif at < len(mutated) and how == "replace":
            mutated[at] = byte
        elif at < len(mutated):
            del mutated[at]
    decodes_or_refuses(bytes(mutated))


@FUZZ
@given(st.sampled_from(VALID_FRAMES), st.integers(8, 400), st.sampled_from([4, 5]))
def test_huge_lengths_spliced_into_valid_requests(body: bytes, at: int, width: int) -> None:
    """A count or length of 2^31-1 (or a 5-byte varint) anywhere: refused, never allocated."""
    at = min(at, len(body))
    huge = b"\x7f\xff\xff\xff" if width == 4 else b"\xff\xff\xff\xff\x07"
    decodes_or_refuses(body[:at] + huge + body[at:])
    decodes_or_refuses(body[:at] + huge + body[at + width :])


@pytest.mark.parametrize("version", range(4, 13))
def test_a_fetch_partition_in_error_carries_empty_records_never_null(version: int) -> None:
    """As Kafka answers: librdkafka cannot parse a null (`invalid MessageSetSize -1`), so it
    never saw the NOT_LEADER_OR_FOLLOWER and fetched from the old leader again, in a loop
    (found by `raftbroker chaos run --client kafka`)."""
    error = ErrorCode.NOT_LEADER_OR_FOLLOWER
    partition = m.PartitionData(0, error)
    answer = m.FetchResponse((m.FetchableTopicResponse("orders", (partition,)),))
    frame = codec.encode_response(header(m.Api.FETCH, version), answer)
    _, decoded = codec.decode_response(header(m.Api.FETCH, version), frame[4:])
    assert isinstance(decoded, m.FetchResponse)
    assert decoded.responses[0].partitions[0].records == b""


@pytest.mark.parametrize(("api", "version"), VERSIONS, ids=IDS)
def test_a_response_is_written_as_kio_writes_it(api: m.Api, version: int) -> None:
    """The listener writes answers from our classes directly (`_frame`); kio's own writer, fed
    kio's classes, is the reference: the same bytes, tagged fields included."""
    kio_cls = codec._response_schema(api, version)
    for response in (RESPONSES[api], *TAGGED_RESPONSES.get(api, ())):
        assert codec._frame(7, kio_cls, response) == codec.kio_frame(7, kio_cls, response)


# Answers whose tagged fields hold values other than their defaults (KIP-951's leader hints).
TAGGED_RESPONSES: dict[m.Api, tuple[m.ResponseBody, ...]] = {
    m.Api.PRODUCE: (
        m.ProduceResponse(
            (
                m.TopicProduceResponse(
                    "orders",
                    (
                        m.PartitionProduceResponse(
                            0,
                            int(ErrorCode.NOT_LEADER_OR_FOLLOWER),
                            current_leader=m.LeaderIdAndEpoch(2, 5),
                        ),
                    ),
                ),
            ),
            node_endpoints=(m.NodeEndpoint(2, "127.0.0.3", 9092, None),),
        ),
    ),
}


# -- our names are kio's -------------------------------------------------------------------------


def unknown_to_kio(ours: type[Any], kio_classes: list[type[Any]], path: str) -> Iterator[str]:
    """Our fields, nested ones too, that no version of kio's class has: the codec maps by name,
    so a misnamed field would silently keep its default both ways."""
    hints = typing.get_type_hints(ours)
    for field in dataclasses.fields(ours):
        theirs = [f for k in kio_classes for f in dataclasses.fields(k) if f.name == field.name]
        if not theirs:
            yield f"{path}.{field.name}"
            continue
        nested = codec._kind(hints[field.name]).nested
        if nested is not None:
            kio_nested = [codec._kind(f.type).nested for f in theirs]
            yield from unknown_to_kio(
                nested, [k for k in kio_nested if k is not None], f"{path}.{field.name}"
            )


# Fields of versions newer than we serve: written by none of ours (Fetch v16+, KIP-951).
BEYOND_OUR_VERSIONS = {"FetchResponse.node_endpoints"}


@pytest.mark.parametrize("api", sorted(codec.SUPPORTED), ids=lambda api: m.Api(api).name)
def test_every_field_of_ours_is_named_as_kio_names_it(api: int) -> None:
    low, high = codec.SUPPORTED[api]
    request, response = m.MESSAGES[m.Api(api)]
    requests = [codec._request_schema(api, v) for v in range(low, high + 1)]
    responses = [codec._response_schema(api, v) for v in range(low, high + 1)]
    assert set(unknown_to_kio(request, requests, request.__name__)) == set()
    unknown = set(unknown_to_kio(response, responses, response.__name__))
    assert unknown - BEYOND_OUR_VERSIONS == set()


# -- the group APIs as Kafka's Python clients write and read them --------------------------------
#
# Each client's own classes, fed the values of REQUESTS and RESPONSES, must write our bytes
# (kio's): then what we decode is what the client meant, and what we answer is what it reads.

GROUP_APIS = (
    m.Api.JOIN_GROUP,
    m.Api.SYNC_GROUP,
    m.Api.HEARTBEAT,
    m.Api.LEAVE_GROUP,
    m.Api.OFFSET_COMMIT,
    m.Api.OFFSET_FETCH,
    m.Api.DESCRIBE_GROUPS,
    m.Api.LIST_GROUPS,
    m.Api.DELETE_GROUPS,
)
GROUP_VERSIONS = [(api, v) for api, v in VERSIONS if api in GROUP_APIS]
GROUP_IDS = [f"{api.name}-v{version}" for api, version in GROUP_VERSIONS]

# kafka-python 3.0: one class per message, every version, built by field name (Kafka's, as
# kio's but with `_ms` on durations).
KAFKA_PYTHON_3: dict[m.Api, tuple[Any, Any]] = {
    m.Api.JOIN_GROUP: (kp3_group.JoinGroupRequest, kp3_group.JoinGroupResponse),
    m.Api.SYNC_GROUP: (kp3_group.SyncGroupRequest, kp3_group.SyncGroupResponse),
    m.Api.HEARTBEAT: (kp3_group.HeartbeatRequest, kp3_group.HeartbeatResponse),
    m.Api.LEAVE_GROUP: (kp3_group.LeaveGroupRequest, kp3_group.LeaveGroupResponse),
    m.Api.OFFSET_COMMIT: (kp3_group.OffsetCommitRequest, kp3_group.OffsetCommitResponse),
    m.Api.OFFSET_FETCH: (kp3_group.OffsetFetchRequest, kp3_group.OffsetFetchResponse),
    m.Api.DESCRIBE_GROUPS: (kp3_admin.DescribeGroupsRequest, kp3_admin.DescribeGroupsResponse),
    m.Api.LIST_GROUPS: (kp3_admin.ListGroupsRequest, kp3_admin.ListGroupsResponse),
    m.Api.DELETE_GROUPS: (kp3_admin.DeleteGroupsRequest, kp3_admin.DeleteGroupsResponse),
}


def kafka_python_3(cls: Any, ours: object, version: int | None = None) -> Any:
    """kafka-python 3.0's message of `cls` holding our values (a field it lacks: KeyError)."""
    fields = cls.fields
    values: dict[str, Any] = {}
    for field in dataclasses.fields(ours):  # type: ignore[arg-type]
        name = field.name if field.name in fields else f"{field.name}_ms"
        value = getattr(ours, field.name)
        if value is not None and fields[name].is_struct_array():
            value = [kafka_python_3(fields[name].data_class, item) for item in value]
        elif isinstance(value, tuple):
            value = list(value)
        elif name == "authorized_operations":  # a set of bit numbers to kafka-python
            value = {bit for bit in range(32) if value >> bit & 1}
        values[name] = value
    return cls(version=version, **values)


@pytest.mark.parametrize(("api", "version"), GROUP_VERSIONS, ids=GROUP_IDS)
def test_kafka_python_3_writes_our_requests_and_reads_our_responses(
    api: m.Api, version: int
) -> None:
    request_cls, response_cls = KAFKA_PYTHON_3[api]
    sent = kafka_python_3(request_cls, REQUESTS[api], version)
    sent.with_header(correlation_id=7, client_id="test-client")
    frame = bytes(sent.encode(header=True))
    assert frame == codec.encode_request(header(api, version), REQUESTS[api])[4:]
    read_by_us = codec.decode_request(frame, LIMITS)
    assert codec.encode_request(read_by_us.header, read_by_us.body)[4:] == frame
    answer = codec.encode_response(header(api, version), RESPONSES[api])[4:]
    expected = kafka_python_3(response_cls, RESPONSES[api], version)
    expected.with_header(correlation_id=7)
    assert bytes(expected.encode(header=True)) == answer
    read = response_cls.decode(answer, version=version, header=True)
    assert bytes(read.encode(header=True)) == answer


def legacy_fields(api: m.Api, version: int) -> tuple[Any, ...]:
    """REQUESTS[api] as kafka-python 2.x's and aiokafka's classes take it: the fields of
    `version` in Kafka's order, nested ones as tuples."""

    def since(first: int, *values: object) -> tuple[object, ...]:
        return values if version >= first else ()

    body = REQUESTS[api]
    match body:
        case m.JoinGroupRequest():
            protocols = [(p.name, p.metadata) for p in body.protocols]
            return (
                body.group_id,
                body.session_timeout,
                *since(1, body.rebalance_timeout),
                body.member_id,
                *since(5, body.group_instance_id),
                body.protocol_type,
                protocols,
            )
        case m.SyncGroupRequest():
            assignments = [(a.member_id, a.assignment) for a in body.assignments]
            fixed = (body.group_id, body.generation_id, body.member_id)
            return (*fixed, *since(3, body.group_instance_id), assignments)
        case m.HeartbeatRequest():
            fixed = (body.group_id, body.generation_id, body.member_id)
            return (*fixed, *since(3, body.group_instance_id))
        case m.LeaveGroupRequest():
            if version < 3:
                return (body.group_id, body.member_id)
            return (body.group_id, [(i.member_id, i.group_instance_id) for i in body.members])
        case m.OffsetCommitRequest():
            topics = [
                (
                    t.name,
                    [
                        (
                            p.partition_index,
                            p.committed_offset,
                            *since(6, p.committed_leader_epoch),
                            p.committed_metadata,
                        )
                        for p in t.partitions
                    ],
                )
                for t in body.topics
            ]
            return (
                body.group_id,
                body.generation_id_or_member_epoch,
                body.member_id,
                *(() if version > 4 else (body.retention_time,)),
                *since(7, body.group_instance_id),
                topics,
            )
        case m.OffsetFetchRequest(topics=topics) if topics is not None:
            return (body.group_id, [(t.name, list(t.partition_indexes)) for t in topics])
    raise AssertionError(f"no legacy fields for {api.name}")


# kafka-python 2.x's classes (kafka-python 3.0 keeps them, under Kafka's field names, as
# kafka.protocol.old), request and response of each version; aiokafka's request classes (each
# names its response).
KAFKA_PYTHON_2 = {
    m.Api.JOIN_GROUP: (kp2_group.JoinGroupRequest, kp2_group.JoinGroupResponse),
    m.Api.SYNC_GROUP: (kp2_group.SyncGroupRequest, kp2_group.SyncGroupResponse),
    m.Api.HEARTBEAT: (kp2_group.HeartbeatRequest, kp2_group.HeartbeatResponse),
    m.Api.LEAVE_GROUP: (kp2_group.LeaveGroupRequest, kp2_group.LeaveGroupResponse),
    m.Api.OFFSET_COMMIT: (kp2_commit.OffsetCommitRequest, kp2_commit.OffsetCommitResponse),
    m.Api.OFFSET_FETCH: (kp2_commit.OffsetFetchRequest, kp2_commit.OffsetFetchResponse),
}
AIOKAFKA = {
    m.Api.JOIN_GROUP: aio_group.JoinGroupRequest,
    m.Api.SYNC_GROUP: aio_group.SyncGroupRequest,
    m.Api.HEARTBEAT: aio_group.HeartbeatRequest,
    m.Api.LEAVE_GROUP: aio_group.LeaveGroupRequest,
    m.Api.OFFSET_COMMIT: aio_commit.OffsetCommitRequest,
    m.Api.OFFSET_FETCH: aio_commit.OffsetFetchRequest,
}


def served(api: m.Api, version: int) -> bool:
    low, high = codec.SUPPORTED[api]
    return low <= version <= high


LEGACY = [
    *(
        ("kafka-python-2", api, request, response)
        for api, (requests, responses) in KAFKA_PYTHON_2.items()
        for request, response in zip(requests, responses, strict=True)
        if served(api, request.API_VERSION)
    ),
    *(
        ("aiokafka", api, request, request.RESPONSE_TYPE)
        for api, builder in AIOKAFKA.items()
        for request in builder._CLASSES
        if served(api, request.API_VERSION)
    ),
]


@pytest.mark.parametrize(
    ("client", "api", "request_cls", "response_cls"),
    LEGACY,
    ids=[f"{c}-{api.name}-v{r.API_VERSION}" for c, api, r, _ in LEGACY],
)
def test_kafka_python_2_and_aiokafka_write_our_requests_and_read_our_responses(
    client: str, api: m.Api, request_cls: Any, response_cls: Any
) -> None:
    version = request_cls.API_VERSION
    assert version == response_cls.API_VERSION
    body = request_cls(*legacy_fields(api, version)).encode()
    frame = codec.encode_request(header(api, version), REQUESTS[api])[4:]
    head = struct.pack(">hhih", api, version, 7, len("test-client")) + b"test-client"
    assert head + body == frame, f"{client} writes other bytes"
    read_by_us = codec.decode_request(head + body, LIMITS)
    assert codec.encode_request(read_by_us.header, read_by_us.body)[4:] == head + body
    answer = codec.encode_response(header(api, version), RESPONSES[api])[8:]  # past header v0
    assert response_cls.decode(answer).encode() == answer, f"{client} reads other fields"


# The newest version of each group API each client sends (it takes the newest both sides know):
# librdkafka 2.0-2.15's src/rdkafka_request.c (confluent-kafka bundles 2.16), kafka-python
# 2.3's coordinator and admin client (2.1+ negotiate; 2.0 picks by the broker version it infers:
# JoinGroup v0-v2, SyncGroup, Heartbeat and LeaveGroup v0-v1, OffsetCommit v2, OffsetFetch v1),
# kafka-python 3.0's (the caps it passes, else every version its schemas have), aiokafka 0.14's
# classes (0.11 sends OffsetCommit v2 and OffsetFetch v1 only).
NEWEST_SENT = {
    "librdkafka": {
        m.Api.JOIN_GROUP: 5,
        m.Api.SYNC_GROUP: 3,
        m.Api.HEARTBEAT: 3,
        m.Api.LEAVE_GROUP: 1,
        m.Api.OFFSET_COMMIT: 9,
        m.Api.OFFSET_FETCH: 9,
        m.Api.DESCRIBE_GROUPS: 5,
        m.Api.LIST_GROUPS: 5,
        m.Api.DELETE_GROUPS: 2,
    },
    "kafka-python-2": {
        m.Api.JOIN_GROUP: 5,
        m.Api.SYNC_GROUP: 3,
        m.Api.HEARTBEAT: 3,
        m.Api.LEAVE_GROUP: 3,
        m.Api.OFFSET_COMMIT: 7,
        m.Api.OFFSET_FETCH: 5,
        m.Api.DESCRIBE_GROUPS: 3,
        m.Api.LIST_GROUPS: 2,
        m.Api.DELETE_GROUPS: 1,
    },
    "kafka-python-3": {
        m.Api.JOIN_GROUP: 7,
        m.Api.SYNC_GROUP: 5,
        m.Api.HEARTBEAT: 4,
        m.Api.LEAVE_GROUP: 5,
        m.Api.OFFSET_COMMIT: 8,
        m.Api.OFFSET_FETCH: 8,
        m.Api.DESCRIBE_GROUPS: 6,
        m.Api.LIST_GROUPS: 5,
        m.Api.DELETE_GROUPS: 2,
    },
    "aiokafka": {
        **{api: max(c.API_VERSION for c in builder._CLASSES) for api, builder in AIOKAFKA.items()},
        m.Api.DESCRIBE_GROUPS: 3,
        m.Api.LIST_GROUPS: 2,
        m.Api.DELETE_GROUPS: 1,
    },
}
OLDEST_SENT = {  # kafka-python 2.0 and aiokafka 0.11, by the broker version they infer
    m.Api.JOIN_GROUP: 0,
    m.Api.SYNC_GROUP: 0,
    m.Api.HEARTBEAT: 0,
    m.Api.LEAVE_GROUP: 0,
    m.Api.OFFSET_COMMIT: 2,
    m.Api.OFFSET_FETCH: 1,
}


@pytest.mark.parametrize("client", sorted(NEWEST_SENT))
def test_every_group_api_version_a_client_picks_is_served(client: str) -> None:
    for api, newest in NEWEST_SENT[client].items():
        low, high = codec.SUPPORTED[api]
        assert low <= min(newest, high), f"{client} can pick no {api.name} we serve"


def test_the_oldest_group_api_versions_a_client_sends_are_served() -> None:
    for api, oldest in OLDEST_SENT.items():
        assert served(api, oldest), f"{api.name} v{oldest}"
