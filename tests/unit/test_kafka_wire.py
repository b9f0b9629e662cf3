"""The Kafka listener's wire (cluster/kafka/wire.py): Kafka's framing, a refusal for every API
in every version it is served in, and no answer to acks=0."""

from __future__ import annotations

import random
import struct

import pytest

from cluster.broker.connection import Undecodable
from cluster.config import Limits
from cluster.errors import RaftbrokerError
from cluster.kafka import codec
from cluster.kafka import messages as m
from cluster.kafka.wire import KafkaWire
from statemachine.errors import ErrorCode
from tests.fuzz.kafka_frames import KafkaRequests
from tests.kafka_samples import REQUESTS
from tests.kafka_wire import error_codes
from tests.unit.test_kafka_codec import IDS, VERSIONS

FRAME_BYTES_MAX = Limits().frame_bytes_max
WIRE = KafkaWire(Limits())


def test_frames_are_cut_at_their_signed_length() -> None:
    buf = bytearray(struct.pack(">i", 3) + b"abc" + struct.pack(">i", 2) + b"d")
    assert WIRE.take_frame(buf, 0) == (b"abc", 7)
    assert WIRE.take_frame(buf, 7) is None  # the rest has not arrived
    assert WIRE.take_frame(bytearray(b"\x00\x00"), 0) is None


@pytest.mark.parametrize(("length", "why"), [(-1, "negative"), (FRAME_BYTES_MAX + 1, "exceeds")])
def test_a_length_kafka_would_refuse_closes_the_connection(length: int, why: str) -> None:
    with pytest.raises(Undecodable, match=why) as refused:
        WIRE.take_frame(bytearray(struct.pack(">i", length) + b"x" * 8), 0)
    assert refused.value.answer is None
    assert not refused.value.keep_open


def test_an_undecodable_request_closes_and_a_too_new_api_versions_is_answered() -> None:
    with pytest.raises(Undecodable) as closed:
        WIRE.decode(struct.pack(">hhih", 999, 0, 1, -1))
    assert (closed.value.answer, closed.value.keep_open) == (None, False)
    with pytest.raises(Undecodable) as answered:
        WIRE.decode(struct.pack(">hhih", m.Api.API_VERSIONS, 9, 5, -1))
    assert answered.value.answer is not None
    assert answered.value.keep_open


@pytest.mark.parametrize(("api", "version"), VERSIONS, ids=IDS)
def test_every_request_can_be_refused_in_its_own_terms(api: m.Api, version: int) -> None:
    header = m.RequestHeader(api, version, 31, "t")
    request = m.KafkaRequest(header, REQUESTS[api])
    refusal = RaftbrokerError(ErrorCode.REQUEST_TIMED_OUT, "the node did not answer in time")
    frame = WIRE.encode(31, request, refusal)
    if api == m.Api.PRODUCE and REQUESTS[api].acks == 0:  # type: ignore[attr-defined]
        assert frame is None
        return
    assert frame is not None
    correlation_id, response = codec.decode_response(header, frame[4:])
    assert correlation_id == 31
    codes = error_codes(response)
    assert codes, f"{api.name} v{version}'s refusal carries no error code"
    assert set(codes) == {ErrorCode.REQUEST_TIMED_OUT}


GENERATED_PER_VERSION = 25


@pytest.mark.parametrize(("api", "version"), VERSIONS, ids=IDS)
def test_every_request_a_client_may_send_can_be_refused(api: m.Api, version: int) -> None:
    """The refusal of a whole request is the last answer a connection has for it: it must be
    written for any request that decodes, not only for the usual ones (a Metadata v10 naming a
    topic by id has a null name its answer cannot carry: issue 40). Requests generated from
    the schema, each decoded, refused and read back by a client."""
    requests = KafkaRequests(random.Random(api * 100 + version))
    refusal = RaftbrokerError(ErrorCode.INVALID_REQUEST, "x" * 40_000)
    for correlation_id in range(GENERATED_PER_VERSION):
        frame = requests.frame(api, version, correlation_id).data
        try:
            request = codec.decode_request(frame[4:], Limits())
        except codec.KafkaProtocolError:
            continue  # ApiVersions with a software name Kafka refuses: answered by the codec
        answer = WIRE.encode(correlation_id, request, refusal)
        if answer is None:
            continue  # acks=0
        _, response = codec.decode_response(request.header, answer[4:])
        assert set(error_codes(response)) <= {ErrorCode.INVALID_REQUEST}


def test_acks_0_is_never_answered() -> None:
    produce = m.ProduceRequest(0, 1_000, ())
    request = m.KafkaRequest(m.RequestHeader(m.Api.PRODUCE, 9, 1, None), produce)
    assert WIRE.encode(1, request, m.ProduceResponse(())) is None
    assert WIRE.encode(1, request, RaftbrokerError(ErrorCode.REQUEST_TIMED_OUT)) is None


def refused(api: m.Api, version: int) -> m.ResponseBody:
    """REQUESTS[api] refused whole at `version`, as the client reads the answer."""
    header = m.RequestHeader(api, version, 31, "t")
    refusal = RaftbrokerError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "loading")
    frame = WIRE.encode(31, m.KafkaRequest(header, REQUESTS[api]), refusal)
    assert frame is not None
    return codec.decode_response(header, frame[4:])[1]


def test_group_refusals_carry_the_code_per_group_member_and_partition() -> None:
    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    join = refused(m.Api.JOIN_GROUP, 9)
    assert isinstance(join, m.JoinGroupResponse)
    assert (join.error_code, join.member_id, join.members) == (code, "m-1", ())
    assert refused(m.Api.JOIN_GROUP, 6) == m.JoinGroupResponse(code, member_id="m-1")
    # OffsetFetch: per partition in v1, the group's code from v2, per group in v8
    v1, v2, v8 = (refused(m.Api.OFFSET_FETCH, v) for v in (1, 2, 8))
    assert isinstance(v1, m.OffsetFetchResponse)
    assert [(p.partition_index, p.error_code) for p in v1.topics[0].partitions] == [
        (0, code),
        (1, code),
    ]
    assert (v1.topics[0].partitions[0].committed_offset, v1.error_code) == (-1, 0)
    assert isinstance(v2, m.OffsetFetchResponse)
    assert v2.error_code == code
    assert isinstance(v8, m.OffsetFetchResponse)
    assert [(g.group_id, g.error_code, g.topics) for g in v8.groups] == [
        ("g", code, ()),
        ("h", code, ()),
    ]
    commit = refused(m.Api.OFFSET_COMMIT, 8)
    assert isinstance(commit, m.OffsetCommitResponse)
    assert [(p.partition_index, p.error_code) for p in commit.topics[0].partitions] == [
        (0, code),
        (1, code),
    ]
    described = refused(m.Api.DESCRIBE_GROUPS, 5)
    assert isinstance(described, m.DescribeGroupsResponse)
    assert [(g.group_id, g.error_code) for g in described.groups] == [("g", code), ("h", code)]
    deleted = refused(m.Api.DELETE_GROUPS, 2)
    assert deleted == m.DeleteGroupsResponse(
        (m.DeletableGroupResult("g", code), m.DeletableGroupResult("h", code))
    )
    assert refused(m.Api.LEAVE_GROUP, 5) == m.LeaveGroupResponse(code)  # no member's outcome
    assert refused(m.Api.LIST_GROUPS, 4) == m.ListGroupsResponse(code)
