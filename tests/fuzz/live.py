"""The fuzzer against live nodes: generated requests, valid and mutated, pipelined on fresh
connections, each answer checked against what the listener must do with those very bytes.

One connection carries a few requests in one write, then a half-close. What the node must
answer follows from the bytes alone (`Side.oracle`, which cuts and decodes the stream as the
listener's own codec does): every request before the first one that cannot be read is answered,
in order, by its correlation id, with an answer a client can decode that reports no
UNKNOWN_SERVER_ERROR; a request that cannot be read is answered where the protocol can answer
it (the native protocol's error frame, Kafka's ApiVersions fallback) and otherwise ends the
connection; and the connection then ends with a clean close (FIN), never a reset, after every
answer owed. Meanwhile each node's /healthz is asked every `HEALTH_INTERVAL_S` and must answer
200 within `HEALTH_TIMEOUT_S`.

A failure is reported with the hex of the connection's whole stream, so it replays alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from cluster import native as p
from cluster.config import Limits
from cluster.kafka import codec
from cluster.kafka import messages as m
from statemachine.errors import ErrorCode
from tests.fuzz import kafka_frames, native_frames
from tests.kafka_wire import error_codes

FRAMES_PER_CONNECTION_MAX = 6
MUTATED_SHARE = 0.5
VALID_CONNECTIONS_SHARE = 0.4
CONNECTION_TIMEOUT_S = 45.0  # the node's answer deadline (30 s) and a margin
HEALTH_INTERVAL_S = 0.25
HEALTH_TIMEOUT_S = 2.0
REBALANCE_TIMEOUT_MS_MAX = 5_000  # longer parks are the protocol's, not a fault: not sent
FETCH_WAIT_MS_MAX = 1_000
FAILURES_KEPT = 20

Check = Callable[[bytes], str | None]  # an answer's body -> what is wrong with it, or None
# A valid request: its name, its frame, and how to mutate that frame (the mutation's name, the
# bytes).
Generated = tuple[str, bytes, Callable[[random.Random], tuple[str, bytes]]]


@dataclass(frozen=True, slots=True)
class Owed:
    """An answer the node owes: its correlation id and how to check its body."""

    correlation_id: int
    check: Check


class Side(Protocol):
    """One listener's protocol, as the fuzzer needs it."""

    name: str

    def request(self, rng: random.Random, correlation_id: int) -> Generated:
        """A valid request: what it is, its frame, and how to mutate that frame."""
        ...

    def unsafe(self, frame: bytes) -> bool:
        """Whether `frame` decodes into a request the run must not send: a write to the
        suite's records, a topic of many partitions, a wait longer than the run's."""
        ...

    def oracle(self, stream: bytes) -> list[Owed]:
        """The answers a node owes for `stream`, in order."""
        ...

    def answers(self, received: bytes) -> tuple[list[bytes], bytes]:
        """The answer bodies in `received`, and any bytes left that are not a whole frame."""
        ...

    def correlation_id(self, answer: bytes) -> int:
        """The correlation id of an answer's body."""
        ...


def connection_bytes(
    side: Side, rng: random.Random, ids: Callable[[], int]
) -> tuple[bytes, list[str]]:
    """The bytes of one connection, and the name of each request in it (and its mutation's).
    On some connections nothing is mutated, so that valid requests also reach the node in
    numbers past the first bad frame."""
    mutated_share = 0.0 if rng.random() < VALID_CONNECTIONS_SHARE else MUTATED_SHARE
    parts, labels = [], []
    for _ in range(rng.randint(1, FRAMES_PER_CONNECTION_MAX)):
        name, data, mutate = side.request(rng, ids())
        label = "valid"
        if rng.random() < mutated_share:
            label, data = mutate(rng)
        if side.unsafe(data):
            continue
        parts.append(data)
        labels.append(f"{name} {label}")
    return b"".join(parts), labels


def _frames(received: bytes, layout: struct.Struct) -> tuple[list[bytes], bytes]:
    bodies, pos = [], 0
    while len(received) - pos >= layout.size:
        (length,) = layout.unpack_from(received, pos)
        end = pos + layout.size + length
        if length < 0 or end > len(received):
            break
        bodies.append(received[pos + layout.size : end])
        pos = end
    return bodies, received[pos:]


# -- Kafka -----------------------------------------------------------------------------------------


