"""The Raft mesh (cluster/raft/mesh/) on real loopback sockets, driven in-process by one loop.

Links open only between holders of the secret, carry each group's messages to that group,
survive garbage and strangers, and report a peer that goes away. Before a link opens it is
bounded: accepted links not yet open are capped in all and per source address (more are closed
unread), each must open within an absolute deadline however it drips bytes, and with peer
sources known a stranger's address is refused at accept and a peer's identity holds only from
that peer's address. A refusal is awaited as the event the mesh counts (`failed_handshakes` or
`refused_connections`, with its `last_failure`), never as a quiet window; the handshake's own
cases are tests/unit/test_handshake.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cluster.local import launcher
from cluster.raft import mesh as mesh_module
from cluster.raft.handshake import NONCE_BYTES, Handshake
from cluster.raft.mesh import ERROR, READ, WRITE, Mesh, MeshSettings
from statemachine.codec import pack
from tests.polling import poll_until

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
STRANGERS = ("127.0.0.5", "127.0.0.6", "127.0.0.7")


class SelectorPoller:
    """The poller interface the Raft driver gives the mesh, on the standard selectors."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()

    def subscribe(self, descr: int, callback: Callable[[int, int], None], mask: int) -> None:
        events = (selectors.EVENT_READ if mask & (READ | ERROR) else 0) | (
            selectors.EVENT_WRITE if mask & WRITE else 0
        )
        self.unsubscribe(descr)
        self._selector.register(descr, events, callback)

    def unsubscribe(self, descr: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(descr)

    def poll(self, timeout_s: float) -> None:
        for key, events in self._selector.select(timeout_s):
            mask = (READ if events & selectors.EVENT_READ else 0) | (
                WRITE if events & selectors.EVENT_WRITE else 0
            )
            key.data(key.fd, mask)


class Recorder:
    """A group endpoint that remembers what the mesh told it."""

    def __init__(self) -> None:
        self.connected: set[str] = set()
        self.ever_connected: set[str] = set()
        self.disconnections = 0
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def peer_connected(self, address: str) -> None:
        self.connected.add(address)
        self.ever_connected.add(address)

    def peer_disconnected(self, address: str) -> None:
        self.connected.discard(address)
        self.disconnections += 1

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        self.messages.append((address, message))


class Net:
    """Meshes of several nodes on one poller, stepped by `run_until`."""

    def __init__(self) -> None:
        self.poller = SelectorPoller()
        self.meshes: list[Mesh] = []

    def node(
        self, address: str, peers: set[str], secret: str | None = "s3cret", **overrides: Any
    ) -> Mesh:
        settings = MeshSettings(
            address,
            frozenset(peers),
            secret,
            frame_bytes_max=16 << 20,
            queue_bytes_max=64 << 20,
            timeout_s=2.0,
            retry_s=0.1,
            ping_s=0.1,
        )
        mesh = Mesh(dataclasses.replace(settings, **overrides), self.poller)
        mesh.bind()
        self.meshes.append(mesh)
        return mesh

    def step(self) -> None:
        for mesh in self.meshes:
            mesh.tick(time.monotonic())
            mesh.flush()
        self.poller.poll(0.01)

    def linked_pair(
        self, port: int, on_a: Recorder, on_b: Recorder, group: str = "g"
    ) -> tuple[Mesh, Mesh]:
        """Nodes on A and B, each with `group` registered, once their link is open."""
        a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
        a, b = self.node(a_addr, {b_addr}), self.node(b_addr, {a_addr})
        a.register(group, on_a)
        b.register(group, on_b)
        self.run_until(lambda: on_a.connected == {b_addr} and on_b.connected == {a_addr})
        return a, b

    def run_until(
        self, condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "the condition"
    ) -> None:
        """Step every mesh until `condition` holds; TimeoutError after `timeout_s`."""

        def stepped() -> bool:
            if condition():
                return True
            self.step()  # waits on the sockets up to 10 ms: no sleep needed between polls
            return False

        poll_until(stepped, timeout_s, what, interval_s=0)

    def close(self) -> None:
        for mesh in self.meshes:
            mesh.close()


@pytest.fixture
def net() -> Iterator[Net]:
    n = Net()
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def port() -> int:
    return launcher.choose_ports(3, os.getpid())[2]


def test_holders_of_the_secret_link_and_route_messages_by_group(net: Net, port: int) -> None:
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    on_a, on_b, other_b = Recorder(), Recorder(), Recorder()
    a, b = net.linked_pair(port, on_a, on_b, "g1")
    b.register("g2", other_b)  # a group started later hears of the open link at once
    assert other_b.connected == {a_addr}
    big = os.urandom(5 << 20)  # many partial writes and reads
    assert a.send(b_addr, "g1", {"type": "append_entries", "entries": ((big, 7, 2),)})
    assert a.send(b_addr, "g2", {"type": "request_vote", "term": 3})
    assert a.send(b_addr, "nowhere", {"type": "request_vote", "term": 3})
    net.run_until(lambda: len(on_b.messages) == 1 and len(other_b.messages) == 1)
    sender, message = on_b.messages[0]
    assert sender == a_addr and message["entries"] == ((big, 7, 2),)
    assert other_b.messages == [(a_addr, {"type": "request_vote", "term": 3})]
    net.run_until(lambda: b.dropped_frames == 1)  # the unknown group's message, dropped


def test_a_send_is_written_at_once_without_waiting_for_a_flush(net: Net, port: int) -> None:
    """A follower's answer and a leader's append are on a producer's path: `send` writes."""
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    on_a, on_b = Recorder(), Recorder()
    a, _ = net.linked_pair(port, on_a, on_b)
    answer = {"type": "next_node_idx", "next_node_idx": 5, "reset": False, "success": True}
    assert a.send(b_addr, "g", answer)

    def arrived() -> bool:  # only the sockets' readiness: no tick, no flush
        net.poller.poll(0.01)
        return bool(on_b.messages)

    poll_until(arrived, 5.0, "the message, without a flush", interval_s=0)
    assert on_b.messages == [(a_addr, answer)]


def test_sends_held_by_the_driver_leave_together_when_it_lets_go(net: Net, port: int) -> None:
    """The driver's ticks (every group's heartbeats) make one write per peer, not one each."""
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    on_a, on_b = Recorder(), Recorder()
    a, _ = net.linked_pair(port, on_a, on_b)
    beats = [{"type": "append_entries", "term": 1, "entries": (), "n": i} for i in range(3)]
    with a.held():
        assert all(a.send(b_addr, "g", beat) for beat in beats)
        assert a.queued_bytes(b_addr) > 0, "held: nothing written yet"
    assert a.queued_bytes(b_addr) == 0, "written when the block ended"
    net.run_until(lambda: len(on_b.messages) == 3)
    assert on_b.messages == [(a_addr, beat) for beat in beats]


class Replier(Recorder):
    """An endpoint that answers each message at once, as a follower answers an append, and
    notes what its mesh still had queued right after each answer."""

    def __init__(self) -> None:
        super().__init__()
        self.mesh: Mesh | None = None
        self.queued_after: list[int] = []

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        super().deliver(address, message)
        assert self.mesh is not None
        self.mesh.send(address, "g", {"type": "next_node_idx", "n": message["n"]})
        self.queued_after.append(self.mesh.queued_bytes(address))


def test_answers_to_a_burst_leave_together_and_to_a_lone_message_at_once(
    net: Net, port: int
) -> None:
    b_addr = f"{B}:{port}"
    on_a, on_b = Recorder(), Replier()
    a, b = net.linked_pair(port, on_a, on_b)
    on_b.mesh = b

    assert a.send(b_addr, "g", {"type": "append_entries", "n": 0})
    net.run_until(lambda: len(on_a.messages) == 1)
    assert on_b.queued_after == [0], "a lone message's answer is written at once"

    with a.held():  # one write: the three arrive in one read
        assert all(a.send(b_addr, "g", {"type": "append_entries", "n": n}) for n in (1, 2, 3))
    net.run_until(lambda: len(on_a.messages) == 4)
    assert on_b.queued_after[1:] == sorted(on_b.queued_after[1:]) and on_b.queued_after[1] > 0, (
        "the burst's answers wait for its last message"
    )
    assert [m["n"] for _, m in on_a.messages] == [0, 1, 2, 3]


def test_a_wrong_secret_never_gets_a_link(net: Net, port: int) -> None:
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    a = net.node(a_addr, {b_addr}, secret="right")
    b = net.node(b_addr, {a_addr}, secret="wrong")
    on_a, on_b = Recorder(), Recorder()
    a.register("g", on_a)
    b.register("g", on_b)
    # Refused, and refused again when the dialer retries.
    net.run_until(lambda: b.failed_handshakes >= 2, what="B to refuse A twice")
    assert "authentication" in b.last_failure
    net.run_until(lambda: a.failed_handshakes >= 2, what="A to see its links dropped")
    assert not on_a.ever_connected and not on_b.ever_connected
    assert not a.send(b_addr, "g", {"type": "x"})


def test_without_a_secret_on_both_sides_links_open_in_clear(net: Net, port: int) -> None:
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    a = net.node(a_addr, {b_addr}, secret=None)
    b = net.node(b_addr, {a_addr}, secret=None)
    net.run_until(lambda: a.is_open(b_addr) and b.is_open(a_addr))


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x05hello",  # a frame that is not msgpack
        b"\xff\xff\xff\xff",  # a length past the handshake bound
        pack(("raftbroker-mesh", 1, "127.0.0.9:1", "x", os.urandom(16))),  # unframed
        b"GET / HTTP/1.1\r\n\r\n",
    ],
    ids=["not-msgpack", "oversize-length", "unframed-handshake", "http"],
)
def test_garbage_on_the_raft_port_is_dropped_and_peers_still_link(
    net: Net, port: int, garbage: bytes
) -> None:
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    b = net.node(b_addr, {a_addr})
    stranger = socket.create_connection((B, port), timeout=2)
    try:
        stranger.sendall(garbage)
        stranger.setblocking(False)
        net.run_until(lambda: _closed(stranger), 3.0, "B to hang up on the stranger")
    finally:
        stranger.close()
    assert b.failed_handshakes == 1
    a = net.node(a_addr, {b_addr})
    net.run_until(lambda: a.is_open(b_addr) and b.is_open(a_addr))


