"""The Raft mesh (cluster/raft/mesh.py) on real loopback sockets, driven in-process by one loop.

Links open only between holders of the secret, carry each group's messages to that group,
survive garbage and strangers, and report a peer that goes away. A refusal is awaited as the
event the mesh counts (`failed_handshakes`, with its `last_failure`), never as a quiet window;
the handshake's own cases are tests/unit/test_handshake.py's.
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
from cluster.raft.mesh import ERROR, READ, WRITE, Mesh, MeshSettings
from statemachine.codec import pack
from tests.polling import poll_until

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
        self.ever_connected: set[str] = set()
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def peer_connected(self, address: str) -> None:
        self.connected.add(address)
        self.ever_connected.add(address)

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
    b = net.node(b_addr, {a_addr})  # a link's handshake has half its 2 s timeout
    stranger = socket.create_connection((B, port), timeout=2)
    try:
        stranger.setblocking(False)
        net.run_until(lambda: b.failed_handshakes == 1, 3.0, "the handshake to time out")
        assert "nothing heard" in b.last_failure and "hello" in b.last_failure
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
