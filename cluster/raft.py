"""Raft groups: the only module that imports pysyncobj.

A `RaftGroup` replicates `bytes` commands and applies them, in log order, to a
`ReplicatedMachine`; `propose()` returns the apply result on the caller's event loop, or raises
`ProposalError` with a retriable `ErrorCode` when leadership is lost, the queue is full or the
proposal times out. Commands travel as one `bytes` value, so pysyncobj's pickling is a memcpy.

Threads: one `RaftDriver` thread per process ticks every group (pysyncobj with
`autoTick=False`) over one shared poller, so idle cost grows per group by a few dict lookups, not
by a thread. Machines are applied and snapshotted only on that thread; other threads reach a
machine through `RaftDriver.call`.

Hardening of pysyncobj 0.3.17 (pinned in pyproject.toml; see DESIGN.md):
- its leader sets a follower's next index to the index in each successful reply, so under
  pipelining an old reply rewinds it and the follower truncates entries it already applied;
  `_PatchedSyncObj` keeps the larger of the old and new index (the whole fix);
- peer traffic goes through our own transport, `cluster/mesh.py` (one authenticated, encrypted
  connection per node pair for every group, msgpack frames), not pysyncobj's (a connection and
  port per group, bound to 0.0.0.0, every message pickled, zlib-compressed and Fernet-wrapped);
  large entries travel whole, never as pysyncobj's pickled chunks with a round trip each;
- journal together with a full dump file, a regular compaction bound, a short leader fallback,
  batching off for latency;
- snapshots go through our own serializer: the machine's canonical bytes plus pysyncobj's two
  boundary entries, encoded with msgpack, never a pickle of the machine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE, createPoller
from pysyncobj.transport import Transport

from cluster import mesh as mesh_module
from cluster.config import Timing
from cluster.mesh import Mesh, MeshSettings
from statemachine.codec import CodecError, pack, unpack
from statemachine.errors import ErrorCode

log = logging.getLogger(__name__)
T = TypeVar("T")

SNAPSHOT_FORMAT = 1
assert (mesh_module.READ, mesh_module.WRITE, mesh_module.ERROR) == (
    POLL_EVENT_TYPE.READ,
    POLL_EVENT_TYPE.WRITE,
    POLL_EVENT_TYPE.ERROR,
), "the mesh's poller event bits must be pysyncobj's"
_NOT_LEADER = frozenset(
    {
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.LEADER_CHANGED,
    }
)
# A replica whose applied index trails its commit index for this long is reported unhealthy.
STALL_REPORT_S = 5.0


class ReplicatedMachine(Protocol):
    """What a Raft group applies: deterministic, called only on the driver thread."""

    def apply(self, command: bytes) -> object: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class ProposalError(Exception):
    """A proposal that did not produce a result; `error` is retriable, `leader` a hint."""

    def __init__(self, error: ErrorCode, leader: str | None = None) -> None:
        super().__init__(error.name)
        self.error = error
        self.leader = leader


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One replica of a group: its name, its Raft address and its peers' Raft addresses.

    `route` names the group on the wire and must never name another group, even a deleted one
    of the same name: a replica left behind would otherwise talk to its successor.
    """

    name: str
    self_address: str
    peer_addresses: tuple[str, ...]
    directory: Path
    route: str


@dataclass(frozen=True, slots=True)
class GroupStatus:
    name: str
    is_leader: bool
    serving: bool
    leader_address: str | None
    term: int
    commit_index: int
    last_applied: int
    healthy: bool
    detail: str