def test_a_node_that_is_not_a_peer_is_refused(net: Net, port: int) -> None:
    a_addr, b_addr, c_addr = f"{A}:{port}", f"{B}:{port}", f"{C}:{port}"
    c = net.node(c_addr, {a_addr})  # knows only A
    intruder = net.node(b_addr, {c_addr})  # B claims to be a peer of C, and dials it
    net.run_until(lambda: c.failed_handshakes >= 2, what="C to refuse B twice")
    assert "not a peer" in c.last_failure
    net.run_until(lambda: intruder.failed_handshakes >= 2, what="B to see its links dropped")
    assert not c.is_open(b_addr) and not intruder.is_open(c_addr)


def test_a_stranger_that_says_nothing_is_dropped_when_the_handshake_times_out(
    net: Net, port: int
) -> None:
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    b = net.node(b_addr, {a_addr}, handshake_timeout_s=0.5)
    stranger = socket.create_connection((B, port), timeout=2)
    try:
        stranger.setblocking(False)
        net.run_until(lambda: b.failed_handshakes == 1, 3.0, "the handshake to time out")
        assert "not open 0.5 s after its accept" in b.last_failure
        assert "hello" in b.last_failure
        net.run_until(lambda: _closed(stranger), 3.0, "B to hang up on the stranger")
    finally:
        stranger.close()


