"""cluster.protocol: frames, the strict decoders, error answers, `read_frame` and `take_frame`.

Pure tests: bodies are built with msgpack by hand, and `read_frame` reads from an
`asyncio.StreamReader` fed with bytes, never from a socket.
"""

from __future__ import annotations

import ast
import asyncio
import typing
from pathlib import Path

import msgpack
import pytest

from cluster import native as p
from cluster.config import Limits
from cluster.errors import RaftbrokerError
from statemachine import fields as f
from statemachine.errors import ErrorCode
from statemachine.limits import KIB

LIMITS = Limits()
CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
PRODUCE, FETCH, METADATA = int(p.Op.PRODUCE), int(p.Op.FETCH), int(p.Op.METADATA)
LIST_OFFSETS, CREATE_TOPIC = int(p.Op.LIST_OFFSETS), int(p.Op.CREATE_TOPIC)


def body_of(frame: bytes) -> bytes:
    """The body of one frame, checking its length prefix."""
    (length,) = p.LENGTH_PREFIX.unpack(frame[:4])
    assert length == len(frame) - 4
    return frame[4:]


V = p.PROTOCOL_VERSION  # the version byte of the hand-made bodies below


def packed(*items: object) -> bytes:
    data: bytes = msgpack.packb(list(items), use_bin_type=True)
    return data


def refusal(data: bytes, limits: Limits = LIMITS) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_request(data, limits)
    return info.value


def response_refusal(data: bytes, request_type: type[p.Request]) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_response(data, request_type)
    return info.value


# -- Round trips ---------------------------------------------------------------------------------

EXAMPLE_REQUESTS: list[p.Request] = [
    p.Metadata(()),
    p.Metadata(("orders", "payments")),
    p.CreateTopic("orders", 3, 3, -1, 1 << 30),
    p.DeleteTopic("orders"),
    p.InitProducerId("", 60_000, -1, -1),
    p.InitProducerId("tx-1", 60_000, 42, 3),
    p.Produce(5_000, (p.ProduceEntry("orders", 0, b"batch"), p.ProduceEntry("orders", 2, b""))),
    p.Fetch(500, 4 << 20, (p.FetchPartition("orders", 1, 99, 1 << 20),), False),
    p.ListOffsets((p.OffsetQuery("orders", 0, p.EARLIEST), p.OffsetQuery("orders", 0, p.LATEST))),
    p.DescribeProducers("orders", (0, 1, 2)),
    p.ClusterStatus(),
]

EXAMPLE_RESPONSES: list[tuple[type[p.Request], p.Response]] = [
    (
        p.Metadata,
        p.MetadataResponse(
            "raftbroker",
            1,
            (p.BrokerAddress(1, "127.0.0.2:9092"),),
            (
                p.TopicMetadata(
                    "orders", ErrorCode.NONE, 7, (p.PartitionMetadata(0, -1, (1, 2, 3), -1),)
                ),
                p.TopicMetadata("gone", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, ()),
            ),
        ),
    ),
    (p.CreateTopic, p.CreateTopicResponse(7)),
    (p.DeleteTopic, p.DeleteTopicResponse()),
    (p.InitProducerId, p.InitProducerIdResponse(1_000, 0)),
    (
        p.Produce,
        p.ProduceResponse(
            (
                p.ProduceResult("orders", 0, ErrorCode.NONE, 10, 14, 1_700_000_000_000, True, ""),
                p.ProduceResult(
                    "orders", 1, ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1, -1, False, "h:1"
                ),
            )
        ),
    ),
    (
        p.Fetch,
        p.FetchResponse(
            (p.FetchResult("orders", 0, ErrorCode.NONE, 20, 0, "", (p.FetchedBatch(0, 5, b"x"),)),)
        ),
    ),
    (p.ListOffsets, p.ListOffsetsResponse((p.OffsetResult("orders", 0, ErrorCode.NONE, 20, ""),))),
    (
        p.DescribeProducers,
        p.DescribeProducersResponse(
            (
                p.PartitionProducers(
                    0,
                    ErrorCode.NONE,
                    "",
                    (p.ProducerDescription(1_000, 0, 4, 5, (p.WindowEntry(0, 4, 0, 4, 5),)),),
                ),
            )
        ),
    ),
    (
        p.ClusterStatus,
        p.ClusterStatusResponse(
            1,
            (p.NodeStatus(1, "127.0.0.2:9092", True),),
            (p.RaftGroupReport("orders-0", 1, 3, 10, 10, True, True, "", (1, 3), 0, 7),),
        ),
    ),
]