class KafkaSide:
    name = "kafka"

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def request(self, rng: random.Random, correlation_id: int) -> Generated:
        frame = kafka_frames.KafkaRequests(rng).any_frame(correlation_id)
        name = f"{m.Api(frame.api).name} v{frame.version}"
        return name, frame.data, partial(kafka_frames.mutate, frame)

    def unsafe(self, frame: bytes) -> bool:
        try:
            body = codec.decode_request(frame[4:], self.limits).body
        except codec.KafkaProtocolError:
            return False
        return _kafka_unsafe(body)

    def oracle(self, stream: bytes) -> list[Owed]:
        owed, pos = [], 0
        prefix = codec.LENGTH_PREFIX
        while len(stream) - pos >= prefix.size:
            (length,) = prefix.unpack_from(stream, pos)
            if length < 0 or length > self.limits.frame_bytes_max:
                break
            end = pos + prefix.size + length
            if end > len(stream):
                break  # the rest never comes: the half-close ends it
            body, pos = stream[pos + prefix.size : end], end
            try:
                request = codec.decode_request(body, self.limits)
            except codec.KafkaProtocolError as exc:
                if exc.answer is None:
                    break
                owed.append(Owed(exc.correlation_id or 0, _kafka_api_versions_check(body)))
                continue
            if isinstance(request.body, m.ProduceRequest) and request.body.acks == 0:
                continue
            header = request.header
            owed.append(Owed(header.correlation_id, _kafka_check(header)))
        return owed

    def answers(self, received: bytes) -> tuple[list[bytes], bytes]:
        return _frames(received, codec.LENGTH_PREFIX)

    def correlation_id(self, answer: bytes) -> int:
        (correlation_id,) = codec.LENGTH_PREFIX.unpack_from(answer)
        return int(correlation_id)


def _kafka_unsafe(body: m.RequestBody) -> bool:
    match body:
        case m.CreateTopicsRequest(topics=topics, validate_only=validate_only):
            return not validate_only and any(
                t.num_partitions > kafka_frames.PARTITIONS_CREATED_MAX
                or t.name not in kafka_frames.FUZZ_TOPICS
                for t in topics
            )
        case m.ProduceRequest(topic_data=topics) | m.DeleteRecordsRequest(topics=topics):
            return any(t.name not in kafka_frames.FUZZ_TOPICS for t in topics)
        case m.IncrementalAlterConfigsRequest(resources=resources, validate_only=validate_only):
            return not validate_only and any(
                r.resource_name not in kafka_frames.FUZZ_TOPICS for r in resources
            )
        case m.DeleteTopicsRequest(topic_names=names, topics=states):
            return any(n not in kafka_frames.FUZZ_TOPICS for n in names) or any(
                s.name is not None and s.name not in kafka_frames.FUZZ_TOPICS for s in states
            )
        case m.JoinGroupRequest(rebalance_timeout=rebalance, session_timeout=session):
            # v0 has no rebalance timeout: the session timeout stands for it
            return (
                max(rebalance if rebalance >= 0 else session, session)
                > REBALANCE_TIMEOUT_MS_MAX * 2
            )
        case m.FetchRequest(max_wait=wait):
            return wait > FETCH_WAIT_MS_MAX
    return False


def _kafka_check(header: m.RequestHeader) -> Check:
    def check(body: bytes) -> str | None:
        try:
            _, response = codec.decode_response(header, body)
        except Exception as exc:  # noqa: BLE001 - any failure to read it is the finding
            return f"an answer a client cannot read: {type(exc).__name__}: {exc}"
        if ErrorCode.UNKNOWN_SERVER_ERROR in error_codes(response):
            return f"UNKNOWN_SERVER_ERROR in {response!r:.300}"
        return None

    return check


def _kafka_api_versions_check(request: bytes) -> Check:
    """The one request a Kafka listener answers without reading it whole: ApiVersions newer
    than ours (UNSUPPORTED_VERSION in v0, KIP-511) or naming its client badly (INVALID_REQUEST
    in the version asked)."""
    (version,) = struct.unpack_from(">h", request, 2)
    newer = version > codec.SUPPORTED[m.Api.API_VERSIONS].max_version
    header = m.RequestHeader(m.Api.API_VERSIONS, 0 if newer else version, 0, None)
    wanted = ErrorCode.UNSUPPORTED_VERSION if newer else ErrorCode.INVALID_REQUEST

    def check(body: bytes) -> str | None:
        try:
            _, response = codec.decode_response(header, body)
        except Exception as exc:  # noqa: BLE001 - any failure to read it is the finding
            return f"an ApiVersions answer a client cannot read: {exc}"
        assert isinstance(response, m.ApiVersionsResponse)
        return None if response.error_code == wanted else f"not {wanted.name}: {response}"

    return check


