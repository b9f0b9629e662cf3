"""One client connection of a listener: frames in, answers out in the order they were asked.

Role: the `asyncio.Protocol` a `Server` (cluster/broker/server.py) makes for each connection it
admits, with what both listeners share: the `Wire` (how bytes become requests and answers
become bytes) and the `RequestHandler` (what answers each request) are the listener's.

Each connection may pipeline requests; they are handled concurrently and answered in the order
they arrived, as Kafka does. Frames are cut out of `data_received` as they arrive, and an
answer is written the moment it is known and every earlier one is out. A handler may answer at
once through a callback (`RequestHandler.answer_now`: a produce is answered from the Raft
apply callback itself, with no task between the commit and the socket); every other request
runs as a task that the connection owns and cancels when it closes. Limits:

- requests in flight and answer bytes held: reading pauses when either bound is reached, as
  Kafka mutes a channel (backpressure, not a queue that grows). The answer bytes held are the
  frames of answers that wait for an earlier one, and for each request still under way what
  its handler reserves (`answer_bytes_reserved`: the bound of a Fetch answer). Answers handed
  to the transport are not counted: past its high-water mark the transport pauses writing,
  and then no request is read either. So a client that pipelines requests and never reads
  costs a node at most about `Limits.answer_bytes_per_connection_max`, one answer more, and a
  socket buffer;
- `frame_read_timeout_ms`: once part of a frame is buffered, the rest must arrive within that
  much time spent reading (bytes that keep dripping do not extend it). The clock stops while
  the connection itself does not read (a bound above reached, or the client not reading its
  answers): the rest of the frame then waits in the kernel by our doing;
- a deadline for every answer (`answer_timeout_ms`), an idle timeout that closes dead or silent
  clients (`client_idle_timeout_ms`), and a write timeout that closes a client that stops
  reading its answers (`client_write_timeout_ms`).

Every request is answered once: by its handler, or with REQUEST_TIMED_OUT at
`Timing.answer_timeout_ms` if the handler has not answered by then (which handlers, each bound
by `request_timeout_ms`, never let happen: the deadline keeps a bug from holding a connection,
and the requests behind it, for ever). A wire may answer nothing at all (Kafka's acks=0
produce): the request keeps its place in the order and leaves no bytes.

Bad input never crashes a node: a frame that does not decode is answered with an error when the
wire can answer it (the native protocol, when the correlation id can be read), and otherwise
ends the connection (counted and logged as a refusal, one line naming the reason): every
answer owed to the requests before it goes out first, then a FIN. Meanwhile what the client
still sends is read and dropped, and after the FIN for up to `LINGER_S` (Apache's lingering
close): closing a socket with bytes unread sends a reset, and a reset destroys the answers the
client has not read yet. A handler that fails unexpectedly answers UNKNOWN_SERVER_ERROR and
logs, naming the request; nothing of either reaches a Raft log.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Generic, Protocol, TypeVar, cast

from cluster.config import Limits
from cluster.errors import RaftbrokerError
from cluster.peer_hosts import normal_ip
from statemachine.errors import ErrorCode

log = logging.getLogger(__name__)
# A timer may fire this early: uvloop's clock counts whole milliseconds.
TIMER_SLACK_S = 0.001
# Both wires open a frame with its length, 4 bytes big-endian: read here for a log line only.
FRAME_LENGTH = struct.Struct(">I")
# After closing for a bad frame, how long the client's further bytes are read and dropped
# while it reads the answers owed before that frame (see `ServerConnection._close`).
LINGER_S = 2.0

Q = TypeVar("Q")  # a decoded request, as a wire gives it to its handler
A = TypeVar("A")  # a handler's answer, as it gives it back to its wire
Q_contra = TypeVar("Q_contra", contravariant=True)
A_co = TypeVar("A_co", covariant=True)
A_contra = TypeVar("A_contra", contravariant=True)


class Undecodable(Exception):  # noqa: N818 - a refusal, as the wire reports it
    """Bytes a wire cannot turn into a request: `answer` is the frame to send first (None:
    nothing can be answered); then the connection is closed unless `keep_open`."""

    def __init__(self, message: str, answer: bytes | None = None, *, keep_open: bool = False):
        super().__init__(message)
        self.message = message
        self.answer = answer
        self.keep_open = keep_open


class Wire(Protocol[Q, A_contra]):
    """A listener's protocol: frames, requests and answers."""

    @property
    def name(self) -> str:
        """The listener's name, in logs and the `listener` label of its metrics."""
        ...

    def take_frame(self, buf: bytearray, offset: int) -> tuple[bytes, int] | None:
        """The body of the frame at `offset` and the offset after it, or None until all of it
        has arrived; Undecodable (never kept open) for a length it refuses."""
        ...

    def decode(self, body: bytes) -> tuple[int, Q]:
        """The correlation id and request of a frame body; Undecodable otherwise."""
        ...

    def encode(
        self, correlation_id: int, request: Q, outcome: A_contra | RaftbrokerError
    ) -> bytes | None:
        """The frame answering `request` (a refusal included); None: no answer at all."""
        ...

    def describe(self, request: Q) -> str:
        """What `request` is, for a log line ("Produce", "METADATA v10")."""
        ...