def test_a_frame_is_a_length_prefix_and_a_msgpack_body() -> None:
    frame = p.encode_request(5, p.DeleteTopic("orders"))
    assert frame == p.LENGTH_PREFIX.pack(len(frame) - 4) + packed(V, 5, 20, ["orders"])


@pytest.mark.parametrize("request_", EXAMPLE_REQUESTS, ids=lambda r: type(r).__name__)
def test_requests_round_trip(request_: p.Request) -> None:
    assert p.decode_request(body_of(p.encode_request(2**31 - 1, request_)), LIMITS) == (
        2**31 - 1,
        request_,
    )


@pytest.mark.parametrize("case", EXAMPLE_RESPONSES, ids=lambda c: c[0].__name__)
def test_responses_round_trip(case: tuple[type[p.Request], p.Response]) -> None:
    request_type, response = case
    assert p.decode_response(body_of(p.encode_response(0, response)), request_type) == (0, response)


def test_decoded_error_fields_are_error_codes() -> None:
    request_type, response = EXAMPLE_RESPONSES[4]
    frame = p.encode_response(3, response)
    _, decoded = p.decode_response(body_of(frame), request_type)
    assert isinstance(decoded, p.ProduceResponse)
    assert [type(r.error) for r in decoded.results] == [ErrorCode, ErrorCode]


