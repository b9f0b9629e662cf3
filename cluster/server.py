"""The client-facing TCP server: connections, framing, ordering and limits.

Each connection may pipeline requests; they are handled concurrently and answered in the order
they arrived, as Kafka does. Limits: connections per node, requests in flight per connection
(the reader stops reading when the bound is reached: backpressure, not a queue that grows),
frame size, and an idle timeout that closes dead or silent clients.

Bad input never crashes a node: a frame that does not decode is answered with an error when its
correlation id can be read, and the connection is closed when it cannot; a handler that fails
unexpectedly answers UNKNOWN_SERVER_ERROR and logs, and nothing of either reaches a Raft log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Protocol

from cluster.config import Limits, Timing
from cluster.protocol import (
    ErrorInfo,
    ProtocolError,
    Request,
    Response,
    decode_request,
    encode_response,
    read_frame,
)
from statemachine.errors import ErrorCode

log = logging.getLogger(__name__)
WRITE_TIMEOUT_S = 30.0


class HandlerError(Exception):
    """A whole request refused with an error code (and a leader hint for NOT_LEADER)."""

    def __init__(self, error: ErrorCode, message: str = "", leader: str = "") -> None:
        super().__init__(message or error.name)
        self.error = error
        self.message = message or error.name
        self.leader = leader


class RequestHandler(Protocol):
    async def handle(self, request: Request) -> Response: ...


class Server:
    def __init__(
        self, handler: RequestHandler, host: str, port: int, limits: Limits, timing: Timing
    ) -> None:
        self._handler = handler
        self._host = host
        self._port = port
        self._limits = limits
        self._timing = timing
        self._connections = 0
        self.listening = asyncio.Event()

    async def serve(self) -> None:
        server = await asyncio.start_server(self._connection, self._host, self._port)
        async with server:
            self.listening.set()
            await server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= self._limits.connections_max:
            writer.close()
            return
        self._connections += 1
        try:
            await self._serve_connection(reader, writer)
        except Exception:
            log.exception("connection failed")
        finally:
            self._connections -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        in_flight: asyncio.Queue[Awaitable[bytes] | None] = asyncio.Queue(
            self._limits.in_flight_requests_per_connection_max
        )
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._write_in_order(in_flight, writer))
            try:
                await self._read_requests(reader, in_flight, tasks)
            finally:
                await in_flight.put(None)

    async def _read_requests(
        self,
        reader: asyncio.StreamReader,
        in_flight: asyncio.Queue[Awaitable[bytes] | None],
        tasks: asyncio.TaskGroup,
    ) -> None:
        idle_s = self._timing.client_idle_timeout_ms / 1000
        while True:
            try:
                async with asyncio.timeout(idle_s):  # no task per frame, unlike wait_for
                    body = await read_frame(reader, self._limits.frame_bytes_max)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return  # the client left, or was silent for too long
            except ProtocolError as exc:  # an oversize frame: its body was never read
                await in_flight.put(_done(_error_frame(exc)))
                return
            try:
                correlation_id, request = decode_request(body, self._limits)
            except ProtocolError as exc:
                if exc.correlation_id is None:
                    return  # cannot even answer it: close
                await in_flight.put(_done(_error_frame(exc)))
                continue
            await in_flight.put(tasks.create_task(self._answer(correlation_id, request)))

    async def _answer(self, correlation_id: int, request: Request) -> bytes:
        try:
            response: Response | ErrorInfo = await self._handler.handle(request)
            return encode_response(correlation_id, response)
        except HandlerError as exc:
            info = ErrorInfo(exc.message[:512], exc.leader)
            return encode_response(correlation_id, info, exc.error)
        except Exception:
            log.exception("request %s failed", type(request).__name__)
            info = ErrorInfo("internal error", "")
            return encode_response(correlation_id, info, ErrorCode.UNKNOWN_SERVER_ERROR)

    async def _write_in_order(
        self, in_flight: asyncio.Queue[Awaitable[bytes] | None], writer: asyncio.StreamWriter
    ) -> None:
        broken = False
        while (item := await in_flight.get()) is not None:
            response = await item
            if broken or writer.is_closing():
                continue  # keep draining, so the reader never blocks on a full queue
            try:
                writer.write(response)
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await writer.drain()
            except (ConnectionError, TimeoutError, RuntimeError):  # uvloop: RuntimeError
                broken = True  # the client left or stopped reading: the reader sees EOF next
                writer.close()


def _error_frame(exc: ProtocolError) -> bytes:
    info = ErrorInfo(str(exc)[:512], "")
    return encode_response(exc.correlation_id or 0, info, exc.code)


async def _done(data: bytes) -> bytes:
    return data
