"""Kafka for tests: a client at the request level, our own codec (cluster/kafka/codec/) on the
client side, so a test can send exactly the request it means (versions, fields, pipelining) and
read the answer in our types; and the Kafka clients' logs, read for the versions they
negotiated (`captured`, `negotiated`, `report`: `NEGOTIATED` lines, shown with
`-o log_cli=true`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import Iterator, Sequence

from cluster.kafka import codec
from cluster.kafka import messages as m
from statemachine.errors import ErrorCode
from tests.polling import apoll_until

log = logging.getLogger(__name__)
SOCKET_TIMEOUT_S = 10.0
CLIENT_ID = "raftbroker-tests"
FRAME_BYTES_MAX = 64 * 1024 * 1024

Call = tuple[m.Api, int, m.RequestBody]  # API, version, body


async def open_kafka(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    async with asyncio.timeout(SOCKET_TIMEOUT_S):
        return await asyncio.open_connection(host, int(port))


async def read_kafka_frame(reader: asyncio.StreamReader) -> bytes:
    """The body of the next frame (a broker's answer)."""
    async with asyncio.timeout(SOCKET_TIMEOUT_S):
        (length,) = codec.LENGTH_PREFIX.unpack(await reader.readexactly(4))
        assert 0 <= length <= FRAME_BYTES_MAX, f"an answer frame of {length} bytes"
        return await reader.readexactly(length)


async def kafka_calls(address: str, calls: Sequence[Call]) -> list[m.ResponseBody]:
    """Send `calls` pipelined on one fresh connection and read their answers, in order."""
    reader, writer = await open_kafka(address)
    try:
        return await calls_on(reader, writer, calls)
    finally:
        writer.close()


_CORRELATION = itertools.count(1)


async def calls_on(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, calls: Sequence[Call]
) -> list[m.ResponseBody]:
    headers = [
        m.RequestHeader(api, version, next(_CORRELATION), CLIENT_ID) for api, version, _ in calls
    ]
    writer.write(
        b"".join(
            codec.encode_request(h, body) for h, (_, _, body) in zip(headers, calls, strict=True)
        )
    )
    await writer.drain()
    answers = []
    for header in headers:
        correlation_id, answer = codec.decode_response(header, await read_kafka_frame(reader))
        assert correlation_id == header.correlation_id, "answers out of order"
        answers.append(answer)
    return answers


async def kafka_call(address: str, api: m.Api, version: int, body: m.RequestBody) -> m.ResponseBody:
    (answer,) = await kafka_calls(address, [(api, version, body)])
    return answer


def error_codes(response: object) -> list[int]:
    """Every non-zero error code anywhere in a response."""
    found: list[int] = []
    for name in getattr(response, "__dataclass_fields__", {}):
        value = getattr(response, name)
        if name.endswith("error_code") and value:  # partition_error_code too
            found.append(value)
        elif isinstance(value, tuple):
            for item in value:
                found += error_codes(item)
        else:
            found += error_codes(value) if hasattr(value, "__dataclass_fields__") else []
    return found


# -- the clients' logs ------------------------------------------------------------------------


class Captured(logging.Handler):
    """Every message logged to the loggers it is attached to, while attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def capturing(*names: str) -> Iterator[Captured]:
    """Every DEBUG message of the named loggers (and their children), while the block runs."""
    handler = Captured()
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


async def served_init(
    address: str, version: int, request: m.InitProducerIdRequest, timeout_s: float = 30.0
) -> m.InitProducerIdResponse:
    """InitProducerId, asked again while its transaction coordinator is starting (the
    transaction state topic is created on the first ask), as a Kafka client retries it."""
    starting = {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }

    async def answered() -> m.InitProducerIdResponse | None:
        answer = await kafka_call(address, m.Api.INIT_PRODUCER_ID, version, request)
        assert isinstance(answer, m.InitProducerIdResponse)
        return None if answer.error_code in starting else answer

    return await apoll_until(answered, timeout_s, "InitProducerId served")


def negotiated(lines: list[str], pattern: str) -> dict[str, set[int]]:
    """API name -> the versions a client's log shows it sent."""
    found: dict[str, set[int]] = {}
    for line in lines:
        for name, version in re.findall(pattern, line):
            found.setdefault(name, set()).add(int(version))
    return found


def report(client: str, versions: dict[str, set[int]]) -> None:
    shown = ", ".join(
        f"{name} v{'/'.join(map(str, sorted(v)))}" for name, v in sorted(versions.items())
    )
    log.info("NEGOTIATED %s: %s", client, shown)
