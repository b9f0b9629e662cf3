"""`Mesh`: every Raft link of this process: dial, accept, drive handshakes, route to groups.

Role: every Raft group of the process sends through one `Mesh`; a frame names its group
(frames.py), and cluster/raft/adapter/ plugs one thin endpoint per group into pysyncobj. The
mesh owns the listener and every link (link.py), asks admission.py who may connect, drives
each link's handshake (cluster/raft/handshake.py), and hands each message to its group.

Rules:
- Runs on the Raft driver's event loop only, driven by its poller; it never blocks (sockets
  are non-blocking; a send is written at once, except while sends are `held` (the driver's
  ticks, the messages of one read that brought several), and what a socket does not take is
  queued and written when it is writable or by `flush`) and never raises out of a poller
  callback: a peer that misbehaves loses its link, the node carries on.
- Of each pair the node with the smaller address dials, from its own host; the other accepts.
  A link opens only through the handshake of cluster/raft/handshake.py (hellos, one
  AES-256-GCM key per direction from the cluster secret, a sealed proof each way), which this
  module drives with the frames a link receives before it opens. Without a secret (loopback
  only, enforced by the config) frames travel in clear.
- Before it opens a link is bounded, whatever arrives on it: it must be open within
  `handshake_timeout_s` of its accept (or dial), an absolute deadline that bytes do not put
  off, and its frames are at most 1 KiB (so the deadline also bounds a frame dripped in).
  How many may wait, and from where, is admission.py's.
- Frames are bounded by `frame_bytes_max` once open; a link whose peer stops reading is
  dropped once `queue_bytes_max` is queued; an open link that hears nothing (not even the
  pings sent when idle) for `timeout_s` is dropped. Raft resends what a dropped link lost.
- What went wrong shows: every refused or failed link before it opens (a stranger's address,
  a cap, a bad hello, a wrong secret, a claimed identity from another address, the deadline)
  is a WARNING through `RefusalLog`, one line per kind per `refusal_log_interval_s` with a
  count, quoting at most 80 characters of anything the peer sent; a dial to a peer that is
  down is only DEBUG. `refused_connections` counts connections closed unread,
  `failed_handshakes` links dropped before they opened, `last_failure` says why;
  `dropped_frames` counts messages for groups not started here; `messages_sent` and
  `messages_received` count the groups' messages by peer (what a node pair's traffic is).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from cluster.addresses import parse_address
from cluster.peer_hosts import normal_ip
from cluster.raft.handshake import NONCE_BYTES, Handshake, LinkError, Opened
from cluster.raft.mesh import frames
from cluster.raft.mesh.admission import IMPOSTOR, TIMED_OUT, Admission, failure_kind
from cluster.raft.mesh.link import Link, State, stage
from cluster.raft.mesh.settings import ERROR, READ, WRITE, Endpoint, MeshSettings, Poller
from cluster.refusals import RefusalLog

# The package's name, not this module's: log lines keep the logger they always had.
log = logging.getLogger(__package__)
_RECV_CHUNK_BYTES = 256 * 1024
_ACCEPTS_PER_EVENT = 64  # then the other links and groups run; the listener is still readable
_LINGER_NONE = struct.pack("ii", 1, 0)  # close with a reset: a refused stranger leaves no TIME_WAIT


class _RefusedLinkError(LinkError):
    """A link dropped for a reason the log counts as a kind of its own (admission.py's kinds)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Mesh:
    """Every Raft link of this process: dial, accept, authenticate, route frames to groups."""

    def __init__(self, settings: MeshSettings, poller: Poller) -> None:
        self.settings = settings
        self._poller = poller
        self._listener: socket.socket | None = None
        self._links: dict[int, Link] = {}  # by file descriptor, in every state
        self._open: dict[str, Link] = {}  # by peer address, OPEN only
        self._dialing: dict[str, Link] = {}
        self._retry_at: dict[str, float] = {}
        self._endpoints: dict[str, Endpoint] = {}
        self._scratch = memoryview(bytearray(_RECV_CHUNK_BYTES))  # every link reads through it
        self._holding = False  # in `held`: sends are queued, written when it ends
        self._admission = Admission(settings)
        self._refusals = RefusalLog(log, settings.refusal_log_interval_s, time.monotonic)
        self.dropped_frames = 0
        # Groups' messages by peer, each way: what every group's traffic costs a node pair
        # (pings, the links' own, are not counted).
        self.messages_sent: Counter[str] = Counter()
        self.messages_received: Counter[str] = Counter()
        self.refused_connections = 0
        self.failed_handshakes = 0
        self.last_failure = ""

    # -- lifecycle -------------------------------------------------------------------------------

    def bind(self) -> None:
        """Listen on this node's Raft address; OSError (e.g. the port is taken) to the caller."""
        host, port = parse_address(self.settings.self_address)
        try:
            listener = socket.create_server((host, port), backlog=64)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            message = f"cannot listen for Raft peers on {host}:{port}: {reason}"
            raise OSError(exc.errno, message) from exc
        listener.setblocking(False)
        self._listener = listener
        self._poller.subscribe(listener.fileno(), self._on_accept, READ | ERROR)

    def close(self) -> None:
        for link in list(self._links.values()):
            self._drop(link, None)
        if self._listener is not None:
            self._poller.unsubscribe(self._listener.fileno())
            self._listener.close()
            self._listener = None
        self._refusals.flush()

    @property
    def unopened_links(self) -> int:
        """Accepted links not yet open (authenticated)."""
        return self._admission.unopened

    def register(self, group: str, endpoint: Endpoint) -> None:
        assert group not in self._endpoints, f"group {group} registered twice"
        self._endpoints[group] = endpoint
        for address in self._open:
            endpoint.peer_connected(address)

    def unregister(self, group: str) -> None:
        self._endpoints.pop(group, None)

    def is_open(self, address: str) -> bool:
        return address in self._open

    def queued_bytes(self, address: str) -> int:
        """Bytes waiting to be written on the open link to `address` (0 without one)."""
        link = self._open.get(address)
        return 0 if link is None else link.out_bytes

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Queue sends until the block ends, then write them: one write per link for many
        messages (the driver's ticks, where every group may send a heartbeat)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            self.flush()

    # -- the driver loop -------------------------------------------------------------------------

    def send(self, address: str, group: str, message: dict[str, Any]) -> bool:
        """Send a message for a group to `address`; False when there is no open link.

        Written at once when nothing waits before it (Raft's messages are few, each carries a
        whole batch of records, and a follower's answer or a leader's append is on a
        producer's path: it must not wait for the end of the loop's turn), unless sends are
        `held`; what the socket does not take stays queued, and `flush` or the socket's
        writability writes it.
        """
        return self.send_payload(address, self.payload(group, message))

    @staticmethod
    def payload(group: str, message: dict[str, Any]) -> bytes:
        """A message as `send` writes it (before the link seals it): to pack a message once
        for several peers (a leader's append, a whole batch, to each of its followers)."""
        return frames.payload(group, message)

    def send_payload(self, address: str, payload: bytes) -> bool:
        """`send` of a message packed already by `payload`."""
        link = self._open.get(address)
        if link is None:
            return False
        idle = not link.out
        link.queue(payload)
        self.messages_sent[address] += 1
        if link.out_bytes > self.settings.queue_bytes_max:
            self._drop(link, f"{link.out_bytes} bytes queued: the peer is not reading")
            return False
        if idle and not self._holding:
            self._guarded(link, self._write)
        return self._open.get(address) is link  # a failed write drops the link

    def flush(self) -> None:
        for link in list(self._open.values()):
            if link.out:
                self._guarded(link, self._write)

    def tick(self, now: float) -> None:
        """Dial missing peers, ping idle links, drop silent ones and those not open in time;
        log the refusals a flood that stopped left folded."""
        self._refusals.flush_due()
        s = self.settings
        for link in list(self._links.values()):
            if link.state is not State.OPEN:
                if now >= link.deadline:
                    since = "dial" if link.dialer else "accept"
                    reason = (
                        f"not open {s.handshake_timeout_s:g} s after its {since} ({stage(link)})"
                    )
                    self._drop(link, reason, TIMED_OUT)
            elif now - link.last_recv > s.timeout_s:
                self._drop(link, f"nothing heard for {now - link.last_recv:.1f} s")
            elif now - link.last_send > s.ping_s:
                link.queue(frames.PING)
                link.last_send = now
        for address in sorted(s.peer_addresses):
            if (
                s.self_address < address
                and address not in self._open
                and address not in self._dialing
                and now >= self._retry_at.get(address, 0.0)
            ):
                self._dial(address, now)

    def receive_waiting(self) -> None:
        """Take in what already arrived on every open link, without waiting for the poller.

        The driver calls it before its timed ticks: after the loop was busy for a while, a
        leader's heartbeats may sit unread in a socket, and a tick that ran first would see an
        expired election timeout and depose a live leader.
        """
        for link in list(self._open.values()):
            self._guarded(link, self._take_input)

    # -- connections -----------------------------------------------------------------------------

    def _dial(self, address: str, now: float) -> None:
        self._retry_at[address] = now + self.settings.retry_s
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # From our own cluster address, so a peer (and a firewall rule) sees who dials.
            sock.bind((parse_address(self.settings.self_address)[0], 0))
            code = sock.connect_ex(parse_address(address))
        except OSError as exc:
            sock.close()
            log.debug("dial %s: %s", address, exc)
            return
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            return
        deadline = now + self.settings.handshake_timeout_s
        link = Link(sock, self._handshake(dialed=address), now, deadline)
        self._dialing[address] = link
        self._add(link, READ | WRITE | ERROR)

    def _on_accept(self, _descr: int, _event: int) -> None:
        assert self._listener is not None
        for _ in range(_ACCEPTS_PER_EVENT):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: keep serving what we have
                log.warning("accept failed: %s", exc)
                return
            text = str(address[0])
            self._admit(sock, normal_ip(text) or text)

    def _admit(self, sock: socket.socket, source: str) -> None:
        """Start the handshake of a connection from `source`, or close it unread: a stranger,
        or one past the caps on links not yet open (checked before a byte is read)."""
        refusal = self._admission.refusal(source)
        try:
            if refusal is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
                sock.close()
            else:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:  # reset already: nothing to serve
            sock.close()
            log.debug("raft connection from %s lost at accept: %s", source, exc)
            return
        if refusal is not None:
            kind, detail = refusal
            self.refused_connections += 1
            self.last_failure = detail
            self._refusals.warn(kind, detail)
            return
        now = time.monotonic()
        handshake = self._handshake(dialed=None)
        link = Link(sock, handshake, now, now + self.settings.handshake_timeout_s, source)
        self._admission.take_slot(link)
        self._add(link, READ | ERROR)

    def _handshake(self, *, dialed: str | None) -> Handshake:
        s = self.settings
        return Handshake(
            s.self_address,
            s.peer_addresses,
            s.secret,
            dialed=dialed,
            nonce=os.urandom(NONCE_BYTES),
        )

    def _add(self, link: Link, mask: int) -> None:
        self._links[link.fd] = link
        self._subscribe(link, mask)

    def _on_event(self, descr: int, event: int) -> None:
        link = self._links.get(descr)
        if link is not None:
            self._guarded(link, self._handle, event)

    def _guarded(self, link: Link, step: Callable[..., None], *args: int) -> None:
        try:
            step(link, *args)
        except _RefusedLinkError as exc:
            self._drop(link, exc.message, exc.kind)
        except LinkError as exc:
            self._drop(link, exc.message)
        except OSError as exc:
            self._drop(link, f"socket error: {exc}")

    def _handle(self, link: Link, event: int) -> None:
        if link.state is State.CONNECTING:
            link.connected(failed=bool(event & ERROR))
            self._write(link)
            return
        if event & READ:
            self._take_input(link)
        elif event & ERROR:
            raise LinkError("socket error")
        if event & WRITE:
            self._write(link)

    def _take_input(self, link: Link) -> None:
        before = len(link.inbuf)
        alive = link.read(self.settings.recv_bytes_per_event, self._scratch)
        if len(link.inbuf) != before:
            link.last_recv = time.monotonic()
        if link.burst() and not self._holding:
            # Every group's heartbeat, or a run of appends: what they make this node send
            # leaves together after the last of them. A lone message's answer leaves at once.
            with self.held():
                self._take_frames(link)
        else:
            self._take_frames(link)
        link.compact()
        if not alive:
            raise LinkError("closed by the peer")

    def _take_frames(self, link: Link) -> None:
        open_max = self.settings.frame_bytes_max
        # The bound is asked per frame: the frame that opens the link raises it for the next.
        while (frame := link.next_frame(link.frame_limit(open_max))) is not None:
            self._receive(link, frame)

    def _write(self, link: Link) -> None:
        link.write()
        link.last_send = time.monotonic()
        self._subscribe(link, READ | ERROR | (WRITE if link.out else 0))

    def _subscribe(self, link: Link, mask: int) -> None:
        if link.mask != mask:
            link.mask = mask
            self._poller.subscribe(link.fd, self._on_event, mask)

    def _drop(self, link: Link, reason: str | None, kind: str | None = None) -> None:
        """Close `link`. One that fails before it opens is counted and logged as a refusal
        (`kind`, or one told by how far its handshake got); a dial that never connected is
        only a peer that is down, logged at DEBUG."""
        if self._links.pop(link.fd, None) is None:
            return
        self._poller.unsubscribe(link.fd)
        link.sock.close()
        self._admission.free_slot(link)
        if link.peer is not None and self._dialing.get(link.peer) is link:
            del self._dialing[link.peer]
        if link.peer is not None and self._open.get(link.peer) is link:
            del self._open[link.peer]
            for endpoint in list(self._endpoints.values()):
                endpoint.peer_disconnected(link.peer)
            log.info("raft link to %s closed: %s", link.peer, reason or "shutdown")
        elif reason is not None and link.state is State.HANDSHAKE:
            self.failed_handshakes += 1
            self.last_failure = reason
            where = f"to {link.peer}" if link.dialer else f"from {link.source}"
            self._refusals.warn(kind or failure_kind(link), f"{where}: {reason}")
        elif reason is not None:
            log.debug("raft link to %s failed: %s", link.peer, reason)

    # -- handshake and routing -------------------------------------------------------------------

    def _receive(self, link: Link, frame: bytes) -> None:
        if link.state is State.OPEN:
            self._route(link, link.opener.open(frame))
        else:
            self._shake(link, frame)

    def _shake(self, link: Link, frame: bytes) -> None:
        """A frame of the handshake: send what it answers, and open the link once it is done."""
        step = link.handshake.receive(frame)
        if link.peer is None and link.handshake.peer is not None:  # a hello named the peer
            self._check_source(link.handshake.peer, link.source)
        link.peer = link.handshake.peer
        for out in step.send:
            link.queue_frame(out)
        self._write(link)
        if step.opened is not None:
            self._opened(link, step.opened)

    def _check_source(self, peer: str, source: str | None) -> None:
        """Refuse a hello that names `peer` from an address that is not the peer's."""
        message = self._admission.impostor(peer, source)
        if message is not None:
            raise _RefusedLinkError(IMPOSTOR, message)

    def _opened(self, link: Link, opened: Opened) -> None:
        peer = opened.peer
        assert link.peer == peer
        self._admission.free_slot(link)
        link.sealer, link.opener = opened.sealer, opened.opener
        if link.dialer:
            self._dialing.pop(peer, None)
        old = self._open.get(peer)
        if old is not None:  # the peer redialled: it saw the old link fail first
            self._drop(old, "replaced by a new connection")
        link.state = State.OPEN
        self._open[peer] = link
        log.info("raft link to %s open", peer)
        for endpoint in list(self._endpoints.values()):
            endpoint.peer_connected(peer)

    def _route(self, link: Link, frame: bytes) -> None:
        fields = frames.parse(frame, self.settings.frame_bytes_max)
        if fields is None:
            return  # a ping
        group, message = fields
        assert link.peer is not None
        self.messages_received[link.peer] += 1
        endpoint = self._endpoints.get(group)
        if endpoint is None or not isinstance(message, dict):
            self.dropped_frames += 1  # a group not started here (yet): Raft retries
            return
        endpoint.deliver(link.peer, message)