# -- native ----------------------------------------------------------------------------------------


class NativeSide:
    name = "native"

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def request(self, rng: random.Random, correlation_id: int) -> Generated:
        request = native_frames.NativeRequests(rng).request()
        frame = native_frames.frame(correlation_id, request)
        return type(request).__name__, frame, partial(native_frames.mutate, correlation_id, request)

    def unsafe(self, frame: bytes) -> bool:
        try:
            _, request = p.decode_request(frame[4:], self.limits)
        except p.ProtocolError:
            return False
        return _native_unsafe(request)

    def oracle(self, stream: bytes) -> list[Owed]:
        owed, pos = [], 0
        prefix = p.LENGTH_PREFIX
        while len(stream) - pos >= prefix.size:
            (length,) = prefix.unpack_from(stream, pos)
            if length > self.limits.frame_bytes_max:
                owed.append(Owed(0, _native_error_check))  # MESSAGE_TOO_LARGE, then closed
                break
            end = pos + prefix.size + length
            if end > len(stream):
                break
            body, pos = stream[pos + prefix.size : end], end
            try:
                correlation_id, request = p.decode_request(body, self.limits)
            except p.ProtocolError as exc:
                if exc.correlation_id is None:
                    break
                owed.append(Owed(exc.correlation_id, _native_error_check))
                continue
            owed.append(Owed(correlation_id, _native_check(type(request), self.limits)))
        return owed

    def answers(self, received: bytes) -> tuple[list[bytes], bytes]:
        return _frames(received, p.LENGTH_PREFIX)

    def correlation_id(self, answer: bytes) -> int:
        return p.peek_correlation_id(answer)


def _native_unsafe(request: p.Request) -> bool:
    fuzz = kafka_frames.FUZZ_TOPICS
    match request:
        case p.CreateTopic(name=name, partitions=partitions):
            return name not in fuzz or partitions > kafka_frames.PARTITIONS_CREATED_MAX
        case p.DeleteTopic(name=name):
            return name not in fuzz
        case p.Produce(entries=entries):
            return any(e.topic not in fuzz for e in entries)
        case p.FencedProduce(entry=entry):
            return entry.topic not in fuzz
        case p.JoinGroup(rebalance_timeout_ms=rebalance, session_timeout_ms=session):
            return max(rebalance, session) > REBALANCE_TIMEOUT_MS_MAX * 2
        case p.Fetch(max_wait_ms=wait):
            return wait > FETCH_WAIT_MS_MAX
    return False


def _native_check(request_type: type[p.Request], limits: Limits) -> Check:
    def check(body: bytes) -> str | None:
        try:
            _, answer = p.decode_response(body, request_type, limits)
        except p.ProtocolError as exc:
            return f"an answer a client cannot read: {exc.message}"
        if isinstance(answer, p.ErrorResponse) and answer.error == ErrorCode.UNKNOWN_SERVER_ERROR:
            return f"UNKNOWN_SERVER_ERROR: {answer.info.message}"
        return None

    return check


def _native_error_check(body: bytes) -> str | None:
    try:
        _, error, _payload = p.split_response(body)
    except p.ProtocolError as exc:
        return f"an error answer a client cannot read: {exc.message}"
    if error in (ErrorCode.NONE, ErrorCode.UNKNOWN_SERVER_ERROR):
        return f"error code {error} for a request that cannot be read"
    return None


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Report:
    """What a run sent and found."""

    side: str
    seed: int
    connections: int = 0
    requests: int = 0
    answers: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    health_failures: list[str] = field(default_factory=list)
    health_checks: int = 0
    seconds: float = 0.0

    def fail(self, problem: str) -> None:
        if len(self.failures) < FAILURES_KEPT:
            self.failures.append(problem)


