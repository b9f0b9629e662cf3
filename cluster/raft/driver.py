"""The Raft driver: every group of a process, ticked on the event loop that serves its clients.

Role: one `RaftDriver` per process owns the mesh (bound on `start`) and every group's
`PatchedSyncObj` (pysyncobj with `autoTick=False`). It ticks a group when something concerns
it, in the same turn of the loop, and every group on a timer; it watches the mesh's sockets on
the loop (`_LoopPoller`), so idle cost grows per group by a few dict lookups, not by a thread,
and a write crosses no thread on its way from the client to the log and back.

Rules: runs on one event loop only; machines are applied, snapshotted and read only there, so
a read between two awaits sees a machine between two applies. A failing group must not stop
the others: each tick is guarded, and a failure counts against that group's health. The
delays below were tuned on the hot path (bench/HISTORY.md); change them only with a benchmark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from cluster.config import Timing
from cluster.raft.adapter import Heard, PatchedSyncObj, SnapshotFile, log_failure, sync_conf
from cluster.raft.group import RaftGroup
from cluster.raft.mesh import ERROR, READ, WRITE, Mesh, MeshSettings
from cluster.raft.spec import GroupSpec, ReplicatedMachine

# A leader tells followers of new commits this long after applying them (all of that moment's),
# unless appends went out meanwhile: under a steady stream of writes every commit travels with
# the next append, and the news waits until the stream stops.
COMMIT_NEWS_DELAY_S = 0.005
# A follower applies what a leader's append newly committed this long after answering it, not
# in the same turn: right after its answer the leader needs the CPU to commit and reply. And in
# batches: each apply is a tick, and both followers, told of commits together, tick together.
# Every 10 ms rather than every 2 ms took sequential produce p50 from 0.37-0.39 ms to
# 0.33-0.34 ms and a follower's CPU per write by a fifth (2 cores); it costs a follower's
# machine and store that much lag behind the commit, which a new leader applies before it
# serves (the term-start barrier).
FOLLOWER_APPLY_DELAY_S = 0.010


class _LoopPoller:
    """The mesh's poller on the event loop: readiness callbacks from `add_reader`/`add_writer`.

    An error on a socket shows as readable, and the read then fails.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._masks: dict[int, int] = {}

    def subscribe(self, descr: int, callback: Callable[[int, int], None], mask: int) -> None:
        old = self._masks.get(descr, 0)
        self._masks[descr] = mask
        wants_read, wanted_read = bool(mask & (READ | ERROR)), bool(old & (READ | ERROR))
        if wants_read and not wanted_read:
            self._loop.add_reader(descr, self._fire, callback, descr, READ)
        elif wanted_read and not wants_read:
            self._loop.remove_reader(descr)
        if mask & WRITE and not old & WRITE:
            self._loop.add_writer(descr, self._fire, callback, descr, WRITE)
        elif old & WRITE and not mask & WRITE:
            self._loop.remove_writer(descr)

    def unsubscribe(self, descr: int) -> None:
        if self._masks.pop(descr, None) is not None:
            self._loop.remove_reader(descr)
            self._loop.remove_writer(descr)

    def _fire(self, callback: Callable[[int, int], None], descr: int, event: int) -> None:
        if descr in self._masks:  # not unsubscribed by an earlier callback of this turn
            callback(descr, event)