def _sync_conf(
    spec: GroupSpec,
    *,
    timing: Timing,
    compaction_entries: int,
    entries_bytes_max: int,
    serializer: Callable[[str, Any], None],
    deserializer: Callable[[str], Any],
) -> SyncObjConf:
    spec.directory.mkdir(parents=True, exist_ok=True)
    return SyncObjConf(
        autoTick=False,
        appendEntriesUseBatch=False,
        # Entries per message up to this size. Below it pysyncobj would send one large entry as
        # pickled chunks, each answered before the next (a round trip per 64 KiB by default).
        appendEntriesBatchSizeBytes=entries_bytes_max,
        appendEntriesPeriod=timing.heartbeat_ms / 1000,
        raftMinTimeout=timing.election_timeout_ms_min / 1000,
        raftMaxTimeout=timing.election_timeout_ms_max / 1000,
        leaderFallbackTimeout=timing.leader_fallback_ms / 1000,
        connectionTimeout=timing.connection_timeout_ms / 1000,
        connectionRetryTime=timing.connection_retry_ms / 1000,
        journalFile=str(spec.directory / "raft.journal"),
        fullDumpFile=str(spec.directory / "raft.dump"),
        serializer=serializer,
        deserializer=deserializer,
        logCompactionMinEntries=compaction_entries,
        logCompactionMinTime=60,
        commandsQueueSize=0,  # we bound the queue ourselves, per group, in RaftGroup
        # pysyncobj spins on the constructing thread between bind attempts: keep it short, the
        # node retries a group that failed to start later, without blocking the others.
        bindRetryTime=0.1,
        maxBindRetries=3,
        dynamicMembershipChange=False,
        useFork=False,
    )


class _DriverPolls:
    """The shared poller as a group sees it: it registers sockets, but never polls.

    Every group's `doTick` ends with a `poll` of its poller. On the shared poller that would
    handle other groups' events in the middle of the tick loop, after their commit step, and
    the driver would then sleep a whole tick before acting on them (25 ms stalls, measured).
    Only the driver polls, and then ticks every group.
    """

    def __init__(self, poller: Any) -> None:
        self._poller = poller

    def subscribe(self, descr: int, callback: Any, event_mask: int) -> None:
        self._poller.subscribe(descr, callback, event_mask)

    def unsubscribe(self, descr: int) -> None:
        self._poller.unsubscribe(descr)

    def poll(self, timeout: float) -> None:
        pass


class _MeshTransport(Transport):  # type: ignore[misc]
    """pysyncobj's transport for one group: a view of the process-wide `Mesh`.

    It registers with the mesh when pysyncobj first asks it to get ready (pysyncobj sets its
    callbacks after constructing the transport, so connection news must wait until then).
    """

    def __init__(self, sync_obj: Any, self_node: Any, other_nodes: Any) -> None:
        sync_obj._poller = _DriverPolls(sync_obj.raftbroker_poller)
        super().__init__(sync_obj, self_node, other_nodes)
        self._sync_obj = sync_obj
        self._mesh: Mesh = sync_obj.raftbroker_mesh
        self._group: str = sync_obj.raftbroker_group
        self._nodes: dict[str, Any] = {node.address: node for node in other_nodes}
        self._registered = False

    @property
    def ready(self) -> bool:
        return self._registered

    def tryGetReady(self) -> None:  # noqa: N802
        if not self._registered:
            self._registered = True
            self._mesh.register(self._group, self)

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        return self._mesh.send(node.address, self._group, message)

    def destroy(self) -> None:
        self._mesh.unregister(self._group)

    # -- the mesh's Endpoint ---

    def peer_connected(self, address: str) -> None:
        node = self._nodes.get(address)
        if node is not None:
            self._onNodeConnected(node)

    def peer_disconnected(self, address: str) -> None:
        node = self._nodes.get(address)
        if node is not None:
            self._onNodeDisconnected(node)

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        node = self._nodes.get(address)
        if node is None:
            return
        try:
            self._onMessageReceived(node, message)
        except Exception:
            # A peer holds the secret, so this is a bug or a broken replica, not an attack; it
            # must not take the driver thread (and every other group) down with it, and it
            # must show: it counts as a failed tick, which makes the group report unhealthy.
            self._sync_obj.raftbroker_tick_errors += 1
            _log_failure(self._sync_obj, f"group {self._group}: a message from {address} failed")