def test_error_answers_carry_the_leader_hint_in_either_form() -> None:
    info = p.ErrorInfo("not the leader", "127.0.0.3:9092")
    as_pair = p.encode_response(9, info, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    as_response = p.encode_response(9, p.ErrorResponse(ErrorCode.NOT_LEADER_OR_FOLLOWER, info))
    assert as_pair == as_response
    assert p.decode_response(body_of(as_pair), p.Produce) == (
        9,
        p.ErrorResponse(ErrorCode.NOT_LEADER_OR_FOLLOWER, info),
    )


def test_encoding_refuses_misuse() -> None:
    info = p.ErrorInfo("boom", "")
    with pytest.raises(ValueError, match="ErrorInfo"):
        p.encode_response(1, p.DeleteTopicResponse(), ErrorCode.INVALID_REQUEST)
    with pytest.raises(ValueError, match="NONE"):
        p.encode_response(1, info)
    with pytest.raises(ValueError, match="own error code"):
        p.encode_response(
            1, p.ErrorResponse(ErrorCode.INVALID_REQUEST, info), ErrorCode.NOT_LEADER_OR_FOLLOWER
        )
    with pytest.raises(ValueError, match="NONE"):
        p.ErrorResponse(ErrorCode.NONE, info)
    for correlation_id in (-1, 2**31, True):
        with pytest.raises(ValueError, match="correlation id"):
            p.encode_request(correlation_id, p.ClusterStatus())


# -- Malformed requests --------------------------------------------------------------------------

UNREADABLE_ID = [
    pytest.param(b"", id="empty"),
    pytest.param(b"\xc1", id="never-used-byte"),
    pytest.param(msgpack.packb({"version": 1}), id="map-body"),
    pytest.param(packed(1), id="one-item"),
    pytest.param(packed(V, "7", METADATA, [[]]), id="str-id"),
    pytest.param(packed(V, -1, METADATA, [[]]), id="negative-id"),
    pytest.param(packed(V, 2**31, METADATA, [[]]), id="id-above-int32"),
    pytest.param(packed(V, True, METADATA, [[]]), id="bool-id"),
]


@pytest.mark.parametrize("data", UNREADABLE_ID)
def test_a_body_without_a_readable_correlation_id_is_refused_without_one(data: bytes) -> None:
    error = refusal(data)
    assert (error.error, error.correlation_id) == (ErrorCode.INVALID_REQUEST, None)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(packed(V + 1, 7, METADATA, [[]]), f"version {V + 1}", id="future-version"),
        pytest.param(packed(1, 7, METADATA, [[]]), "version 1", id="version-before-txns"),
        pytest.param(packed(True, 7, METADATA, [[]]), "version True", id="bool-version"),
        pytest.param(packed(V, 7, 999, []), "op 999", id="unknown-op"),
        pytest.param(packed(V, 7, "3", [[]]), "op '3'", id="str-op"),
        pytest.param(packed(V, 7, True, [[]]), "op True", id="bool-op"),
    ],
)
def test_unknown_versions_and_ops_are_unsupported(data: bytes, message: str) -> None:
    error = refusal(data)
    assert (error.error, error.correlation_id) == (ErrorCode.UNSUPPORTED_VERSION, 7)
    assert message in str(error)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (packed(V, 7, METADATA), "4 items"),
        (packed(V, 7, METADATA, [[]], 0), "4 items"),
        (packed(V, 7, PRODUCE, [1_000]), "Produce: expected an array of 2 fields"),
        (packed(V, 7, PRODUCE, {"timeout_ms": 1}), "Produce: expected an array"),
        (packed(V, 7, PRODUCE, [True, []]), "Produce.timeout_ms: expected an integer"),
        (packed(V, 7, PRODUCE, [1e3, []]), "Produce.timeout_ms"),
        (packed(V, 7, PRODUCE, [2**64 - 1, []]), "Produce.timeout_ms"),
        (packed(V, 7, PRODUCE, [-1, []]), "Produce.timeout_ms"),
        (packed(V, 7, PRODUCE, [1, [["t", -1, b""]]]), "Produce.entries[0].partition"),
        (
            packed(V, 7, PRODUCE, [1, [["t", 0, "text"]]]),
            "Produce.entries[0].batch: expected bytes",
        ),
        (packed(V, 7, PRODUCE, [1, [["t", 0]]]), "Produce.entries[0]: expected an array of 3"),
        (packed(V, 7, PRODUCE, [1, [["t", 0, b""], None]]), "Produce.entries[1]"),
        (packed(V, 7, PRODUCE, [1, "entries"]), "Produce.entries: expected an array"),
        (packed(V, 7, METADATA, [[b"orders"]]), "Metadata.topics[0]: expected a string"),
        (packed(V, 7, METADATA, [["x" * (p.NAME_CHARS_MAX + 1)]]), "Metadata.topics[0]"),
        (packed(V, 7, LIST_OFFSETS, [[["t", 0, -3]], False]), "ListOffsets.partitions[0].spec"),
        (
            packed(V, 7, FETCH, [0, 0, [["t", 0, -5, 0]], False, False]),
            "Fetch.partitions[0].offset",
        ),
        (packed(V, 7, CREATE_TOPIC, ["t", 0, 1, -1, -1]), "CreateTopic.partitions"),
        (packed(V, 7, CREATE_TOPIC, ["t", 1, 1, -2, -1]), "CreateTopic.retention_ms"),
        (packed(V, 7, METADATA, [[msgpack.ExtType(1, b"x")]]), "ext type"),
        (packed(V, 7, METADATA, [[]]) + b"\x00", "malformed msgpack"),
        (body_of(p.encode_request(7, EXAMPLE_REQUESTS[6]))[:-3], "malformed msgpack"),
    ],
)
def test_malformed_payloads_are_invalid_and_keep_the_correlation_id(
    data: bytes, message: str
) -> None:
    error = refusal(data)
    assert (error.error, error.correlation_id) == (ErrorCode.INVALID_REQUEST, 7)
    assert message in str(error)


def test_a_refusal_is_one_of_the_coded_errors_with_its_message_apart() -> None:
    """Code that maps errors to answers catches `RaftbrokerError`; the server answers with the
    bare message (the code travels in the header, not in front of the text)."""
    error = refusal(packed(V, 7, PRODUCE, [True, []]))
    assert isinstance(error, RaftbrokerError)
    assert (error.error, error.retriable, error.leader) == (ErrorCode.INVALID_REQUEST, False, "")
    assert error.message == "Produce.timeout_ms: expected an integer in [0, 3600000]"
    assert str(error) == f"INVALID_REQUEST: {error.message}"


def test_strings_are_bounded_but_names_are_left_to_the_server() -> None:
    longest = p.Metadata(("x" * p.NAME_CHARS_MAX, "not a valid topic name!"))
    assert p.decode_request(body_of(p.encode_request(1, longest)), LIMITS)[1] == longest