class RaftDriver:
    """Ticks every Raft group of a process, on the event loop that serves its clients.

    A group is ticked when something concerns it (a message, a proposal, a peer coming or
    going), in the same turn of the loop, and every group on a timer; a group left with work
    after a tick (an entry to commit or apply) is ticked once more, because pysyncobj commits
    and applies at the start of a tick what the end of the previous one appended. One thread
    for clients and Raft: no hand-offs between threads on the path of a write (they were a
    third of its latency).
    """

    def __init__(
        self,
        timing: Timing,
        mesh: MeshSettings,
        compaction_entries: int = 2_000,
        *,
        compaction_bytes: int = 32 * 1024 * 1024,
        durable: bool = False,
    ) -> None:
        self.timing = timing
        self.compaction_entries = compaction_entries
        # A group compacts its log once its journal holds more than this (`JournalBridge`).
        self.compaction_bytes = compaction_bytes
        # Journals fsynced before an entry is acknowledged or counted (a node's `fsync`).
        self.durable = durable
        # A message carries entries up to half a mesh frame, so one more entry still fits.
        self.entries_bytes_max = mesh.frame_bytes_max // 2
        self._mesh_settings = mesh
        self._mesh: Mesh | None = None
        self._groups: dict[str, PatchedSyncObj] = {}
        self._due: dict[PatchedSyncObj, None] = {}  # ordered, so ticks follow arrival order
        self._cycle_soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._news: dict[PatchedSyncObj, None] = {}
        self._news_timer: asyncio.TimerHandle | None = None
        self._late: set[PatchedSyncObj] = set()
        self._late_timer: asyncio.TimerHandle | None = None
        self._unsynced: dict[PatchedSyncObj, None] = {}  # leaders' journals to sync this turn
        self._sync_soon_handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tick_s = min(timing.heartbeat_ms / 4000, 0.025)

    @property
    def mesh(self) -> Mesh:
        assert self._mesh is not None, "driver not started"
        return self._mesh

    def start(self) -> None:
        """On the event loop: bind the Raft port (OSError if it is taken) and start ticking."""
        loop = self._loop = asyncio.get_running_loop()
        self._mesh = Mesh(self._mesh_settings, _LoopPoller(loop))
        self._mesh.bind()
        self._timer = loop.call_later(self.tick_s, self._on_timer)

    def stop(self) -> None:
        handles = (
            self._timer,
            self._cycle_soon,
            self._news_timer,
            self._late_timer,
            self._sync_soon_handle,
        )
        for handle in handles:
            if handle is not None:
                handle.cancel()
        if self._news and self._mesh is not None:
            # Followers learn the last commits before the links close.
            self._tell_commits(final=True)
        for group in list(self._groups.values()):
            group.raftbroker_live = False
            group.destroy()
        self._groups.clear()
        self._due.clear()
        if self._mesh is not None:
            self._mesh.close()

    def _wake(self, group: PatchedSyncObj) -> None:
        self._due[group] = None
        self._schedule()

    def _heard(self, group: PatchedSyncObj, heard: Heard) -> None:
        """`group` took in a peer's message. A follower answered an append inside it, and
        applies what it newly committed a moment later (at once when a proposal it forwarded
        to the leader waits for that). An acknowledgement that lets a leader
        commit is acted on at once: its proposer waits, and in this same turn the other
        followers' acknowledgements would otherwise be read and handled first. One from a
        follower that holds the whole log, and commits nothing, needs no tick (the timer's
        ticks keep the heartbeats and the leader's quorum check). Anything else is ticked in
        this turn's cycle."""
        if heard is Heard.APPEND:
            if group.raftCommitIndex > group.raftLastApplied:
                if group.awaits_forwarded:
                    self._wake(group)  # its own proposal's caller waits: no batching delay
                else:
                    self._apply_later(group)
            return
        if not (group.raftbroker_live and group.can_commit()):
            if heard is not Heard.ACK_CAUGHT_UP:
                self._wake(group)
            return
        self._guarded_step(group, group.commit_now)
        if group.has_work:
            self._wake(group)

    def _sync_soon(self, group: PatchedSyncObj) -> None:
        """Sync `group`'s journal at the end of this turn of the loop, with every other one
        that appended in it: one fsync per journal however many proposals it took."""
        self._unsynced[group] = None
        if self._sync_soon_handle is None and self._loop is not None:
            self._sync_soon_handle = self._loop.call_soon(self._sync_unsynced)

    def _sync_unsynced(self) -> None:
        self._sync_soon_handle = None
        unsynced, self._unsynced = self._unsynced, {}
        for group in unsynced:
            if group.raftbroker_live:
                self._guarded_step(group, group.sync_journal)

    def _schedule(self) -> None:
        if self._cycle_soon is None and self._loop is not None:
            self._cycle_soon = self._loop.call_soon(self._cycle)

    def _apply_later(self, group: PatchedSyncObj) -> None:
        self._late.add(group)
        if self._late_timer is None and self._loop is not None:
            self._late_timer = self._loop.call_later(FOLLOWER_APPLY_DELAY_S, self._apply_late)

    def _apply_late(self) -> None:
        self._late_timer = None
        late, self._late = self._late, set()
        for group in late:
            self._due[group] = None
        self._cycle()

    def _commit_news(self, group: PatchedSyncObj) -> None:
        self._news[group] = None
        if self._news_timer is None and self._loop is not None:
            self._news_timer = self._loop.call_later(COMMIT_NEWS_DELAY_S, self._tell_commits)

    def _tell_commits(self, *, final: bool = False) -> None:
        self._news_timer = None
        news, self._news = self._news, {}
        with self.mesh.held():  # every group's news to a peer in one write
            for group in news:
                if not group.raftbroker_live:
                    continue
                due = group.commit_news(COMMIT_NEWS_DELAY_S)
                if due or (due is None and final):
                    self._guarded_step(group, group.send_commit_index)
                elif due is None:
                    self._commit_news(group)  # appends are flowing: told when they stop

    def _on_timer(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(self.tick_s, self._on_timer)
        self._due.update(dict.fromkeys(self._groups.values()))
        self.mesh.receive_waiting()  # heard before the election deadlines are checked
        self.mesh.tick(time.monotonic())  # dials, pings and timeouts: the timer's business
        self._cycle()

    def _cycle(self) -> None:
        self._cycle_soon = None
        due, self._due = self._due, {}
        with self.mesh.held():  # every group's heartbeats (and the pings) in one write per peer
            for group in due:
                # A group whose tick failed keeps its work for the timer's next tick: ticked
                # again at once, one that fails on every tick would spin the loop.
                if group.raftbroker_live and self._tick(group) and group.has_work:
                    self._due[group] = None
        if self._due:
            self._schedule()

    def _tick(self, group: PatchedSyncObj) -> bool:
        """Tick `group`; False when the tick failed."""
        if self.durable and group.is_leader():  # its tick may commit, counting itself
            self._guarded_step(group, group.sync_journal)
        ticked = self._guarded_step(group, group.doTick)
        leading = bool(group.is_leader())
        if group.raftbroker_leading and not leading and group.raftbroker_on_deposed:
            group.raftbroker_on_deposed()
        group.raftbroker_leading = leading
        return ticked

    @staticmethod
    def _guarded_step(group: PatchedSyncObj, step: Callable[[], None]) -> bool:
        try:
            step()
        except Exception:  # noqa: BLE001 - logged by log_failure, counted as a failed tick
            # pysyncobj's own tick thread logs and carries on; we do the same but count it,
            # so a replica that fails on every tick shows up as unhealthy, not silent.
            group.raftbroker_tick_errors += 1
            log_failure(group, f"group {group.raftbroker_group}: a tick failed")
            return False
        return True

    def _add(self, spec: GroupSpec, machine: ReplicatedMachine) -> PatchedSyncObj:
        assert spec.name not in self._groups, f"group {spec.name} exists"
        assert spec.self_address == self.mesh.settings.self_address, "a group of another node"
        snapshots = SnapshotFile(machine, durable=self.durable)
        conf = sync_conf(
            spec,
            timing=self.timing,
            compaction_entries=self.compaction_entries,
            entries_bytes_max=self.entries_bytes_max,
            serializer=snapshots.serialize,
            deserializer=snapshots.deserialize,
        )
        try:
            group = PatchedSyncObj(
                machine,
                spec,
                conf,
                self.mesh,
                wake=self._wake,
                heard=self._heard,
                commit_news=self._commit_news,
                durable=self.durable,
                sync_soon=self._sync_soon,
                log_bytes_max=self.compaction_bytes,
            )
        except BaseException:
            self.mesh.unregister(spec.route)  # pysyncobj may have readied its transport
            raise
        self._groups[spec.name] = group
        self._wake(group)
        return group

    async def add_group(
        self, spec: GroupSpec, machine: ReplicatedMachine, max_pending: int
    ) -> RaftGroup:
        assert self._loop is not None, "driver not started"
        return RaftGroup(spec, self._add(spec, machine), max_pending, self._loop)

    async def remove_group(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is not None:
            self._due.pop(group, None)
            group.raftbroker_live = False
            group.destroy()