def _log_failure(sync_obj: Any, what: str) -> None:
    """Log a recurring failure of a group at its 1st, 10th, 100th, ... occurrence."""
    count = sync_obj.raftbroker_tick_errors
    if count in (1, 10, 100, 1_000, 10_000):
        log.exception("%s (%d failures so far)", what, count)


class _PatchedSyncObj(SyncObj):  # type: ignore[misc]
    """A SyncObj applying bytes to one machine, with the next-index rewind fixed."""

    def __init__(
        self,
        machine: ReplicatedMachine,
        spec: GroupSpec,
        conf: SyncObjConf,
        poller: Any,
        mesh: Mesh,
    ) -> None:
        self.raftbroker_machine = machine
        self.raftbroker_poller = poller
        self.raftbroker_mesh = mesh
        self.raftbroker_group = spec.route
        self.raftbroker_tick_errors = 0
        self.raftbroker_leading = False
        # Called on the driver thread when this replica stops leading (set by RaftGroup).
        self.raftbroker_on_deposed: Callable[[], None] | None = None
        super().__init__(
            spec.self_address,
            list(spec.peer_addresses),
            conf,
            transportClass=_MeshTransport,
        )

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, command: bytes) -> object:
        return self.raftbroker_machine.apply(command)

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:  # noqa: N802
        # The stock leader assigns a follower's next index from every successful reply; with
        # pipelined appends an older reply rewinds it, and the follower is then sent entries
        # it already holds and truncates (DESIGN.md). Keep the larger index.
        rewinds = (
            message.get("type") == "next_node_idx"
            and message.get("success")
            and not (message.get("reset"))
        )
        next_index: dict[Any, int] = self._SyncObj__raftNextIndex
        before = next_index.get(node) if rewinds else None
        SyncObj._SyncObj__onMessageReceived(self, node, message)
        if before is not None and next_index.get(node, before) < before:
            next_index[node] = before

    def follower_match_indexes(self) -> dict[str, int]:
        """On a leader: each follower's replicated index, by Raft address (a copy)."""
        if not self._isLeader():
            return {}
        match: dict[Any, int] = self._SyncObj__raftMatchIndex
        return {str(node.address): index for node, index in list(match.items())}

    @property
    def noop_index(self) -> int | None:
        index: int | None = self._SyncObj__noopIDx
        return index