def test_a_peer_that_goes_away_is_reported_and_relinked_when_back(net: Net, port: int) -> None:
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    a, b = net.node(a_addr, {b_addr}), net.node(b_addr, {a_addr})
    on_a = Recorder()
    a.register("g", on_a)
    net.run_until(lambda: on_a.connected == {b_addr})
    b.close()
    net.meshes.remove(b)
    net.run_until(lambda: not on_a.connected)
    net.node(b_addr, {a_addr})
    net.run_until(lambda: on_a.connected == {b_addr})


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


# -- before a link opens: caps, the absolute deadline, the peer's source address -------------


class PeerSourcesStub:
    """Where each peer connects from, as a node's `PeerHosts` would say."""

    def __init__(self, ips_by_address: dict[str, set[str]]) -> None:
        self._ips = {address: frozenset(ips) for address, ips in ips_by_address.items()}

    def ips_of(self, raft_address: str) -> frozenset[str]:
        return self._ips.get(raft_address, frozenset())

    def is_peer_ip(self, ip: str) -> bool:
        return any(ip in ips for ips in self._ips.values())


def connect_from(source_ip: str, port: int, target_ip: str = B) -> socket.socket:
    """A connection to the mesh at `target_ip` from `source_ip`, non-blocking once made."""
    sock = socket.create_connection((target_ip, port), timeout=2, source_address=(source_ip, 0))
    sock.setblocking(False)
    return sock


