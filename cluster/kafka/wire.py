"""The Kafka listener's wire: Kafka's framing, and whole-request refusals as each API answers.

Role: the `Wire` the node's `Server` (cluster/broker/server.py) speaks on the Kafka port, so
that every limit of the native listener holds here too. Frames and requests go through the codec
(cluster/kafka/codec.py); answers are the frontend's responses, in the version asked.

Rules:
- A frame is a signed 4-byte big-endian length and that many bytes. A negative length, or one
  above `Limits.frame_bytes_max`, closes the connection before a byte of the body is read, as
  Kafka closes it (it has no error frame to send).
- A request that does not decode closes the connection, as Kafka does, except ApiVersions newer
  than ours, which is answered in v0 format (the codec builds that answer, KIP-511).
- Kafka has no generic error response: a request refused whole (`RaftbrokerError`: a deadline,
  a bug answered UNKNOWN_SERVER_ERROR) is answered with its API's own response carrying the
  code where that API carries codes, per topic and partition, group or member (`refusal`).
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
        if isinstance(outcome, RaftbrokerError):
            outcome = refusal(body, outcome)
        return codec.encode_response(request.header, outcome)

    def describe(self, request: m.KafkaRequest) -> str:
        return f"{m.Api(request.api_key).name} v{request.api_version}"


def refusal(body: m.RequestBody, error: RaftbrokerError) -> m.ResponseBody:
    """The response that refuses `body` whole with `error`, in its API's own terms."""
    code, message = int(error.error), error.message
    match body:
        case m.ApiVersionsRequest():
            return m.ApiVersionsResponse(code, ())
        case m.MetadataRequest(topics=topics):
            # A name the request left null is answered "", as Kafka's error response does (a
            # null name is allowed in no answer before v12).
            failed = tuple(
                m.MetadataResponseTopic(code, t.name or "", t.topic_id) for t in topics or ()
            )
            return m.MetadataResponse((), failed, error_code=code)
        case m.DescribeClusterRequest():
            return m.DescribeClusterResponse(code, "", error_message=message)
        case m.CreateTopicsRequest(topics=topics):
            return m.CreateTopicsResponse(
                tuple(m.CreatableTopicResult(t.name, code, message) for t in topics)
            )
        case m.DeleteTopicsRequest():
            named = [m.DeleteTopicState(n) for n in body.topic_names] + list(body.topics)
            return m.DeleteTopicsResponse(
                tuple(m.DeletableTopicResult(t.name, code, t.topic_id, message) for t in named)
            )
        case m.ListOffsetsRequest(topics=topics):
            return m.ListOffsetsResponse(
                tuple(
                    m.ListOffsetsTopicResponse(
                        t.name,
                        tuple(
                            m.ListOffsetsPartitionResponse(p.partition_index, code)
                            for p in t.partitions
                        ),
                    )
                    for t in topics
                )
            )
        case m.InitProducerIdRequest() | m.AddPartitionsToTxnRequest() | m.AddOffsetsToTxnRequest():
            return _transaction_refusal(body, code)
        case m.DescribeProducersRequest(topics=topics):
            return m.DescribeProducersResponse(
                tuple(
                    m.TopicResponse(
                        t.name,
                        tuple(m.PartitionResponse(i, code, message) for i in t.partition_indexes),
                    )
                    for t in topics
                )
            )
        case m.FindCoordinatorRequest():
            keys = body.coordinator_keys or (body.key,)
            return m.FindCoordinatorResponse(
                code,
                message,
                coordinators=tuple(m.Coordinator(k, -1, "", -1, code, message) for k in keys),
            )
        case (
            m.JoinGroupRequest()
            | m.SyncGroupRequest()
            | m.HeartbeatRequest()
            | m.LeaveGroupRequest()
            | m.OffsetCommitRequest()
            | m.OffsetFetchRequest()
            | m.DescribeGroupsRequest()
            | m.ListGroupsRequest()
            | m.DeleteGroupsRequest()
        ):
            return _group_refusal(body, code)
        case m.ProduceRequest(topic_data=topics):
            return m.ProduceResponse(
                tuple(
                    m.TopicProduceResponse(
                        t.name,
                        tuple(
                            m.PartitionProduceResponse(p.index, code, error_message=message)
                            for p in t.partition_data
                        ),
                    )
                    for t in topics
                )
            )
        case m.FetchRequest(topics=topics):
            return m.FetchResponse(
                tuple(
                    m.FetchableTopicResponse(
                        t.topic, tuple(m.PartitionData(p.partition, code) for p in t.partitions)
                    )
                    for t in topics
                ),
                error_code=code,
            )
    raise AssertionError(f"no refusal for {type(body).__name__}")