class RaftDriver:
    """The one thread that ticks every Raft group of a process."""

    def __init__(self, timing: Timing, mesh: MeshSettings, compaction_entries: int = 2_000) -> None:
        self.timing = timing
        self.compaction_entries = compaction_entries
        # A message carries entries up to half a mesh frame, so one more entry still fits.
        self.entries_bytes_max = mesh.frame_bytes_max // 2
        self._poller = createPoller("auto")
        self.mesh = Mesh(mesh, self._poller)
        self._groups: dict[str, _PatchedSyncObj] = {}
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._calls = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller.subscribe(self._wake_r, self._drain_wakeups, POLL_EVENT_TYPE.READ)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raft-driver", daemon=True)
        self.tick_s = min(timing.heartbeat_ms / 4000, 0.025)

    def start(self) -> None:
        """Bind the Raft port (OSError if it is taken) and start the driver thread."""
        self.mesh.bind()
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self._wake()
        self._thread.join(timeout_s)

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn` on the driver thread; its result or exception lands in the future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((fn, future))
        self._wake()
        return future

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe: the driver is awake already
            os.write(self._wake_w, b"w")

    def _drain_wakeups(self, _descr: int, _event: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._run_calls()
            for group in list(self._groups.values()):
                self._tick(group)
            self.mesh.tick(time.monotonic())
            self.mesh.flush()
            self._poller.poll(self.tick_s)
            self.mesh.flush()  # replies sent while handling what arrived, without a tick's delay
        for group in list(self._groups.values()):
            group.destroy()
        self._groups.clear()
        self.mesh.close()

    def _run_calls(self) -> None:
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # delivered to the caller, who decides
                    future.set_exception(exc)

    @staticmethod
    def _tick(group: _PatchedSyncObj) -> None:
        try:
            group.doTick(0.0)
            leading = bool(group._isLeader())
            if group.raftbroker_leading and not leading and group.raftbroker_on_deposed:
                group.raftbroker_on_deposed()
            group.raftbroker_leading = leading
        except Exception:
            # pysyncobj's own tick thread logs and carries on; we do the same but count it,
            # so a replica that fails on every tick shows up as unhealthy, not silent.
            group.raftbroker_tick_errors += 1
            _log_failure(group, f"group {group.raftbroker_group}: a tick failed")

    # -- used on the driver thread only --

    def _add(self, spec: GroupSpec, machine: ReplicatedMachine) -> _PatchedSyncObj:
        assert spec.name not in self._groups, f"group {spec.name} exists"
        assert spec.self_address == self.mesh.settings.self_address, "a group of another node"
        snapshots = _SnapshotFile(machine)
        conf = _sync_conf(
            spec,
            timing=self.timing,
            compaction_entries=self.compaction_entries,
            entries_bytes_max=self.entries_bytes_max,
            serializer=snapshots.serialize,
            deserializer=snapshots.deserialize,
        )
        group = _PatchedSyncObj(machine, spec, conf, self._poller, self.mesh)
        self._groups[spec.name] = group
        return group

    def _remove(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is not None:
            group.destroy()

    async def add_group(
        self, spec: GroupSpec, machine: ReplicatedMachine, max_pending: int
    ) -> RaftGroup:
        sync = await asyncio.wrap_future(self.call(lambda: self._add(spec, machine)))
        return RaftGroup(spec, sync, self, max_pending)

    async def remove_group(self, name: str) -> None:
        await asyncio.wrap_future(self.call(lambda: self._remove(name)))


class _SnapshotFile:
    """pysyncobj's serializer hooks: `[format, machine bytes, last entry, prev entry, nodes]`."""

    def __init__(self, machine: ReplicatedMachine) -> None:
        self._machine = machine

    def serialize(self, path: str, raft_data: Any) -> None:
        last_entry, prev_entry, nodes = raft_data
        data = pack(
            [
                SNAPSHOT_FORMAT,
                self._machine.snapshot(),
                list(last_entry),
                list(prev_entry),
                sorted(n.address for n in nodes),
            ]
        )
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the dump replaces journal entries: it must outlive a crash

    def deserialize(self, path: str) -> tuple[Any, ...]:
        with open(path, "rb") as f:
            data = f.read()
        try:
            raw = unpack(data, size_max=len(data))
        except CodecError as exc:
            raise CodecError(f"raft dump {path}: {exc}") from exc
        if not (isinstance(raw, tuple) and len(raw) == 5 and raw[0] == SNAPSHOT_FORMAT):
            raise CodecError(f"raft dump {path}: not a format-{SNAPSHOT_FORMAT} dump")
        _, machine, last_entry, prev_entry, addresses = raw
        self._machine.restore(machine)
        # pysyncobj compares these with its journal's tuples: they must be tuples, not lists.
        return tuple(last_entry), tuple(prev_entry), {TCPNode(a) for a in addresses}


class RaftGroup:
    """The event-loop side of one group: propose, and read its leadership and progress."""

    def __init__(
        self, spec: GroupSpec, sync: _PatchedSyncObj, driver: RaftDriver, max_pending: int
    ) -> None:
        self.spec = spec
        self._sync = sync
        self._driver = driver
        self._max_pending = max_pending
        self._pending = 0
        self._stall_since: float | None = None
        self._last_applied_seen = 0
        self._follower_seen: dict[str, tuple[int, float]] = {}
        self._waiting: set[asyncio.Future[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        sync.raftbroker_on_deposed = self._on_deposed

    def _on_deposed(self) -> None:  # on the driver thread
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self._loop.call_soon_threadsafe(self._fail_waiting)

    def _fail_waiting(self) -> None:
        """A deposed leader cannot tell whether its pending entries will commit: fail them
        retriably now (SEMANTICS.md, "Leadership") rather than when the client times out; a
        retry that meets a committed original is deduplicated."""
        for future in self._waiting:
            if not future.done():
                future.set_exception(
                    ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER, self.leader_address)
                )

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_leader(self) -> bool:
        return bool(self._sync._isLeader())

    @property
    def serving(self) -> bool:
        """Leader, and every entry of earlier terms is applied (the term-start barrier)."""
        noop = self._sync.noop_index
        return self.is_leader and noop is not None and self._sync.raftLastApplied >= noop

    @property
    def leader_address(self) -> str | None:
        leader = self._sync._getLeader()
        return None if leader is None else str(leader.address)

    async def propose(self, command: bytes, timeout_s: float, *, forward: bool = False) -> object:
        """Replicate and apply `command`; its apply result, or ProposalError (retriable).

        Without `forward` only a serving leader proposes (clients get NOT_LEADER and a hint);
        with it, a follower hands the command to the leader and resolves once it applied the
        entry itself, which the metadata group uses so any node can serve admin requests.
        """
        if not forward and not self.serving:
            raise ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER, self.leader_address)
        if self._pending >= self._max_pending:
            raise ProposalError(ErrorCode.REQUEST_TIMED_OUT, None)
        loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()

        def on_applied(result: object, error: int) -> None:  # runs on the driver thread
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, result, error)

        self._pending += 1
        if not forward:
            self._waiting.add(future)
        try:
            self._sync.apply_command(command, callback=on_applied)
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise ProposalError(ErrorCode.REQUEST_TIMED_OUT, self.leader_address) from None
        finally:
            self._pending -= 1
            self._waiting.discard(future)

    async def read(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the driver thread, between applies (a consistent view of the machine)."""
        return await asyncio.wrap_future(self._driver.call(fn))

    def status(self) -> GroupStatus:
        sync = self._sync
        commit, applied = sync.raftCommitIndex, sync.raftLastApplied
        healthy, detail = self._health(commit, applied)
        return GroupStatus(
            self.name,
            self.is_leader,
            self.serving,
            self.leader_address,
            sync.raftCurrentTerm,
            commit,
            applied,
            healthy,
            detail,
        )

    def _health(self, commit: int, applied: int) -> tuple[bool, str]:
        now = time.monotonic()
        if applied < commit and applied == self._last_applied_seen:
            self._stall_since = self._stall_since or now
        else:
            self._stall_since = None
        self._last_applied_seen = applied
        if self._sync.raftbroker_tick_errors:
            return False, f"{self._sync.raftbroker_tick_errors} failed ticks"
        if self._stall_since is not None and now - self._stall_since > STALL_REPORT_S:
            return False, f"applied index stuck at {applied} below commit {commit}"
        lagging = self._lagging_followers(commit, now)
        if lagging:
            return False, f"followers not replicating: {', '.join(lagging)}"
        return True, ""

    def _lagging_followers(self, commit: int, now: float) -> list[str]:
        """Followers whose replicated index has trailed the commit index, unmoving, too long.

        A follower that stopped applying (or fails every tick) keeps acknowledging nothing; only
        the leader can see that, so the leader reports its group unhealthy.
        """
        lagging = []
        for address, match in self._sync.follower_match_indexes().items():
            seen_match, since = self._follower_seen.get(address, (match, now))
            if match >= commit or match != seen_match:
                since = now
            self._follower_seen[address] = (match, since)
            if now - since > STALL_REPORT_S:
                lagging.append(f"{address} at {match}")
        return lagging


def _settle(future: asyncio.Future[object], result: object, error: int) -> None:
    if future.done():
        return  # timed out or cancelled already
    if error == FAIL_REASON.SUCCESS:
        future.set_result(result)
    elif error in _NOT_LEADER:
        future.set_exception(ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER))
    else:
        future.set_exception(ProposalError(ErrorCode.REQUEST_TIMED_OUT))
