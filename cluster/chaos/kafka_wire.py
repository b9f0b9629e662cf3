"""A Kafka client at the request level, for the chaos workload: our own codec on the client side.

Role: the requests a real Kafka client cannot be made to send, sent to the Kafka listener as
they are: InitProducerId with a transactional id (a session whose zombie the workload keeps
sending, to be fenced), Produce of given record batch bytes to a partition's leader (a resend
of the very same batch after a lost acknowledgement), and ListOffsets at one leader (the
transactions' watcher of last stable offsets). Leaders come from Kafka Metadata, asked of any
broker.

Rules: one connection per broker and one request at a time on it (a lock): a request that fails
or times out closes its connection, since its answer could still arrive. Every await has a
timeout. A failure to reach a broker is a `ClientError` with Kafka's code (NETWORK_EXCEPTION,
REQUEST_TIMED_OUT, LEADER_NOT_AVAILABLE), as the native client raises them, so the workload
treats both protocols' failures alike; an answer, error codes included, is returned as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence

from cluster.addresses import join_address, parse_address
from cluster.client import ClientError
from cluster.kafka import codec
from cluster.kafka import messages as m
from statemachine.errors import ErrorCode

CLIENT_ID = "raftbroker-chaos"
# Versions as librdkafka 2.x sends them (v9 is the last Produce without KIP-951's leader hints,
# which this client does not need: it asks Metadata).
PRODUCE_VERSION = 9
METADATA_VERSION = 12
INIT_PRODUCER_ID_VERSION = 4
LIST_OFFSETS_VERSION = 5  # v2+: an isolation level
LATEST = -1  # ListOffsets' timestamp for the end
ANSWER_BYTES_MAX = 4 << 20  # Metadata, Produce and InitProducerId answers are small


class _Connection:
    """One TCP connection to a broker, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.lock = asyncio.Lock()
        self.closed = False

    async def exchange(self, frame: bytes) -> bytes:
        """Send one request frame and read the body of the answer's (under `lock`)."""
        if self.closed:  # dropped while this request waited for the lock
            raise ConnectionError("connection closed")
        self._writer.write(frame)
        await self._writer.drain()
        (length,) = codec.LENGTH_PREFIX.unpack(await self._reader.readexactly(4))
        if not 0 <= length <= ANSWER_BYTES_MAX:
            raise ConnectionError(f"an answer frame of {length} bytes")
        return await self._reader.readexactly(length)

    def close(self) -> None:
        self.closed = True
        self._writer.close()


