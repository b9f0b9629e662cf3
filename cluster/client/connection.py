"""One TCP connection to a broker: pipelined requests matched to their answers by correlation id."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from cluster import native as p
from cluster.addresses import parse_address
from cluster.client.errors import ClientError
from statemachine.errors import ErrorCode

OnAnswer = Callable[[p.Response], None]


class _Waiting(NamedTuple):
    """A request sent on a connection, until its answer or its end."""

    request_type: type[p.Request]
    future: asyncio.Future[Any]
    on_answer: OnAnswer | None


class Call(NamedTuple):
    """A request written on a connection, until its answer is awaited or it is forgotten."""

    correlation_id: int
    future: asyncio.Future[Any]
    timer: asyncio.TimerHandle


def _answered(error: ErrorCode, message: str, leader: str = "") -> ClientError:
    """The error of an answer the broker sent (it is alive and talking)."""
    return ClientError(error, message, leader, answered=True)


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class Connection(asyncio.Protocol):
    """One TCP connection to a broker, with pipelined requests matched by correlation id.

    An `asyncio.Protocol`: answers are cut out of `data_received` and handed to their
    requests there, with no reader task between the socket and the caller; a request's
    `on_answer` is even called there, before its awaiter wakes.
    """

    def __init__(self, address: str, frame_bytes_max: int) -> None:
        self.address = address
        self._frame_bytes_max = frame_bytes_max
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        self._transport: asyncio.Transport | None = None
        self._inbuf = bytearray()
        self._drained: asyncio.Future[None] | None = None  # while the broker is not reading
        # Kept: asyncio.get_running_loop() is a getpid() syscall per call in Python 3.11.
        self._loop = asyncio.get_running_loop()
        self._lost = self._loop.create_future()
        self.closed = False

    @classmethod
    async def open(
        cls,
        address: str,
        timeout_s: float,
        frame_bytes_max: int = 8 << 20,
        *,
        local_host: str | None = None,
    ) -> Connection:
        """Connect to `address`; from `local_host` when given (a broker dialling a peer binds
        its own host, so the peer tells it from a client by its source address)."""
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        connection = cls(address, frame_bytes_max)
        local_addr = None if local_host is None else (local_host, 0)
        async with asyncio.timeout(timeout_s):
            await loop.create_connection(lambda: connection, host, port, local_addr=local_addr)
        return connection

    async def request(
        self, request: p.Request, timeout_s: float, on_answer: OnAnswer | None = None
    ) -> p.Response:
        """Send and await the answer; ClientError for an error answer or a broken connection,
        TimeoutError after `timeout_s`. `on_answer` gets a good answer the moment it is
        decoded, a turn of the loop before this returns it."""
        return await self.answer(self.start(request, timeout_s, on_answer))

    def start(
        self, request: p.Request, timeout_s: float, on_answer: OnAnswer | None = None
    ) -> Call:
        """`request`'s first half: written now, in the caller's turn of the loop. Its
        `answer` must be awaited, or the call `forget`-ten. ClientError if the connection is
        closed; a failed write is raised by `answer`."""
        transport = self._transport
        if self.closed or transport is None or transport.is_closing():
            raise ClientError(ErrorCode.NETWORK_EXCEPTION, f"connection to {self.address} closed")
        correlation_id = next(self._ids) & 0x7FFF_FFFF
        frame = p.encode_request(correlation_id, request)
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()
        # A timer on the future, not asyncio.timeout(): no task cancellation to undo, and a
        # third of the cost on the path of every request.
        timer = loop.call_later(timeout_s, _expire, future)
        self._waiting[correlation_id] = _Waiting(type(request), future, on_answer)
        try:
            transport.write(frame)
        except (ConnectionError, OSError, RuntimeError) as exc:
            # RuntimeError: uvloop's answer to a write on a transport the peer just closed,
            # before we noticed (found by the chaos harness).
            future.set_exception(exc)
        return Call(correlation_id, future, timer)

    async def answer(self, call: Call) -> p.Response:
        """`request`'s second half: the answer to a call `start`ed on this connection."""
        try:
            if self._drained is not None:
                waits = (self._drained, call.future)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            response: p.Response = await call.future
            return response
        except TimeoutError:
            # Before OSError, its base class: a timeout is reported as one (REQUEST_TIMED_OUT,
            # by Client.send), not as a broken connection. The connection still goes, as
            # Kafka's does on a request timeout: nothing waits on it for a late answer.
            await self.close()
            raise
        except (ConnectionError, OSError, RuntimeError) as exc:
            await self.close()
            raise ClientError(ErrorCode.NETWORK_EXCEPTION, str(exc)) from exc
        finally:
            self.forget(call)

    def forget(self, call: Call) -> None:
        """A started call nobody will await: its answer, if one comes, is dropped."""
        call.timer.cancel()
        self._waiting.pop(call.correlation_id, None)
        if not call.future.done():
            call.future.cancel()
        elif not call.future.cancelled():
            call.future.exception()  # failed by close() while we raise our own: retrieved

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: no Transport subclass

    def data_received(self, data: bytes) -> None:
        buf = self._inbuf
        if not buf and p.whole_frame(data, self._frame_bytes_max):
            # The common case of a request at a time: one answer, whole, in one read. It is
            # delivered from `data` itself, not copied through the buffer and out again.
            self._deliver(data[p.LENGTH_PREFIX.size :])
            return
        buf += data
        offset = 0
        while True:
            try:
                frame = p.take_frame(buf, offset, self._frame_bytes_max)
            except p.ProtocolError as exc:  # an oversize answer: the stream is lost
                self._fail_all(ClientError(ErrorCode.NETWORK_EXCEPTION, exc.message))
                self._abort()
                return
            if frame is None:
                break
            body, offset = frame
            self._deliver(body)
        del buf[:offset]

    def pause_writing(self) -> None:
        self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        error = ClientError(ErrorCode.NETWORK_EXCEPTION, repr(exc) if exc else "closed")
        self._fail_all(error)
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_exception(ConnectionResetError(str(error)))
            drained.exception()  # nobody may be waiting for it
        if not self._lost.done():
            self._lost.set_result(None)

    # -- answers -----------------------------------------------------------------------------

    def _deliver(self, body: bytes) -> None:
        try:
            correlation_id, error, payload = p.split_response(body)
        except p.ProtocolError as exc:
            if exc.correlation_id is not None:
                self._fail(exc.correlation_id, _answered(ErrorCode.CORRUPT_MESSAGE, str(exc)))
            return  # else an answer nobody can be matched to
        waiting = self._waiting.get(correlation_id)
        if waiting is None or waiting.future.done():
            return  # the caller gave up on it (timeout)
        try:
            answer = p.load_response(correlation_id, error, payload, waiting.request_type)
        except p.ProtocolError as exc:
            waiting.future.set_exception(_answered(ErrorCode.CORRUPT_MESSAGE, str(exc)))
            return
        if isinstance(answer, p.ErrorResponse):
            info = answer.info
            waiting.future.set_exception(_answered(answer.error, info.message, info.leader))
            return
        if waiting.on_answer is not None:
            waiting.on_answer(answer)
        waiting.future.set_result(answer)

    def _fail(self, correlation_id: int, error: ClientError) -> None:
        waiting = self._waiting.get(correlation_id)
        if waiting is not None and not waiting.future.done():
            waiting.future.set_exception(error)

    def _fail_all(self, error: ClientError) -> None:
        for waiting in self._waiting.values():
            if not waiting.future.done():
                waiting.future.set_exception(error)

    def _abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        self.closed = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        if self._transport is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._lost)
        self._fail_all(ClientError(ErrorCode.NETWORK_EXCEPTION, "connection closed"))