@pytest.mark.alone  # 0.4 s of slack on its deadline
def test_a_link_that_keeps_sending_bytes_is_still_dropped_at_its_deadline(
    net: Net, port: int
) -> None:
    """The deadline runs from the accept: a byte every 50 ms (a hello's frame that never ends,
    well under the 1 KiB bound) does not put it off, as it put off the old silence timeout."""
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    b = net.node(b_addr, {a_addr}, handshake_timeout_s=0.5)
    dripper = connect_from(STRANGERS[0], port)
    connected_at = time.monotonic()
    dripper.send((1000).to_bytes(4, "big"))
    drips = [connected_at]

    def drip_until_closed() -> bool:
        if _closed(dripper):
            return True
        if time.monotonic() - drips[-1] >= 0.05:
            dripper.send(b"x")
            drips.append(time.monotonic())
        return False

    try:
        net.run_until(drip_until_closed, 3.0, "B to hang up on the dripping link")
        held_s = time.monotonic() - connected_at
    finally:
        dripper.close()
    assert len(drips) > 5, "bytes kept arriving until the deadline"
    assert 0.5 <= held_s < 0.5 + 0.4, f"held {held_s:.2f} s for a 0.5 s deadline"
    assert b.failed_handshakes == 1 and "not open 0.5 s after its accept" in b.last_failure
    assert b.unopened_links == 0