class KafkaWireClient:
    """Bootstrap addresses, a connection per broker, and the leaders Metadata last named."""

    def __init__(self, bootstrap: Sequence[str], request_timeout_s: float) -> None:
        self.bootstrap = list(bootstrap)
        self.request_timeout_s = request_timeout_s
        self._connections: dict[str, _Connection] = {}
        self._brokers: dict[int, str] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._correlation = itertools.count(1)

    async def call(
        self, address: str, api: m.Api, version: int, body: m.RequestBody
    ) -> m.ResponseBody:
        """One request to `address`, answered within the request timeout; ClientError if not."""
        header = m.RequestHeader(api, version, next(self._correlation), CLIENT_ID)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                conn = await self._connection(address)
                async with conn.lock:
                    answer = await conn.exchange(codec.encode_request(header, body))
        except TimeoutError as exc:
            self._drop(address)
            raise ClientError(ErrorCode.REQUEST_TIMED_OUT, address, address=address) from exc
        except (OSError, EOFError) as exc:  # refused, reset, or closed mid-answer
            self._drop(address)
            raise ClientError(
                ErrorCode.NETWORK_EXCEPTION, f"{address}: {exc!r}", address=address
            ) from exc
        correlation_id, response = codec.decode_response(header, answer)
        assert correlation_id == header.correlation_id, "answers out of order"
        return response

    async def call_any(self, api: m.Api, version: int, body: m.RequestBody) -> m.ResponseBody:
        """The answer of the first broker that gives one (known brokers, then bootstrap)."""
        last: ClientError | None = None
        for address in self._addresses():
            try:
                return await self.call(address, api, version, body)
            except ClientError as exc:
                last = exc
        assert last is not None, "no address to ask"
        raise last

    async def refresh(self, topic: str) -> None:
        """Brokers and the leaders of `topic`'s partitions, from any broker's Metadata."""
        request = m.MetadataRequest((m.MetadataRequestTopic(topic),), False)
        answer = await self.call_any(m.Api.METADATA, METADATA_VERSION, request)
        assert isinstance(answer, m.MetadataResponse)
        self._brokers = {b.node_id: join_address(b.host, b.port) for b in answer.brokers}
        for t in answer.topics:
            for p in t.partitions:
                if t.name is not None:
                    self._leaders[(t.name, p.partition_index)] = p.leader_id

    def leader(self, topic: str, partition: int) -> str | None:
        return self._brokers.get(self._leaders.get((topic, partition), -1))

    async def produce(
        self, topic: str, partition: int, batch: bytes, timeout_ms: int
    ) -> m.PartitionProduceResponse:
        """One Produce (acks=all) of `batch` at the partition's leader, as last known (Metadata
        asked first if none is); the partition's answer."""
        address = self.leader(topic, partition)
        if address is None:
            await self.refresh(topic)
            address = self.leader(topic, partition)
        if address is None:
            raise ClientError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition}")
        data = m.TopicProduceData(topic, (m.PartitionProduceData(partition, batch),))
        request = m.ProduceRequest(-1, timeout_ms, (data,))
        answer = await self.call(address, m.Api.PRODUCE, PRODUCE_VERSION, request)
        assert isinstance(answer, m.ProduceResponse)
        ((result,),) = [t.partition_responses for t in answer.responses]
        return result

    async def list_offsets(
        self, topic: str, partition: int, *, read_committed: bool
    ) -> tuple[int, int]:
        """(error code, offset) of ListOffsets latest at the partition's leader, as last known:
        its last stable offset (`read_committed`) or its high watermark."""
        address = self.leader(topic, partition)
        if address is None:
            await self.refresh(topic)
            address = self.leader(topic, partition)
        if address is None:
            return ErrorCode.LEADER_NOT_AVAILABLE, -1
        asked = m.ListOffsetsTopic(topic, (m.ListOffsetsPartition(partition, LATEST),))
        request = m.ListOffsetsRequest((asked,), isolation_level=int(read_committed))
        answer = await self.call(address, m.Api.LIST_OFFSETS, LIST_OFFSETS_VERSION, request)
        assert isinstance(answer, m.ListOffsetsResponse)
        ((result,),) = [t.partitions for t in answer.topics]
        return result.error_code, result.offset

    async def init_producer_id(
        self, transactional_id: str | None, transaction_timeout_ms: int
    ) -> m.InitProducerIdResponse:
        """InitProducerId at any broker (each serves any transactional id: FindCoordinator
        names whichever node is asked)."""
        request = m.InitProducerIdRequest(transactional_id, transaction_timeout_ms)
        answer = await self.call_any(m.Api.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION, request)
        assert isinstance(answer, m.InitProducerIdResponse)
        return answer

    async def close(self) -> None:
        for address in list(self._connections):
            self._drop(address)

    def _addresses(self) -> list[str]:
        known = [a for _, a in sorted(self._brokers.items())]
        return known + [a for a in self.bootstrap if a not in known]

    async def _connection(self, address: str) -> _Connection:
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        host, port = parse_address(address)
        opened = _Connection(*await asyncio.open_connection(host, port))
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:  # another request opened one meanwhile
            opened.close()
            return conn
        self._connections[address] = opened
        return opened

    def _drop(self, address: str) -> None:
        conn = self._connections.pop(address, None)
        if conn is not None:
            with contextlib.suppress(OSError, RuntimeError):
                conn.close()