def _transaction_refusal(
    body: m.InitProducerIdRequest | m.AddPartitionsToTxnRequest | m.AddOffsetsToTxnRequest,
    code: int,
) -> m.ResponseBody:
    """`refusal` of the producer-id and transaction APIs: the code per partition, or whole."""
    if isinstance(body, m.InitProducerIdRequest):
        return m.InitProducerIdResponse(code)
    if isinstance(body, m.AddOffsetsToTxnRequest):
        return m.AddOffsetsToTxnResponse(code)
    return m.AddPartitionsToTxnResponse(
        tuple(
            m.AddPartitionsToTxnTopicResult(
                t.name, tuple(m.AddPartitionsToTxnPartitionResult(i, code) for i in t.partitions)
            )
            for t in body.v3_and_below_topics
        )
    )


_GroupRequest = (
    m.JoinGroupRequest
    | m.SyncGroupRequest
    | m.HeartbeatRequest
    | m.LeaveGroupRequest
    | m.OffsetCommitRequest
    | m.OffsetFetchRequest
    | m.DescribeGroupsRequest
    | m.ListGroupsRequest
    | m.DeleteGroupsRequest
)


def _group_refusal(body: _GroupRequest, code: int) -> m.ResponseBody:
    """`refusal` of the consumer-group APIs: the code per group, member or partition, where
    Kafka's response carries it."""
    match body:
        case m.JoinGroupRequest(member_id=member_id):
            return m.JoinGroupResponse(code, member_id=member_id)
        case m.SyncGroupRequest():
            return m.SyncGroupResponse(code)
        case m.HeartbeatRequest():
            return m.HeartbeatResponse(code)
        case m.LeaveGroupRequest():
            return m.LeaveGroupResponse(code)  # as Kafka refuses it: no member's outcome
        case m.OffsetCommitRequest(topics=topics):
            return m.OffsetCommitResponse(
                tuple(
                    m.OffsetCommitResponseTopic(
                        t.name,
                        tuple(
                            m.OffsetCommitResponsePartition(p.partition_index, code)
                            for p in t.partitions
                        ),
                    )
                    for t in topics
                )
            )
        case m.OffsetFetchRequest():
            # v1 carries codes per partition only, v2-v7 the group's too, v8+ one per group.
            return m.OffsetFetchResponse(
                tuple(
                    m.OffsetFetchResponseTopic(
                        t.name,
                        tuple(m.OffsetFetchResponsePartition(i, code) for i in t.partition_indexes),
                    )
                    for t in body.topics or ()
                ),
                code,
                tuple(m.OffsetFetchResponseGroup(g.group_id, code) for g in body.groups),
            )
        case m.DescribeGroupsRequest(groups=groups):
            return m.DescribeGroupsResponse(tuple(m.DescribedGroup(g, code) for g in groups))
        case m.ListGroupsRequest():
            return m.ListGroupsResponse(code)
        case m.DeleteGroupsRequest(groups_names=groups):
            return m.DeleteGroupsResponse(tuple(m.DeletableGroupResult(g, code) for g in groups))
    raise AssertionError(f"no refusal for {type(body).__name__}")