def test_counts_are_bounded_by_partitions_per_request_max() -> None:
    limits = Limits(partitions_per_request_max=2)
    entries = tuple(p.ProduceEntry("t", n, b"") for n in range(3))
    assert p.decode_request(body_of(p.encode_request(1, p.Produce(1, entries[:2]))), limits)
    error = refusal(body_of(p.encode_request(1, p.Produce(1, entries))), limits)
    assert (error.error, error.correlation_id) == (ErrorCode.INVALID_REQUEST, 1)
    assert "Produce.entries: expected at most 2 items" in str(error)


def test_an_oversize_body_is_refused_before_decoding() -> None:
    limits = Limits(frame_bytes_max=128 * KIB, fetch_bytes_max=64 * KIB)
    request = p.Produce(1, (p.ProduceEntry("t", 0, b"x" * 128 * KIB),))
    error = refusal(body_of(p.encode_request(4, request)), limits)
    assert (error.error, error.correlation_id) == (ErrorCode.MESSAGE_TOO_LARGE, 4)


# -- Malformed responses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (packed(V, 3, 9_999, ["boom", ""]), "unknown error code 9999"),
        (packed(V, 3, True, ["boom", ""]), "unknown error code True"),
        (packed(V, 3, 6, ["boom"]), "ErrorInfo: expected an array of 2"),
        (packed(V, 3, 6, ["boom", "x" * 300]), "ErrorInfo.leader"),
        (packed(V, 3, 0, ["boom", ""]), "CreateTopicResponse: expected an array of 1"),
        (packed(V, 3, 0, [-7]), "CreateTopicResponse.topic_id"),
    ],
)
def test_malformed_responses_are_refused_with_their_correlation_id(
    data: bytes, message: str
) -> None:
    error = response_refusal(data, p.CreateTopic)
    assert error.correlation_id == 3
    assert message in str(error)


def test_a_response_with_an_unknown_error_code_in_a_result_is_refused() -> None:
    data = packed(V, 3, 0, [[["orders", 0, 12_345, 0, ""]]])
    assert "ListOffsetsResponse.results[0].error" in str(response_refusal(data, p.ListOffsets))


# -- Correlation ids and frames ------------------------------------------------------------------


def test_peek_reads_the_correlation_id_of_requests_and_responses() -> None:
    assert p.peek_correlation_id(body_of(p.encode_request(11, p.ClusterStatus()))) == 11
    assert p.peek_correlation_id(body_of(p.encode_response(12, p.DeleteTopicResponse()))) == 12
    assert p.peek_correlation_id(packed(V, 13, 0, [1, [["t", 0]]])[:6]) == 13
    for data in (b"", b"\x91\x01", packed(V, "13"), msgpack.packb(13)):
        with pytest.raises(p.ProtocolError):
            p.peek_correlation_id(data)


