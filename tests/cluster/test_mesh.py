"""The Raft mesh (cluster/mesh.py) on real loopback sockets, driven in-process by one loop.

Links open only between holders of the secret, carry each group's messages to that group,
survive garbage and strangers, and report a peer that goes away.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cluster.local import launcher
from cluster.raft.mesh import ERROR, READ, WRITE, Mesh, MeshSettings, _Cipher, derive_keys
from statemachine.codec import pack

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


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
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def peer_connected(self, address: str) -> None:
        self.connected.add(address)

    def peer_disconnected(self, address: str) -> None:
        self.connected.discard(address)

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        self.messages.append((address, message))


class Net:
    """Meshes of several nodes on one poller, stepped by `run_until`."""

    def __init__(self) -> None:
        self.poller = SelectorPoller()
        self.meshes: list[Mesh] = []

    def node(self, address: str, peers: set[str], secret: str | None = "s3cret") -> Mesh:
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
        mesh = Mesh(settings, self.poller)
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

    def run_until(self, condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, "condition not reached in time"
            self.step()

    def run_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.step()

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
    deadline = time.monotonic() + 5.0
    while not on_b.messages:  # only the sockets' readiness: no tick, no flush
        assert time.monotonic() < deadline, "the message waited for a flush"
        net.poller.poll(0.01)
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
    net.run_for(1.0)
    assert not on_a.connected and not on_b.connected
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
        net.run_until(lambda: _closed(stranger), timeout_s=3.0)
    finally:
        stranger.close()
    a = net.node(a_addr, {b_addr})
    net.run_until(lambda: a.is_open(b_addr) and b.is_open(a_addr))


def test_a_node_that_is_not_a_peer_is_refused(net: Net, port: int) -> None:
    a_addr, b_addr, c_addr = f"{A}:{port}", f"{B}:{port}", f"{C}:{port}"
    b = net.node(c_addr, {a_addr})  # knows only A
    intruder = net.node(b_addr, {c_addr})  # B claims to be a peer of C
    net.run_for(0.5)
    assert not b.is_open(b_addr) and not intruder.is_open(c_addr)


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


def test_sealed_frames_open_only_once_and_in_order() -> None:
    to_acceptor, to_dialer = derive_keys("secret", b"d" * 16, b"a" * 16)
    assert to_acceptor != to_dialer
    sealer, opener = _Cipher(to_acceptor), _Cipher(to_acceptor)
    first, second = sealer.seal(b"one"), sealer.seal(b"two")
    with pytest.raises(Exception, match="authentication"):
        opener.open(second)  # reordered
    replay = _Cipher(to_acceptor)
    assert replay.open(first) == b"one"
    with pytest.raises(Exception, match="authentication"):
        replay.open(first)  # replayed


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