@dataclass(frozen=True, slots=True)
class _Run:
    side: Side
    addresses: Sequence[str]
    ids: Callable[[], int]  # correlation ids, unique across the run
    deadline: float
    report: Report


async def run(
    side: Side,
    addresses: Sequence[str],
    health: Sequence[str],
    *,
    seconds: float,
    seed: int,
    workers: int = 4,
) -> Report:
    """Fuzz `addresses` (host:port of `side`'s listener on each node) for `seconds`, with
    `workers` connections at a time; /healthz of `health` (host:port) polled throughout."""
    report = Report(side.name, seed)
    started = time.monotonic()
    fuzz = _Run(side, addresses, itertools.count(1).__next__, started + seconds, report)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        poller = tasks.create_task(poll_health(health, report, stop))
        fuzzers = [
            tasks.create_task(_worker(fuzz, random.Random(seed * 1_000 + n)))
            for n in range(workers)
        ]
        await asyncio.gather(*fuzzers)
        stop.set()
        await poller
    report.seconds = time.monotonic() - started
    return report


async def _worker(fuzz: _Run, rng: random.Random) -> None:
    side, report = fuzz.side, fuzz.report
    while time.monotonic() < fuzz.deadline:
        sent, labels = connection_bytes(side, rng, fuzz.ids)
        if not sent:
            continue
        report.connections += 1
        report.requests += len(labels)
        report.labels.update(label.rsplit(" ", 1)[-1] for label in labels)
        address = rng.choice(fuzz.addresses)
        problem = await _exchange(side, address, sent, report)
        if problem:
            names = "; ".join(labels)
            report.fail(f"{side.name} {address} [{names}]: {problem}; stream {sent.hex()}")


async def _exchange(side: Side, address: str, stream: bytes, report: Report) -> str | None:
    owed = side.oracle(stream)
    received, ending = await send_then_read(address, stream)
    bodies, rest = side.answers(received)
    report.answers += len(bodies)
    for i, body in enumerate(bodies):
        if i >= len(owed):
            return f"{len(bodies)} answers, {len(owed)} owed"
        correlation_id = side.correlation_id(body)
        if correlation_id != owed[i].correlation_id:
            return f"answer {i} is to request {correlation_id}, not {owed[i].correlation_id}"
        problem = owed[i].check(body)
        if problem:
            return f"answer {i} (request {correlation_id}): {problem}"
    if len(bodies) < len(owed):
        missing = len(owed) - len(bodies)
        return f"{missing} of {len(owed)} answers missing ({ending}, {len(rest)} bytes left)"
    if ending != "closed":
        return f"the connection ended by {ending}, after every answer owed"
    return None


async def send_then_read(address: str, stream: bytes) -> tuple[bytes, str]:
    """Write `stream`, half-close, and read until the node closes: what arrived, and how it
    ended ("closed", "reset" or "timeout")."""
    host, _, port = address.rpartition(":")
    received = bytearray()
    async with asyncio.timeout(CONNECTION_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(host, int(port))
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(stream)
            writer.write_eof()
        async with asyncio.timeout(CONNECTION_TIMEOUT_S):
            while chunk := await reader.read(1 << 16):
                received += chunk
        return bytes(received), "closed"
    except ConnectionResetError:
        return bytes(received), "reset"
    except TimeoutError:
        return bytes(received), "timeout"
    finally:
        writer.close()


async def poll_health(addresses: Sequence[str], report: Report, stop: asyncio.Event) -> None:
    """Ask each node's /healthz every HEALTH_INTERVAL_S until `stop`; failures into `report`."""
    while not stop.is_set():
        for address in addresses:
            report.health_checks += 1
            problem = await _health(address)
            if problem and len(report.health_failures) < FAILURES_KEPT:
                report.health_failures.append(f"{address}: {problem}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HEALTH_INTERVAL_S):
                await stop.wait()


async def _health(address: str) -> str | None:
    host, _, port = address.rpartition(":")
    started = time.monotonic()
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: fuzz\r\n\r\n")
                answer = await reader.read()
            finally:
                writer.close()
    except (TimeoutError, OSError) as exc:
        return f"no answer in {time.monotonic() - started:.2f} s ({type(exc).__name__})"
    status = answer.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        detail = answer.split(b"\r\n\r\n", 1)[-1][:200]
        return f"{status.decode(errors='replace')}: {detail!r}"
    return None
