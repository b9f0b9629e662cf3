"""The Raft port (cluster/raft/mesh/) against connections that are not, or only claim to be,
peers: issue 19, defects 4 and 5 (the Raft port's side of 3).

A client that dripped bytes held thousands of unauthenticated links (any byte reset their
timeout), refusals were logged at DEBUG only, and a holder of the cluster secret could pose as
another node from any address and replace that node's link. Against a real cluster:

- a flood from one peer host's address (a stranger's address is refused at once; only a peer
  host's gets as far as the caps) never holds more than `raft_handshakes_per_address_max`
  of the node's sockets, each admitted one is closed at its absolute deadline however it
  drips, the node logs WARNING lines with counts rather than a line per connection, and a
  restarted peer links meanwhile;
- a process that knows the secret and claims to be node 1 is refused from 127.0.0.9 (no
  peer's address) and from node 3's address, and node 1's real link stays; the same claim
  from node 1's own address opens (and replaces that link): the source address decided.

The node's sockets are read from /proc (its fds' inodes, matched in /proc/<pid>/net/tcp).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster.config import Limits, Timing
from cluster.local import launcher
from cluster.raft import mesh
from cluster.raft.handshake import NONCE_BYTES, Handshake
from tests.adversarial.conftest import (
    Known,
    assert_intact,
    current_cluster,
    frame,
    http_exchange,
)
from tests.polling import poll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

PER_ADDRESS_MAX = Limits().raft_handshakes_per_address_max
DEADLINE_S = Timing().raft_handshake_timeout_ms / 1000
REFUSAL_LOG_INTERVAL_MS = 1_000  # so that lines with counts show within a test's seconds
# A connection closed within this of its connect was refused at accept; an admitted one is
# closed at its deadline, give or take the node's tick and a loaded machine's delay.
REFUSED_WITHIN_S = 0.5
DEADLINE_SLACK_S = 0.75
FLOOD_SOCKETS = 16  # kept connecting at once from the flooding address
DRIP_INTERVAL_S = 0.1
FLOOD_TIMEOUT_S = 30.0
SOCKET_TIMEOUT_S = 5.0
ESTABLISHED = "01"


@pytest.fixture(scope="module")
def known_toml() -> str:
    return f"[timing]\nrefusal_log_interval_ms = {REFUSAL_LOG_INTERVAL_MS}\n"


def node_of(known: Known, node_id: int) -> launcher.NodeProcess:
    return next(n for n in current_cluster(known).nodes if n.node_id == node_id)


def raft_address(node: launcher.NodeProcess) -> str:
    return f"{node.host}:{node.raft_port}"


def log_path(known: Known, node_id: int) -> Path:
    return known.cluster.data_dir / f"node{node_id}.log"


def log_since(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


# -- the node's sockets, from /proc ----------------------------------------------------------


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def _endpoint(text: str) -> tuple[str, int]:
    ip_hex, port_hex = text.split(":")
    return socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16))), int(port_hex, 16)


def connections_to(node: launcher.NodeProcess, from_ip: str) -> dict[int, int]:
    """The node's established sockets on its Raft port from `from_ip`: inode to remote port."""
    inodes = _socket_inodes(node.pid)
    found = {}
    for line in Path(f"/proc/{node.pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
        if (
            inode in inodes
            and state == ESTABLISHED
            and _endpoint(local) == (node.host, node.raft_port)
            and _endpoint(remote)[0] == from_ip
        ):
            found[inode] = _endpoint(remote)[1]
    return found


# -- (a) a flood of dripping connections ----------------------------------------------------


@dataclass(slots=True)
class _Conn:
    sock: socket.socket
    opened_at: float
    dripped_at: float
    closed_at: float | None = None


@dataclass(slots=True)
class Flood:
    """Connections from one address to a node's Raft port, kept coming, each dripping a byte
    every `DRIP_INTERVAL_S` into a 1000-byte hello frame that never ends."""

    source_ip: str
    target: tuple[str, int]
    live: list[_Conn] = field(default_factory=list)
    done: list[_Conn] = field(default_factory=list)

    def top_up(self, count: int) -> None:
        while len(self.live) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((self.source_ip, 0))
            sock.settimeout(SOCKET_TIMEOUT_S)
            now = time.monotonic()
            conn = _Conn(sock, now, now)
            try:
                sock.connect(self.target)  # the kernel's handshake: the node need not accept
            except ConnectionError:  # accepted and refused before connect returned
                conn.closed_at = time.monotonic()
                sock.close()
                self.done.append(conn)
                continue
            sock.setblocking(False)
            self.live.append(conn)
            self._send(conn, (1000).to_bytes(4, "big"))

    def step(self, wait_s: float) -> None:
        """Wait up to `wait_s` for the node to close some, note which, drip into the rest."""
        readable, _, _ = select.select([c.sock for c in self.live], [], [], wait_s)
        now = time.monotonic()
        for conn in self.live:
            if conn.sock in readable and _closed(conn.sock):
                conn.closed_at = now
            elif now - conn.dripped_at >= DRIP_INTERVAL_S:
                self._send(conn, b"x")
                conn.dripped_at = now
        for conn in [c for c in self.live if c.closed_at is not None]:
            conn.sock.close()
            self.live.remove(conn)
            self.done.append(conn)

    def _send(self, conn: _Conn, data: bytes) -> None:
        with contextlib.suppress(BlockingIOError, ConnectionError):  # closed: `step` sees it
            conn.sock.send(data)

    def close(self) -> None:
        for conn in self.live:
            conn.sock.close()


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def _stranger_refused_at_once(target: tuple[str, int]) -> float:
    """Connect from 127.0.0.9 and send a byte; how long until the node closed it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.9", 0))
        sock.settimeout(SOCKET_TIMEOUT_S)
        start = time.monotonic()
        with contextlib.suppress(ConnectionError):  # reset even before connect returned
            sock.connect(target)
            sock.send(b"\x00")
            assert sock.recv(1) == b"", "a stranger got an answer"
        return time.monotonic() - start


async def test_a_dripping_flood_from_one_address_is_capped_and_cut_at_the_deadline(
    known: Known,
) -> None:
    node1, node2, node3 = (node_of(known, i) for i in (1, 2, 3))
    target = (node3.host, node3.raft_port)
    log3 = log_path(known, 3)
    log3_start = log3.stat().st_size
    opened = f"raft link to {raft_address(node1)} open"

    # Node 1 goes down and comes back during the flood: it dials node 3 from its own address.
    launcher.kill(node1.pid, signal.SIGKILL, wait_s=10)
    flood = Flood(node2.host, target)  # node 2's host: a peer's address, so the caps apply
    samples: list[int] = []  # how many of the flood's connections node 3 held, each turn
    stranger_s: list[float] = []
    try:
        launcher.restart_node(current_cluster(known), 1)
        started = time.monotonic()
        relinked_at: float | None = None
        # Until node 1 has linked, and then a deadline and more, so that admitted connections
        # of the flood's last moments are seen cut too.
        while relinked_at is None or time.monotonic() < relinked_at + DEADLINE_S + 1.0:
            assert time.monotonic() - started < FLOOD_TIMEOUT_S, "node 1 never linked to node 3"
            flood.top_up(FLOOD_SOCKETS)
            flood.step(0.02)
            ports = {c.sock.getsockname()[1] for c in flood.live}
            held = [p for p in connections_to(node3, node2.host).values() if p in ports]
            samples.append(len(held))  # of the flood's: node 2's own link aside
            stranger_s.append(_stranger_refused_at_once(target))
            if relinked_at is None and opened in log_since(log3, log3_start):
                relinked_at = time.monotonic()
        young_s = max(time.monotonic() - c.opened_at for c in flood.live)
    finally:
        flood.close()

    lifetimes = [c.closed_at - c.opened_at for c in flood.done if c.closed_at is not None]
    refused = [t for t in lifetimes if t < REFUSED_WITHIN_S]
    admitted = [t for t in lifetimes if t >= REFUSED_WITHIN_S]
    # The node holds at most the cap, and for an instant one more: the connection it is
    # refusing, between its accept and its close (seen in about one sample in 300).
    assert max(samples) <= PER_ADDRESS_MAX + 1, f"node 3 held {max(samples)} of the flood's"
    assert sorted(samples)[len(samples) // 2] == PER_ADDRESS_MAX, "the flood never pressed the cap"
    assert len(admitted) >= PER_ADDRESS_MAX and len(refused) > 10 * len(admitted)
    assert min(admitted) >= DEADLINE_S - 0.05, "closed before its deadline"
    assert max(admitted) <= DEADLINE_S + DEADLINE_SLACK_S, f"held {max(admitted):.2f} s"
    assert young_s <= DEADLINE_S + DEADLINE_SLACK_S, f"one still open after {young_s:.2f} s"
    assert max(stranger_s) < REFUSED_WITHIN_S, "a stranger's connection was not refused at once"

    lines = [line for line in log_since(log3, log3_start).splitlines() if "WARNING" in line]
    for kind in (mesh.STRANGER, mesh.CROWDED_FROM, mesh.TIMED_OUT):
        assert any(kind in line for line in lines), f"no WARNING for {kind!r}"
    assert any("more like it" in line for line in lines), "no line with a count"
    refusals = len(lifetimes) + len(stranger_s)
    assert len(lines) * 10 < refusals, f"{len(lines)} WARNING lines for {refusals} refusals"
    metrics = (await http_exchange(node3, b"GET /metrics HTTP/1.1\r\n\r\n")).decode()
    counted = re.search(r"^raftbroker_raft_refused_connections_total (\S+)$", metrics, re.M)
    assert counted is not None and float(counted[1]) >= len(refused), "refusals not in /metrics"
    print(  # the numbers for the report (pytest -s)
        f"\nflood: {len(lifetimes)} closed ({len(admitted)} admitted, held "
        f"{sorted(Counter(samples).items())} (count, samples), "
        f"lifetimes {min(admitted):.2f}-{max(admitted):.2f} s), {len(stranger_s)} strangers "
        f"(max {max(stranger_s) * 1000:.1f} ms), {len(lines)} WARNING lines, "
        f"node 1 linked {relinked_at - started if relinked_at else -1:.2f} s after its restart"
    )
    await assert_intact(known)


# -- (b) a holder of the secret posing as another node ------------------------------------


def claim_identity(claimed: str, target: launcher.NodeProcess, secret: str, source_ip: str) -> bool:
    """Speak the dialer's side of the handshake as `claimed`, from `source_ip`, to `target`'s
    Raft port; True when the link opened, False when the node hung up first."""
    dialed = raft_address(target)
    handshake = Handshake(
        claimed, frozenset({dialed}), secret, dialed=dialed, nonce=os.urandom(NONCE_BYTES)
    )
    try:  # a refusal at accept may reset the connection before `connect` even returns
        with socket.create_connection(
            (target.host, target.raft_port), SOCKET_TIMEOUT_S, source_address=(source_ip, 0)
        ) as sock:
            sock.sendall(frame(handshake.hello()))
            for payload in _frames(sock):
                step = handshake.receive(payload)
                for out in step.send:
                    sock.sendall(frame(out))
                if step.opened is not None:
                    return True
    except ConnectionError:
        pass
    return False


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """Each frame the node sends, until it closes."""
    buffer = b""
    while chunk := sock.recv(4096):
        buffer += chunk
        while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
            length = int.from_bytes(buffer[:4], "big")
            yield buffer[4 : 4 + length]
            buffer = buffer[4 + length :]


async def test_a_holder_of_the_secret_cannot_pose_as_another_node_from_elsewhere(
    known: Known,
) -> None:
    node1, node2, node3 = (node_of(known, i) for i in (1, 2, 3))
    secret = launcher.existing_secret(known.cluster.data_dir)
    assert secret is not None
    log2 = log_path(known, 2)
    log2_start = log2.stat().st_size
    # Node 1 (the smaller address) dials node 2: its link is node 2's one socket from node 1.
    (link,) = poll_until(
        lambda: connections_to(node2, node1.host) or None, 10.0, "node 1's link to node 2"
    )

    assert not claim_identity(raft_address(node1), node2, secret, "127.0.0.9")
    assert not claim_identity(raft_address(node1), node2, secret, node3.host)
    assert set(connections_to(node2, node1.host)) == {link}, "node 1's link was replaced"
    seen = log_since(log2, log2_start)
    assert f"{mesh.STRANGER}: from 127.0.0.9" in seen
    claim = f"claims to be {raft_address(node1)} but connects from {node3.host}"
    assert f"{mesh.IMPOSTOR}: from {node3.host}: {claim}" in seen

    # The control: the same claim from node 1's own address (a fresh port) is taken, and
    # replaces node 1's link (node 1 dials again once it sees it go): node 2 closes the old
    # socket as it takes the new one, which its loop may do a moment after the claim's answer.
    assert claim_identity(raft_address(node1), node2, secret, node1.host)
    poll_until(
        lambda: link not in connections_to(node2, node1.host),
        10.0,
        "the control to replace node 1's link",
    )
    await assert_intact(known)
