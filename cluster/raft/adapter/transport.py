"""pysyncobj's transport onto the process's `Mesh`: each group's messages through one link per
node pair (`MeshTransport`), what a peer may send a group refused before pysyncobj sees it
(`refusal_of`), and the node and notifier stand-ins pysyncobj's `SyncObj` wants.
Part of the Raft adapter (cluster/raft/adapter/__init__.py has its rules).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from pysyncobj.node import Node, TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE
from pysyncobj.transport import Transport

from cluster.raft.mesh import Mesh

log = logging.getLogger(__name__)

# A log entry of ours: pysyncobj's type byte for a regular command, then a mark of our own.
ENTRY_PREFIX = bytes([_COMMAND_TYPE.REGULAR]) + b"R"


NO_OP_ENTRY = bytes([_COMMAND_TYPE.NO_OP])  # a leader's first entry of its term


class _GroupPolls:
    """The poller a group sees: it never polls, and nothing it registers is ever watched.

    Every group's `doTick` ends with a `poll` of its own poller, and its pipe notifier registers
    there; both are the driver's business (it watches the mesh's sockets on the event loop and
    is told of proposals directly), so this poller only absorbs the calls.
    """

    def subscribe(self, descr: int, callback: Any, event_mask: int) -> None:
        pass

    def unsubscribe(self, descr: int) -> None:
        pass

    def poll(self, timeout: float) -> None:
        pass


class MeshTransport(Transport):  # type: ignore[misc]
    """pysyncobj's transport for one group: a view of the process-wide `Mesh`.

    It registers with the mesh when pysyncobj first asks it to get ready (pysyncobj sets its
    callbacks after constructing the transport, so connection news must wait until then).
    """

    def __init__(self, sync_obj: Any, self_node: Any, other_nodes: Any) -> None:
        sync_obj._poller = _GroupPolls()
        super().__init__(sync_obj, self_node, other_nodes)
        self._sync_obj = sync_obj
        self._mesh: Mesh = sync_obj.raftbroker_mesh
        self._group: str = sync_obj.raftbroker_group
        self._nodes: dict[str, Any] = {node.address: node for node in other_nodes}
        self._registered = False
        self._durable: bool = sync_obj.raftbroker_durable

    @property
    def ready(self) -> bool:
        return self._registered

    def tryGetReady(self) -> None:  # noqa: N802
        if not self._registered:
            self._registered = True
            self._mesh.register(self._group, self)

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        kind = message.get("type")
        if self._durable and kind == "next_node_idx":
            # A follower's acknowledgement says it holds the entries: on disk, when durable
            # (one sync for everything this event appended or cut, however many entries).
            self._sync_obj.sync_journal()
        elif kind == "apply_command_response" and "log_idx" in message:
            # A leader tells a follower where its forwarded entry went: its commit will be
            # told at once (`_SyncObj__applyLogEntries`), the follower's proposer waits for it.
            sync = self._sync_obj
            sync.raftbroker_forwarded_upto = max(sync.raftbroker_forwarded_upto, message["log_idx"])
        return self._mesh.send(node.address, self._group, message)

    def send_to_each(self, nodes: Iterable[Any], message: dict[str, Any]) -> None:
        """The same message to each of `nodes`, packed once (a leader's new entry)."""
        assert message.get("type") != "next_node_idx", "an acknowledgement goes to one node"
        payload = self._mesh.payload(self._group, message)
        for node in nodes:
            self._mesh.send_payload(node.address, payload)

    def destroy(self) -> None:
        self._mesh.unregister(self._group)

    # -- the mesh's Endpoint ---

    def peer_connected(self, address: str) -> None:
        node = self._nodes.get(address)
        if node is not None:
            self._onNodeConnected(node)
            self._sync_obj.raftbroker_wake()

    def peer_disconnected(self, address: str) -> None:
        node = self._nodes.get(address)
        if node is not None:
            self._onNodeDisconnected(node)
            self._sync_obj.raftbroker_wake()

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        node = self._nodes.get(address)
        if node is None:
            return
        sync = self._sync_obj
        kind = message.get("type")
        # Known before the message is taken in: it may make a leader or candidate a follower.
        heard = Heard.APPEND if kind == "append_entries" and not sync._isLeader() else Heard.OTHER
        try:
            self._onMessageReceived(node, message)
        except Exception:  # noqa: BLE001 - logged by log_failure, counted as a failed tick
            # A peer holds the secret, so this is a bug or a broken replica, not an attack; it
            # must not take the driver (and every other group) down with it, and it
            # must show: it counts as a failed tick, which makes the group report unhealthy.
            sync.raftbroker_tick_errors += 1
            log_failure(sync, f"group {self._group}: a message from {address} failed")
        else:
            if kind == "next_node_idx" and sync.holds_every_entry(node):
                heard = Heard.ACK_CAUGHT_UP
        sync.raftbroker_heard(heard)


def refusal_of(message: dict[str, Any]) -> str | None:
    """Why a peer's message must not reach pysyncobj, or None when it may.

    Only entries of ours (`ENTRY_PREFIX`) and pysyncobj's no-op may enter a log: stock
    pysyncobj would unpickle any other entry when it applies it (and our apply asserts on one,
    stopping the replica). So an append whose entries are anything else is refused, and so is a
    forwarded command without our prefix, and a chunked entry (`transmission`: pysyncobj
    unpickles the chunks it joins; our leaders never send one).
    """
    kind = message.get("type")
    if kind == "append_entries":
        if "transmission" in message:
            return "a chunked entry (pysyncobj would unpickle it; we never send one)"
        entries = message.get("entries", ())
        if not isinstance(entries, (list, tuple)):
            return "entries that are not a list"
        for entry in entries:
            if not _is_our_entry(entry):
                return f"an entry that is not ours: {_sample(entry)}"
    elif kind == "apply_command":
        command = message.get("command")
        if not (isinstance(command, bytes) and command.startswith(ENTRY_PREFIX)):
            return f"a forwarded command that is not ours: {_sample(command)}"
    return None


def _is_our_entry(entry: object) -> bool:
    """`(command, index, term)` whose command is ours or pysyncobj's no-op."""
    if not (isinstance(entry, (list, tuple)) and len(entry) == 3):
        return False
    command, index, term = entry
    return (
        isinstance(command, bytes)
        and (command.startswith(ENTRY_PREFIX) or command == NO_OP_ENTRY)
        and type(index) is int
        and type(term) is int
    )


def _sample(value: object) -> str:
    """A short, safe rendering of what a peer sent, for a log line."""
    return repr(value)[:48]


class MeshNode(TCPNode):  # type: ignore[misc]
    """A replica's address, as pysyncobj keys its tables: equal to a stock node of the same
    address and hashed alike, but the hash is kept. pysyncobj hashes nodes some thirty times
    a write, each a `__hash__` and an `id` property in Python."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self._hash = hash(address)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        # The stock comparison reads the `id` property of both sides, in Python; a follower
        # compares its leader with the sender of every append.
        return self is other or (isinstance(other, Node) and self._id == other.id)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


class Notifier:
    """pysyncobj's pipe notifier, replaced: `notify` marks the group due on the driver's loop."""

    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify


def log_failure(sync_obj: Any, what: str) -> None:
    """Log a recurring failure of a group at its 1st, 10th, 100th, ... occurrence."""
    count = sync_obj.raftbroker_tick_errors
    if count in (1, 10, 100, 1_000, 10_000):
        log.exception("%s (%d failures so far)", what, count)


class Heard(Enum):
    """What a peer's message was, for the driver to decide whether its group needs a tick."""

    APPEND = "an append, taken in by a follower"
    ACK_CAUGHT_UP = "a leader heard a follower that now holds its whole log"
    OTHER = "anything else"