def test_links_not_yet_open_are_capped_in_all_and_per_address(
    net: Net, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Past either cap a connection is closed unread (a reset at once), counted and logged at
    WARNING; a link that goes frees its slot; a peer links once strangers' deadlines pass."""
    a_addr, b_addr = f"{A}:{port}", f"{B}:{port}"
    caplog.set_level(logging.WARNING, logger="cluster.raft.mesh")
    b = net.node(
        b_addr,
        {a_addr},
        handshakes_max=4,
        handshakes_per_address_max=2,
        handshake_timeout_s=1.0,
    )
    held: list[socket.socket] = []
    try:

        def connect(source_ip: str, *, admitted: int, refused: int) -> socket.socket:
            sock = connect_from(source_ip, port)
            held.append(sock)
            net.run_until(
                lambda: b.unopened_links == admitted and b.refused_connections == refused,
                3.0,
                f"B to take in the connection from {source_ip}",
            )
            return sock

        first = connect(STRANGERS[0], admitted=1, refused=0)
        connect(STRANGERS[0], admitted=2, refused=0)
        third = connect(STRANGERS[0], admitted=2, refused=1)  # past 2 from one address
        net.run_until(lambda: _closed(third), 1.0, "the third to be closed at once")
        assert "raft_handshakes_per_address_max" in caplog.text
        assert not _closed(first), "the admitted ones wait for their deadline"

        first.close()  # a link that goes gives back its slot
        net.run_until(lambda: b.unopened_links == 1, 1.0, "B to see the first go")
        connect(STRANGERS[0], admitted=2, refused=1)
        connect(STRANGERS[1], admitted=3, refused=1)
        connect(STRANGERS[1], admitted=4, refused=1)
        fifth = connect(STRANGERS[2], admitted=4, refused=2)  # past 4 in all
        net.run_until(lambda: _closed(fifth), 1.0, "the fifth to be closed at once")
        assert "4 links not yet authenticated" in b.last_failure

        # The peer's dials are refused while strangers hold every slot, and get through once
        # their deadline drops them: it is not locked out for longer.
        a = net.node(a_addr, {b_addr})
        net.run_until(lambda: a.is_open(b_addr) and b.is_open(a_addr), 3.0, "A to link")
        assert b.unopened_links == 0
    finally:
        for sock in held:
            sock.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    kinds = {mesh_module.CROWDED_FROM, mesh_module.CROWDED, mesh_module.TIMED_OUT}
    assert {k for k in kinds if any(r.getMessage().startswith(k) for r in warnings)} == kinds


class RawDialer:
    """A node's side of the handshake spoken over a raw socket from any source address (an
    impostor that knows the secret), stepped by the `Net` like the meshes."""

    def __init__(self, claimed: str, target: str, secret: str, source_ip: str, port: int) -> None:
        self.handshake = Handshake(
            claimed,
            frozenset({target}),
            secret,
            dialed=target,
            nonce=os.urandom(NONCE_BYTES),
        )
        self.sock = connect_from(source_ip, port, target.rpartition(":")[0])
        self.inbuf = b""
        self.opened = False
        self.sock.sendall(_frame(self.handshake.hello()))

    def advance(self) -> bool:
        """Take in what arrived and answer it; True once open, or once the acceptor hung up."""
        try:
            chunk = self.sock.recv(4096)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return True
        self.inbuf += chunk
        while len(self.inbuf) >= 4 and len(self.inbuf) >= 4 + int.from_bytes(self.inbuf[:4], "big"):
            length = int.from_bytes(self.inbuf[:4], "big")
            frame, self.inbuf = self.inbuf[4 : 4 + length], self.inbuf[4 + length :]
            step = self.handshake.receive(frame)
            for out in step.send:
                self.sock.sendall(_frame(out))
            self.opened = step.opened is not None
        return self.opened


def test_a_peer_identity_holds_only_from_that_peer_s_address(
    net: Net, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """With the peers' sources known, a stranger's address is refused at accept, and a holder of
    the secret that claims to be A from C's address is refused once its hello names A: A's open
    link stays. The same claim from A's own address opens (and replaces A's link): the check,
    not something else, told them apart."""
    a_addr, b_addr, c_addr = f"{A}:{port}", f"{B}:{port}", f"{C}:{port}"
    caplog.set_level(logging.WARNING, logger="cluster.raft.mesh")
    sources = PeerSourcesStub({a_addr: {A}, c_addr: {C}})
    b = net.node(b_addr, {a_addr, c_addr}, sources=sources)
    a = net.node(a_addr, {b_addr})
    on_b = Recorder()
    b.register("g", on_b)
    net.run_until(lambda: on_b.connected == {a_addr}, 3.0, "A to link")

    stranger = connect_from(STRANGERS[0], port)
    try:
        net.run_until(lambda: _closed(stranger), 3.0, "B to refuse the stranger")
    finally:
        stranger.close()
    assert b.refused_connections == 1 and STRANGERS[0] in b.last_failure
    assert b.failed_handshakes == 0, "refused before a byte was read"

    impostor = RawDialer(a_addr, b_addr, "s3cret", C, port)
    try:
        net.run_until(impostor.advance, 3.0, "B to answer the impostor")
    finally:
        impostor.sock.close()
    assert not impostor.opened
    assert f"claims to be {a_addr} but connects from {C}" in b.last_failure
    assert mesh_module.IMPOSTOR in caplog.text
    assert on_b.disconnections == 0 and a.is_open(b_addr), "A's link stays"

    control = RawDialer(a_addr, b_addr, "s3cret", A, port)  # A's own address, a fresh port
    try:
        net.run_until(control.advance, 3.0, "B to answer the claim from A's address")
        assert control.opened, f"refused: {b.last_failure}"
        net.run_until(lambda: on_b.disconnections == 1, 3.0, "the claim to replace A's link")
    finally:
        control.sock.close()
    net.run_until(lambda: on_b.connected == {a_addr}, 3.0, "A to link again")


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload
