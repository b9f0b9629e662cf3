"""One link: a TCP connection to a peer, through its handshake and while open.

Role: a link's own state and bytes, and nothing of the other links: its socket, the handshake
it is in, its deadline, its ciphers once open, what is queued to it and what it has read. The
mesh (mesh.py) decides when each of these runs; a link never drops itself, it raises
`LinkError` or `OSError` and the mesh drops it.

Rules:
- Sockets are non-blocking. `write` writes what the socket takes now (a link's queued
  messages in one `sendmsg` of up to 512 buffers) and keeps the rest queued; `read` takes
  what is available up to a bound, so that one busy link does not starve the others.
- Frames (frames.py) are cut from the input as they complete; the input forgets what was
  taken once per read, not per frame.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections import deque
from enum import Enum

from cluster.raft.handshake import FRAME_BYTES_MAX as HANDSHAKE_FRAME_BYTES_MAX
from cluster.raft.handshake import Cipher, Handshake, LinkError
from cluster.raft.mesh.frames import LENGTH

_IOV_MAX = 512


class State(Enum):
    CONNECTING = "connecting"
    HANDSHAKE = "handshake"
    OPEN = "open"


class Link:
    """One TCP connection to a peer, through its handshake and while open."""

    def __init__(
        self,
        sock: socket.socket,
        handshake: Handshake,
        now: float,
        deadline: float,
        source: str | None = None,
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.handshake = handshake
        self.peer = handshake.peer  # the acceptor learns it from the peer's hello
        self.dialer = self.peer is not None
        self.source = source  # an accepted link's source IP, in normal form
        self.deadline = deadline  # to be open by then (monotonic seconds)
        self.holds_slot = False  # counted among the accepted links not yet open
        self.state = State.CONNECTING if self.dialer else State.HANDSHAKE
        self.inbuf = bytearray()
        self.read_offset = 0
        self.mask = 0
        self.out: deque[bytes | memoryview] = deque()
        self.out_bytes = 0
        self.sealer = Cipher(None)  # the handshake's, once open
        self.opener = Cipher(None)
        self.last_recv = now
        self.last_send = now

    def connected(self, *, failed: bool) -> None:
        """The dial finished: raise if it failed, else start the handshake with our hello."""
        code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code or failed:
            raise LinkError(f"connect: {os.strerror(code) if code else 'error'}")
        self.state = State.HANDSHAKE
        self.queue_frame(self.handshake.hello())

    def frame_limit(self, open_max: int) -> int:
        """The largest frame this link takes now: `open_max` once open, 1 KiB before."""
        return open_max if self.state is State.OPEN else HANDSHAKE_FRAME_BYTES_MAX

    def queue(self, payload: bytes) -> None:
        self.queue_frame(self.sealer.seal(payload))

    def queue_frame(self, frame: bytes) -> None:
        """Queue one frame as it is (sealed already, or a hello: the only one in clear)."""
        self.out.append(LENGTH.pack(len(frame)))
        self.out.append(frame)
        self.out_bytes += len(frame) + LENGTH.size

    def write(self) -> None:
        """Write what the socket takes now; the rest stays queued."""
        while self.out:
            try:
                sent = self.sock.sendmsg(itertools.islice(self.out, _IOV_MAX))
            except (BlockingIOError, InterruptedError):
                return
            self.out_bytes -= sent
            while sent:
                head = self.out[0]
                if len(head) <= sent:
                    sent -= len(head)
                    self.out.popleft()
                else:
                    self.out[0] = memoryview(head)[sent:]
                    sent = 0

    def read(self, bytes_max: int, scratch: memoryview) -> bool:
        """Receive what is available, up to `bytes_max`, through `scratch`; False when the
        peer closed. Into a buffer kept for it: `recv(n)` allocates n bytes for every call
        (a quarter of a MiB here, some 8 us) and then shrinks them to what came."""
        received = 0
        while received < bytes_max:
            wanted = min(len(scratch), bytes_max - received)
            try:
                count = self.sock.recv_into(scratch, wanted)
            except (BlockingIOError, InterruptedError):
                return True
            if not count:
                return False
            self.inbuf += scratch[:count]
            received += count
            if count < wanted:
                # The socket is drained: asking again would only fail with EAGAIN (a syscall
                # and an exception per message). Whatever arrives next is another event.
                return True
        return True

    def next_frame(self, frame_bytes_max: int) -> bytes | None:
        """The next complete frame of the input buffer, as sent (still sealed), or None."""
        start = self.read_offset
        if len(self.inbuf) - start < LENGTH.size:
            return None
        (length,) = LENGTH.unpack_from(self.inbuf, start)
        if length > frame_bytes_max:
            raise LinkError(f"a frame of {length} bytes exceeds {frame_bytes_max}")
        end = start + LENGTH.size + length
        if end > len(self.inbuf):
            return None
        self.read_offset = end
        # Through a view: slicing the bytearray itself would copy the frame twice (a bytearray,
        # then bytes), and a frame carries a whole batch of records.
        with memoryview(self.inbuf) as view:
            return bytes(view[start + LENGTH.size : end])

    def burst(self) -> bool:
        """Whether the input buffer holds more than the next frame: several arrived at once."""
        start = self.read_offset
        if len(self.inbuf) - start < LENGTH.size:
            return False
        length: int = LENGTH.unpack_from(self.inbuf, start)[0]
        return start + LENGTH.size + length < len(self.inbuf)

    def compact(self) -> None:
        """Forget the frames taken, once per read (not per frame: that would be quadratic)."""
        del self.inbuf[: self.read_offset]
        self.read_offset = 0


def stage(link: Link) -> str:
    """How far a link that is not open got, for the log."""
    if link.state is State.CONNECTING:
        return "connecting"
    return f"awaiting {link.handshake.awaiting}"