class RequestHandler(Protocol[Q_contra, A_co]):
    def answer_now(self, request: Q_contra, respond: Callable[[A_co | Exception], None]) -> bool:
        """Take `request` on the fast path and call `respond` once, later or at once; False
        when it has none (then `handle` serves it, in a task)."""
        ...

    def answer_bytes_reserved(self, request: Q_contra) -> int:
        """The bytes to hold in reserve for `request`'s answer while it is under way (its
        bound where it may be large; 0 where it is small)."""
        ...

    def answer_wait_s(self, request: Q_contra) -> float:
        """How long `request` may wait for its answer by design, beyond `answer_timeout_ms`
        (a JoinGroup parked for its rebalance timeout); 0 for every other request."""
        ...

    async def handle(self, request: Q_contra, source: str) -> A_co:
        """The answer to `request`, which came from address `source` (what DescribeGroups
        shows as a member's host)."""
        ...


class Refusal(enum.StrEnum):
    """Why a connection was refused, or closed before its frame was read: the `reason` label of
    the refused-connections metric."""

    CONNECTIONS_MAX = "connections_max"
    PER_ADDRESS = "connections_per_address_max"
    FRAME_READ_TIMEOUT = "frame_read_timeout"
    UNDECODABLE = "undecodable_request"


class Seat(enum.Enum):
    """Which slots an admitted connection holds."""

    PEER = enum.auto()
    CLIENT = enum.auto()


class Listener(Protocol[Q, A]):
    """What a connection needs of the server that admitted it (`Server`)."""

    handler: RequestHandler[Q, A]
    wire: Wire[Q, A]
    limits: Limits
    idle_timeout_s: float
    answer_timeout_s: float
    write_timeout_s: float
    frame_read_timeout_s: float

    def admit(self, ip: str) -> Seat | None: ...

    def release(self, ip: str, seat: Seat) -> None: ...

    def refuse(self, reason: Refusal, detail: str) -> None: ...


class _Slot(Generic[Q]):
    """One request's place in the answer order: the request (None when it did not decode), its
    encoded answer once known (`frame`; b"" for no answer), the bytes held in reserve for it
    until then, when it is due, and the task serving it, if any."""

    __slots__ = ("correlation_id", "deadline", "frame", "request", "reserved", "task")

    def __init__(self, correlation_id: int, request: Q | None, reserved: int, deadline: float):
        self.correlation_id = correlation_id
        self.request = request
        self.reserved = reserved
        self.deadline = deadline
        self.frame: bytes | None = None
        self.task: asyncio.Task[None] | None = None


