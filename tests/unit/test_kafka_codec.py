"""The Kafka codec (cluster/kafka/codec.py): every supported API version round trips both ways,
headers v1 and v2, the ApiVersions answer for a version newer than ours (KIP-511), and the
decode path's one error type, whatever the bytes (a Hypothesis fuzz of random and mutated
frames, and lengths that claim more than there is: kio's native reader would allocate them).
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.config import Limits
from cluster.kafka import codec
from cluster.kafka import messages as m
from statemachine.errors import ErrorCode

LIMITS = Limits()
TOPIC_ID = uuid.UUID("5f1c2b6e-9b1e-4c1e-8a52-6d0a4f0b7e11")

REQUESTS: dict[m.Api, m.RequestBody] = {
    m.Api.API_VERSIONS: m.ApiVersionsRequest("librdkafka", "2.16.0"),
    m.Api.METADATA: m.MetadataRequest(
        (m.MetadataRequestTopic("orders", TOPIC_ID), m.MetadataRequestTopic("b", TOPIC_ID)),
        allow_auto_topic_creation=False,
    ),
    m.Api.DESCRIBE_CLUSTER: m.DescribeClusterRequest(True, 1, True),
    m.Api.CREATE_TOPICS: m.CreateTopicsRequest(
        (
            m.CreatableTopic(
                "orders",
                3,
                2,
                (m.CreatableReplicaAssignment(0, (1, 2)),),
                (m.CreatableTopicConfig("retention.ms", "1000"),),
            ),
        ),
        timeout=5_000,
        validate_only=True,
    ),
    m.Api.DELETE_TOPICS: m.DeleteTopicsRequest(
        ("orders", "b"), (m.DeleteTopicState("orders", TOPIC_ID),), timeout=3_000
    ),
    m.Api.LIST_OFFSETS: m.ListOffsetsRequest(
        (m.ListOffsetsTopic("orders", (m.ListOffsetsPartition(0, -2, 5),)),), -1, 1
    ),
    m.Api.INIT_PRODUCER_ID: m.InitProducerIdRequest("txn", 60_000, 1_000, 3),
    m.Api.DESCRIBE_PRODUCERS: m.DescribeProducersRequest((m.TopicRequest("orders", (0, 1)),)),
    m.Api.FIND_COORDINATOR: m.FindCoordinatorRequest("txn", 1, ("txn", "other")),
    m.Api.PRODUCE: m.ProduceRequest(
        -1, 30_000, (m.TopicProduceData("orders", (m.PartitionProduceData(0, b"batch"),)),)
    ),
    m.Api.FETCH: m.FetchRequest(
        500,
        1,
        (m.FetchTopic("orders", (m.FetchPartition(0, 10, 1_048_576, 4, 0),)),),
        max_bytes=4_194_304,
        isolation_level=1,
    ),
}

_PARTITION = m.MetadataResponsePartition(0, 0, 2, 7, (2, 1, 3), (2, 1), (3,))
RESPONSES: dict[m.Api, m.ResponseBody] = {
    m.Api.API_VERSIONS: m.ApiVersionsResponse(0, (m.ApiVersion(3, 0, 13),), 0),
    m.Api.METADATA: m.MetadataResponse(
        (m.MetadataResponseBroker(1, "127.0.0.2", 9092), m.MetadataResponseBroker(2, "h", 1)),
        (m.MetadataResponseTopic(0, "orders", TOPIC_ID, False, (_PARTITION,)),),
        "raftbroker",
        1,
    ),
    m.Api.DESCRIBE_CLUSTER: m.DescribeClusterResponse(
        0, "raftbroker", (m.DescribeClusterBroker(1, "127.0.0.2", 9092),), 1
    ),
    m.Api.CREATE_TOPICS: m.CreateTopicsResponse(
        (
            m.CreatableTopicResult(
                "orders", 36, "exists", TOPIC_ID, 3, 2, (m.CreatableTopicConfigs("a", "b"),)
            ),
        )
    ),
    m.Api.DELETE_TOPICS: m.DeleteTopicsResponse((m.DeletableTopicResult("orders", 0, TOPIC_ID),)),
    m.Api.LIST_OFFSETS: m.ListOffsetsResponse(
        (
            m.ListOffsetsTopicResponse(
                "orders", (m.ListOffsetsPartitionResponse(0, 0, 1_700_000_000_000, 42, 3),)
            ),
        )
    ),
    m.Api.INIT_PRODUCER_ID: m.InitProducerIdResponse(0, 1_000, 4),
    m.Api.DESCRIBE_PRODUCERS: m.DescribeProducersResponse(
        (
            m.TopicResponse(
                "orders", (m.PartitionResponse(0, 0, None, (m.ProducerState(7, 1, 9, 1_000),)),)
            ),
        )
    ),
    m.Api.FIND_COORDINATOR: m.FindCoordinatorResponse(
        0, None, 1, "127.0.0.2", 9092, (m.Coordinator("txn", 1, "127.0.0.2", 9092, 0),)
    ),
    m.Api.PRODUCE: m.ProduceResponse(
        (
            m.TopicProduceResponse(
                "orders", (m.PartitionProduceResponse(0, 0, 17, 1_700_000_000_123, 0),)
            ),
        )
    ),
    m.Api.FETCH: m.FetchResponse(
        (m.FetchableTopicResponse("orders", (m.PartitionData(0, 0, 20, 20, 0, records=b"r"),)),)
    ),
}


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
    ],
)
def test_malformed_requests_raise_the_one_error(body: bytes, why: str) -> None:
    with pytest.raises(codec.KafkaProtocolError, match=why):
        codec.decode_request(body, LIMITS)


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


def decodes_or_refuses(body: bytes) -> None:
    with contextlib.suppress(codec.KafkaProtocolError):
        codec.decode_request(body, LIMITS)


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