def reader_with(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


@pytest.mark.asyncio
async def test_read_frame_returns_exact_bodies() -> None:
    frames = [p.encode_request(n, request) for n, request in enumerate(EXAMPLE_REQUESTS)]
    reader = reader_with(b"".join(frames) + p.LENGTH_PREFIX.pack(0))
    for frame in frames:
        assert await p.read_frame(reader, LIMITS.frame_bytes_max) == body_of(frame)
    assert await p.read_frame(reader, LIMITS.frame_bytes_max) == b""
    with pytest.raises(asyncio.IncompleteReadError):
        await p.read_frame(reader, LIMITS.frame_bytes_max)


@pytest.mark.asyncio
async def test_read_frame_refuses_an_oversize_prefix_without_reading_the_body() -> None:
    reader = reader_with(p.LENGTH_PREFIX.pack(101), eof=False)  # the body never comes
    with pytest.raises(p.ProtocolError, match="101 bytes") as info:
        await asyncio.wait_for(p.read_frame(reader, 100), timeout=1)
    assert (info.value.error, info.value.correlation_id) == (ErrorCode.MESSAGE_TOO_LARGE, None)
    reader.feed_data(b"body")
    reader.feed_eof()
    assert await reader.read() == b"body"


@pytest.mark.asyncio
@pytest.mark.parametrize("cut", [0, 2, 4, 10])
async def test_read_frame_raises_incomplete_read_on_a_truncated_frame(cut: int) -> None:
    frame = p.encode_request(1, EXAMPLE_REQUESTS[6])
    with pytest.raises(asyncio.IncompleteReadError):
        await p.read_frame(reader_with(frame[:cut]), LIMITS.frame_bytes_max)


def test_take_frame_cuts_exact_bodies_and_waits_for_the_rest() -> None:
    frames = [p.encode_request(n, request) for n, request in enumerate(EXAMPLE_REQUESTS)]
    data = b"".join(frames)
    for cut in (0, 2, 4, len(frames[0]) - 1):  # a prefix or body still on its way
        assert p.take_frame(bytearray(data[:cut]), 0, LIMITS.frame_bytes_max) is None
    buf, offset, bodies = bytearray(data), 0, []
    while (frame := p.take_frame(buf, offset, LIMITS.frame_bytes_max)) is not None:
        body, offset = frame
        bodies.append(body)
    assert bodies == [body_of(f) for f in frames]
    assert offset == len(buf)


def test_take_frame_refuses_an_oversize_prefix_before_its_body_arrives() -> None:
    with pytest.raises(p.ProtocolError, match="101 bytes") as info:
        p.take_frame(bytearray(p.LENGTH_PREFIX.pack(101)), 0, 100)
    assert (info.value.error, info.value.correlation_id) == (ErrorCode.MESSAGE_TOO_LARGE, None)
    assert p.take_frame(bytearray(p.LENGTH_PREFIX.pack(100) + b"x" * 100), 0, 100) == (
        b"x" * 100,
        104,
    )


# -- The schema itself ---------------------------------------------------------------------------


def test_every_op_has_one_request_type_and_each_a_response_type() -> None:
    assert sorted(cls.OP for cls in p.REQUEST_TYPES) == sorted(p.Op)
    for cls in p.REQUEST_TYPES:
        assert issubclass(cls.RESPONSE, p.Response)


def rule_fits(rule: p.Rule, hint: object) -> bool:
    """Whether a field's rule decodes to values of its annotated type."""
    match rule:
        case f.IntRule() | f.ErrorCodeRule():
            return hint is int
        case f.BoolRule():
            return hint is bool
        case f.StrRule():
            return hint is str
        case f.BytesRule():
            return hint is bytes
        case p.StructRule(cls=cls):
            return hint is cls
        case p.TupleRule(item=item):
            args = typing.get_args(hint)
            return (
                typing.get_origin(hint) is tuple and args[1:] == (...,) and rule_fits(item, args[0])
            )


def wire_records() -> list[type[p.Struct]]:
    """Every record reachable from the requests, their responses and ErrorInfo."""
    seen: set[type[p.Struct]] = set()
    todo: list[type[p.Struct]] = [*p.REQUEST_TYPES, *(c.RESPONSE for c in p.REQUEST_TYPES)]
    todo.append(p.ErrorInfo)
    while todo:
        cls = todo.pop()
        seen.add(cls)
        for _, rule in p.field_rules(cls):
            leaf = innermost(rule)
            if isinstance(leaf, p.StructRule) and leaf.cls not in seen:
                todo.append(leaf.cls)
    by_name = {name_of(cls): cls for cls in seen}
    return [by_name[name] for name in sorted(by_name)]


def innermost(rule: p.Rule) -> p.Rule:
    return innermost(rule.item) if isinstance(rule, p.TupleRule) else rule


def name_of(cls: type[p.Struct]) -> str:
    return cls.__name__


@pytest.mark.parametrize("cls", wire_records(), ids=name_of)
def test_every_field_rule_matches_its_annotation(cls: type[p.Struct]) -> None:
    hints = typing.get_type_hints(cls)
    names = [name for name, hint in hints.items() if typing.get_origin(hint) is not typing.ClassVar]
    assert [name for name, _ in p.field_rules(cls)] == names
    for name, rule in p.field_rules(cls):
        assert rule_fits(rule, hints[name]), f"{cls.__name__}.{name}"


def test_the_native_codec_is_the_only_msgpack_user_in_cluster() -> None:
    for source in sorted(CLUSTER.glob("**/*.py")):
        tree = ast.parse(source.read_text(), str(source))
        imported = {
            alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names
        }
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        uses_msgpack = any(name.split(".")[0] == "msgpack" for name in imported)
        assert not uses_msgpack or source == CLUSTER / "native" / "codec.py", source