class ServerConnection(asyncio.Protocol, Generic[Q, A]):
    """One client connection: frames in, answers out in request order."""

    def __init__(self, server: Listener[Q, A]) -> None:
        self._server = server
        self._wire = server.wire
        self._limits = server.limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._ip = ""
        self._seat: Seat | None = None  # None: refused, or not yet made
        self._inbuf = bytearray()
        self._slots: deque[_Slot[Q]] = deque()
        self._held_bytes = 0  # answer bytes of the slots: known frames and reservations
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading = True
        self._taking = False  # in _take_frames: an answer given at once must not re-enter it
        self._writable = True
        self._finishing = False  # no more requests: close once every answer is out
        self._peer_done = False  # the client sent EOF: it reads on, and needs no linger
        # Closing for a bad frame: what the client still sends is read and dropped, so that
        # the close is a FIN after every answer owed, not a reset that can destroy them.
        self._discarding = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._last_heard = self._loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        # The frame-read clock: reading time spent on the frame partly buffered, banked while
        # the clock stood; when it last started, None while it stands (no partial frame, or
        # reading paused); and its one timer, armed no later than the deadline (which only
        # moves later for a given frame), re-armed by itself until the deadline is reached.
        self._frame_read_s = 0.0
        self._frame_clock_from: float | None = None
        self._frame_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        self._transport = cast(asyncio.Transport, transport)
        self._ip = source_ip(self._transport)
        self._seat = self._server.admit(self._ip)
        if self._seat is None:
            self._finishing = True
            self._transport.close()
            return
        self._idle_timer = self._loop.call_later(self._server.idle_timeout_s, self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._last_heard = self._loop.time()
        if self._discarding:
            return
        self._inbuf += data
        self._take_frames()

    def eof_received(self) -> bool:
        if self._linger_timer is not None:  # the client read our FIN and closed in turn
            self._close()
            return True
        # The client sent all it will: answer what it asked, then close. (Frames held back by
        # a bound are all taken first: reading pauses at a bound, so EOF is not seen before.)
        self._peer_done = True
        self._finish()
        return True

    def pause_writing(self) -> None:
        # The client is not reading its answers: read no more requests from it, and give it
        # Timing.client_write_timeout_ms to catch up before the connection is dropped.
        self._writable = False
        self._pause_reading()
        self._time_frame(new_frame=False)
        self._write_timer = self._loop.call_later(self._server.write_timeout_s, self._abort)

    def resume_writing(self) -> None:
        self._writable = True
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._take_frames()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        if self._seat is None:
            return  # refused at a connection limit: never counted
        self._server.release(self._ip, self._seat)
        self._seat = None
        timers = (
            self._idle_timer,
            self._write_timer,
            self._deadline_timer,
            self._frame_timer,
            self._linger_timer,
        )
        for timer in timers:
            if timer is not None:
                timer.cancel()
        for task in self._tasks:
            task.cancel()
        self._finishing = True
        self._slots.clear()

    # -- requests in ---------------------------------------------------------------------------

    def _take_frames(self) -> None:
        """Cut every complete frame out of the input, while the in-flight bound allows."""
        if self._taking:
            return
        self._taking = True
        try:
            self._take_buffered_frames()
        finally:
            self._taking = False

    def _take_buffered_frames(self) -> None:
        buf, offset = self._inbuf, 0
        while self._open_for_requests():
            try:
                frame = self._wire.take_frame(buf, offset)
            except Undecodable as exc:  # a length refused: its body is never read; close
                self._undecodable(exc)
                break
            if frame is None:
                break
            body, offset = frame
            self._on_frame(body)
        del buf[:offset]
        if self._open_for_requests():
            self._resume_reading()
        else:
            self._pause_reading()
        self._time_frame(new_frame=offset > 0)

    def _open_for_requests(self) -> bool:
        """Whether another request may be taken: the client reads its answers, and neither
        the requests in flight nor the answer bytes held are at their bound."""
        limits = self._limits
        return (
            not self._finishing
            and self._writable
            and len(self._slots) < limits.in_flight_requests_per_connection_max
            and self._held_bytes < limits.answer_bytes_per_connection_max
        )

    def _on_frame(self, body: bytes) -> None:
        try:
            correlation_id, request = self._wire.decode(body)
        except Undecodable as exc:
            self._undecodable(exc)
            return
        handler = self._server.handler
        slot = self._new_slot(
            correlation_id,
            request,
            handler.answer_bytes_reserved(request),
            handler.answer_wait_s(request),
        )
        respond = partial(self._respond, slot)
        try:
            if handler.answer_now(request, respond):
                return
        except Exception as exc:  # noqa: BLE001 - a handler's bug: logged and answered, not fatal
            respond(exc)
            return
        task = slot.task = self._loop.create_task(self._handle(request, respond))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _undecodable(self, exc: Undecodable) -> None:
        """Answer what the wire could answer; unless it keeps the connection open, close it
        once the earlier answers are out, counted and logged (rate-limited) as a refusal."""
        if exc.answer is not None:
            self._complete(self._new_slot(0, None), exc.answer)
        if not exc.keep_open:
            self._server.refuse(Refusal.UNDECODABLE, f"from {self._ip}: {exc.message[:200]}")
            self._finish(linger=True)

    async def _handle(self, request: Q, respond: Callable[[A | Exception], None]) -> None:
        try:
            outcome: A | Exception = await self._server.handler.handle(request, self._ip)
        except Exception as exc:  # noqa: BLE001 - answered; a refusal or a bug, logged in respond
            outcome = exc
        respond(outcome)

    # -- answers out ---------------------------------------------------------------------------

    def _new_slot(
        self, correlation_id: int, request: Q | None, reserved: int = 0, wait_s: float = 0.0
    ) -> _Slot[Q]:
        deadline = self._loop.time() + self._server.answer_timeout_s + wait_s
        slot = _Slot(correlation_id, request, reserved, deadline)
        self._slots.append(slot)
        self._held_bytes += reserved
        if self._deadline_timer is None:
            self._deadline_timer = self._loop.call_at(deadline, self._answer_overdue)
        return slot

    def _respond(self, slot: _Slot[Q], outcome: A | Exception) -> None:
        if isinstance(outcome, Exception) and not isinstance(outcome, RaftbrokerError):
            log.error("%s failed", self._named(slot), exc_info=outcome)
            outcome = RaftbrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, "internal error")
        self._complete(slot, self._encode(slot, outcome))

    def _encode(self, slot: _Slot[Q], outcome: A | RaftbrokerError) -> bytes:
        """The answer's frame (b"" for none); an answer that cannot be encoded is a bug: it is
        logged and answered UNKNOWN_SERVER_ERROR, or the connection dropped if even that fails."""
        request = slot.request
        assert request is not None, "only decoded requests are answered through the wire"
        wire, correlation_id = self._wire, slot.correlation_id
        try:
            return wire.encode(correlation_id, request, outcome) or b""
        except Exception:  # a bug in an answer: logged, never fatal to the node
            log.exception("could not encode the answer to %s", self._named(slot))
        try:
            internal = RaftbrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, "internal error")
            return wire.encode(correlation_id, request, internal) or b""
        except Exception:
            # Nothing can be said to this request: the answers before it still go out, then
            # the connection is closed (a client matches answers by order).
            log.exception(
                "could not encode an error answer to %s either; closing", self._named(slot)
            )
            self._finish(linger=True)
            return b""

    def _named(self, slot: _Slot[Q]) -> str:
        """A request as a log line names it: its correlation id, kind and source."""
        kind = "undecodable" if slot.request is None else self._wire.describe(slot.request)
        return f"request {slot.correlation_id} ({kind}) from {self._ip}"

    def _complete(self, slot: _Slot[Q], frame: bytes) -> None:
        if slot.frame is not None:
            return  # answered at its deadline already: the late outcome has no request left
        slot.frame = frame
        self._held_bytes += len(frame) - slot.reserved
        slots, transport = self._slots, self._transport
        if transport is None or transport.is_closing():
            return
        while slots and (head := slots[0].frame) is not None:
            slots.popleft()
            if head:
                self._held_bytes -= len(head)
                transport.write(head)
        if self._finishing:
            if not slots:
                self._close()
        elif not self._reading and self._writable:
            self._take_frames()  # in-flight room again: frames already read may proceed

    def _finish(self, *, linger: bool = False) -> None:
        """Take no more requests; close once every answer owed is out. With `linger` (a bad
        frame: the client may still be sending), read and drop its bytes meanwhile."""
        self._finishing = True
        if linger and not self._peer_done:
            self._discarding = True
            self._inbuf.clear()
            self._resume_reading()
        self._pause_reading()  # unless discarding
        self._time_frame(new_frame=False)
        if not self._slots:
            self._close()

    def _close(self) -> None:
        """Close once the answers handed to the transport are written. While discarding, first
        half-close (a FIN after the last answer) and read on until the client closes in turn or
        `LINGER_S` pass: a close with its bytes unread would be a reset, and a reset can destroy
        answers the client has not read yet (Apache's lingering close)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        lingering = self._discarding and not self._peer_done and self._linger_timer is None
        if not (lingering and transport.can_write_eof()):
            transport.close()
            return
        transport.write_eof()
        self._linger_timer = self._loop.call_later(LINGER_S, transport.close)

    # -- flow control and timeouts -------------------------------------------------------------

    def _pause_reading(self) -> None:
        if self._discarding:
            return  # what comes is dropped: reading on is what lets the connection end cleanly
        if self._reading and self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        self._reading = False

    def _resume_reading(self) -> None:
        if not self._reading and self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
            self._reading = True

    def _answer_overdue(self) -> None:
        """Answer REQUEST_TIMED_OUT to every request past its deadline from the oldest on (a
        later one with an earlier deadline waits for the answers before it anyway: answers go
        out in order), cancelling the task that serves it."""
        self._deadline_timer = None
        slots, now = self._slots, self._loop.time()
        while slots and slots[0].frame is None and slots[0].deadline <= now:
            slot = slots[0]
            log.error("%s got no answer in time; answered REQUEST_TIMED_OUT", self._named(slot))
            if slot.task is not None:
                slot.task.cancel()
            timed_out = RaftbrokerError(
                ErrorCode.REQUEST_TIMED_OUT, "the node did not answer in time"
            )
            self._complete(slot, self._encode(slot, timed_out))
        # (Taking requests again may have armed it; a head with its frame means closing.)
        if self._deadline_timer is None and slots and slots[0].frame is None:
            self._deadline_timer = self._loop.call_at(slots[0].deadline, self._answer_overdue)

    def _check_idle(self) -> None:
        """Close a client silent for the idle timeout once it awaits no answer (each answer
        comes by its deadline, so a pending one defers the close only that long)."""
        idle_s = self._server.idle_timeout_s
        silent_s = self._loop.time() - self._last_heard
        if silent_s >= idle_s and not self._slots:
            self._finish()
            return
        self._idle_timer = self._loop.call_later(max(idle_s - silent_s, 0.1), self._check_idle)

    def _time_frame(self, *, new_frame: bool) -> None:
        """Run the frame-read clock while part of a frame is buffered and requests are read;
        stop it, keeping the time spent, while reading is paused (that wait is ours). A frame
        begun since the last call (`new_frame`: one was taken) starts from nothing."""
        running_from = self._frame_clock_from
        if running_from is None and not self._inbuf:
            return  # whole frames only, as nearly always: nothing to time
        now = self._loop.time()
        if new_frame or not self._inbuf:
            self._frame_read_s = 0.0
        elif running_from is not None:
            self._frame_read_s += now - running_from
        if not (self._inbuf and self._reading):
            self._frame_clock_from = None
            return
        self._frame_clock_from = now
        if self._frame_timer is None:
            left_s = self._server.frame_read_timeout_s - self._frame_read_s
            self._frame_timer = self._loop.call_at(now + left_s, self._frame_overdue)

    def _frame_overdue(self) -> None:
        """Abort a connection whose frame took longer than its deadline to read; re-arm for
        the deadline as it stands now otherwise (the clock stood meanwhile, or a new frame)."""
        self._frame_timer = None
        running_from = self._frame_clock_from
        if running_from is None:
            return  # the clock stands: armed again when it next starts
        now = self._loop.time()
        spent_s = self._frame_read_s + now - running_from
        left_s = self._server.frame_read_timeout_s - spent_s
        if left_s > TIMER_SLACK_S:
            self._frame_timer = self._loop.call_at(now + left_s, self._frame_overdue)
            return
        buffered = len(self._inbuf)
        prefix = FRAME_LENGTH.size
        size = FRAME_LENGTH.unpack_from(self._inbuf)[0] + prefix if buffered >= prefix else "?"
        self._server.refuse(
            Refusal.FRAME_READ_TIMEOUT,
            f"from {self._ip}: {buffered} of {size} bytes in {spent_s:.1f} s of reading",
        )
        self._abort()

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


def source_ip(transport: asyncio.BaseTransport) -> str:
    """The connection's source address, in normal form (as peers' addresses are kept)."""
    peername = transport.get_extra_info("peername")
    if not isinstance(peername, tuple) or not peername:
        return "unknown"  # gone before we asked: such connections share one count
    text = str(peername[0])
    return normal_ip(text) or text
