"""The nemesis: faults on a seeded schedule against a local cluster's node processes.

Role: `schedule()` turns a seed into a list of faults (the same seed, the same list: a run can be
replayed); `Nemesis` carries them out on a `LocalCluster` and records each as a `fault` event
(phase start / end) in the history. Targets that depend on the live cluster (which node leads a
partition) are resolved when the fault starts, with the schedule's own random generator, so a
replay picks the same role (leader, follower) even if not the same node id.

Fault kinds: kill-leader (SIGKILL a partition leader, restart it after a while), pause-leader
(SIGSTOP, then SIGCONT after a pause shorter or longer than the election timeout), kill-follower,
pause-follower, kill-meta-leader, rolling-restart (SIGTERM and restart every node in turn),
and, when the run has its own network namespace (`links.py`), partition-leader (a partition's
leader cut off from both peers while clients still reach it) and split (a random node cut off:
a majority and a minority). Without a namespace those two are skipped, and reports say so.
With `power` (the nodes record their fsyncs): lose-unsynced-leader, lose-unsynced (any node)
and lose-unsynced-all (every node at once), each a SIGKILL after which the node's disk is
left as a power cut would leave it (power.py), then a restart. With `groups` (the workload
runs a consumer group): kill-coordinator, the SIGKILL of the node coordinating the group.
With `txns` (the workload runs transactions): kill-txn-coordinator, the SIGKILL of the node
coordinating the transactional writer's id.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cluster import native as p
from cluster.chaos import power
from cluster.chaos.links import LinkCutter
from cluster.client import Admin, Client, ClientError
from cluster.local import launcher

PROCESS_FAULTS = (
    "kill-leader",
    "pause-leader",
    "kill-leader",
    "pause-follower",
    "kill-meta-leader",
    "pause-leader",
    "kill-follower",
    "kill-leader",
)
NETWORK_FAULTS = ("partition-leader", "split")
# Power cuts (power.py): a node SIGKILLed and left with only what it had fsynced, then started
# again: a partition's leader, any one node, or every node at once. Only in runs whose nodes
# record their fsyncs (`power=True`).
POWER_FAULTS = ("lose-unsynced-leader", "lose-unsynced-all", "lose-unsynced")
GROUP_FAULTS = ("kill-coordinator",)
TXN_FAULTS = ("kill-txn-coordinator",)
TORN_TAIL_BYTES_MAX = 4_096  # a power cut may leave this much of a file's unsynced tail
TARGET_WAIT_S = 5.0  # a fault whose target (a leader) does not exist by then is skipped
DOWN_S = (1.0, 4.0)  # how long a killed node stays down
SHORT_PAUSE_S = (0.2, 0.4)  # under the election timeout (500-1000 ms): no election
LONG_PAUSE_S = (1.5, 4.0)  # past it: the others elect, the paused one comes back deposed


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float
    kind: str
    partition: int  # which partition's leader or follower (ignored by node-wide kinds)
    hold_s: float  # how long the node stays down or paused


def schedule(
    seed: int,
    duration_s: float,
    partitions: int,
    interval_s: float,
    *,
    network: bool = False,
    power: bool = False,
    groups: bool = False,
    txns: bool = False,
) -> list[Fault]:
    """Faults every `interval_s` (with jitter), cycling through every fault kind available.

    A rolling restart comes once, at the middle of runs of two minutes or more.
    """
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = interval_s / 2
    kinds = list(PROCESS_FAULTS) + (list(NETWORK_FAULTS) if network else [])
    kinds += list(POWER_FAULTS) * 2 if power else []  # as often as the other process faults
    kinds += list(GROUP_FAULTS) * 2 if groups else []
    kinds += list(TXN_FAULTS) * 2 if txns else []
    rng.shuffle(kinds)
    i = 0
    while at < duration_s - interval_s / 2:
        kind = kinds[i % len(kinds)]
        i += 1
        if kind.startswith("pause") and i % 2:
            hold = rng.uniform(*SHORT_PAUSE_S)
        elif kind.startswith("pause") or kind in NETWORK_FAULTS:
            hold = rng.uniform(*LONG_PAUSE_S)
        else:
            hold = rng.uniform(*DOWN_S)
        faults.append(Fault(round(at, 3), kind, rng.randrange(partitions), round(hold, 3)))
        at += interval_s * rng.uniform(0.7, 1.3)
    if duration_s >= 120:
        faults.append(Fault(duration_s / 2, "rolling-restart", 0, 0.0))
        faults.sort(key=lambda f: f.at_s)
    return faults


Record = Callable[[dict[str, object]], None]


class Nemesis:
    """Carries out faults on a local cluster; every node it stopped is running again after."""

    def __init__(
        self,
        cluster: launcher.LocalCluster,
        topic: str,
        record: Record,
        cutter: LinkCutter | None = None,
        *,
        group: str | None = None,
        txn_coordinator: Callable[[], Awaitable[int | None]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.group = group  # the consumer group whose coordinator kill-coordinator kills
        self.txn_coordinator = txn_coordinator  # kill-txn-coordinator's target, when asked
        self._record = record
        self._cutter = cutter
        self._client = Client(cluster.bootstrap, request_timeout_s=2.0)
        self._paused: set[int] = set()
        self.faults_done: Counter[str] = Counter()

    async def close(self) -> None:
        await self._client.close()

    async def run(self, faults: list[Fault], started: float, seed: int) -> None:
        rng = random.Random(seed ^ 0x5EED)
        loop = asyncio.get_running_loop()
        for fault in faults:
            await asyncio.sleep(max(0.0, started + fault.at_s - loop.time()))
            await self.inject(fault, rng)

    async def inject(self, fault: Fault, rng: random.Random) -> None:
        if fault.kind == "rolling-restart":
            await self._rolling_restart()
            return
        if fault.kind == "lose-unsynced-all":
            await self._cut_power_everywhere(fault, rng)
            return
        node = await self._target(fault, rng)
        deadline = asyncio.get_running_loop().time() + TARGET_WAIT_S
        while node is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)  # mid-election: wait for a leader to aim at
            node = await self._target(fault, rng)
        if node is None:
            self._event(fault, None, "skipped", "no target found")
            return
        self._event(fault, node, "start")
        if fault.kind.startswith("pause"):
            await self._pause(node, fault.hold_s)
        elif fault.kind in NETWORK_FAULTS:
            await self._isolate(node, fault.hold_s)
        elif fault.kind in POWER_FAULTS:
            await self._kill(node, fault.hold_s, lambda: self._cut_power(fault, node, rng))
        else:
            await self._kill(node, fault.hold_s)
        self._event(fault, node, "end")
        self.faults_done[fault.kind] += 1

    async def heal(self) -> None:
        """Mend every cut link, SIGCONT every paused node and start every dead one."""
        if self._cutter is not None:
            self._cutter.heal()
        for node_id in list(self._paused):
            self._signal(node_id, signal.SIGCONT)
        self._paused.clear()
        for node in self.cluster.nodes:
            if not launcher.alive(node.pid):
                self.cluster = launcher.restart_node(self.cluster, node.node_id)

    # -- targets ---------------------------------------------------------------------------------

    async def _target(self, fault: Fault, rng: random.Random) -> int | None:
        if fault.kind == "kill-coordinator":
            return await self._coordinator_of_group()
        if fault.kind == "kill-txn-coordinator":
            return None if self.txn_coordinator is None else await self.txn_coordinator()
        group = (
            "__metadata" if fault.kind == "kill-meta-leader" else f"{self.topic}-{fault.partition}"
        )
        leader = await self._leader_of(group)
        ids = [n.node_id for n in self.cluster.nodes]
        if fault.kind in ("split", "lose-unsynced"):
            return rng.choice(ids)
        if fault.kind.endswith("follower"):
            followers = [i for i in ids if i != leader]
            return rng.choice(followers) if leader is not None else None
        return leader

    async def _coordinator_of_group(self) -> int | None:
        if self.group is None:
            return None
        try:
            found = await self._client.call_any(p.FindCoordinator(self.group), timeout_s=2.0)
        except (ClientError, TimeoutError):
            return None
        assert isinstance(found, p.FindCoordinatorResponse)
        return found.node_id if found.node_id > 0 else None

    async def _leader_of(self, group: str) -> int | None:
        for node in self.cluster.nodes:
            if node.node_id in self._paused or not launcher.alive(node.pid):
                continue
            try:
                status = await Admin(self._client).cluster_status(node.client_address)
            except (ClientError, TimeoutError):
                continue
            for g in status.groups:
                if g.group == group and g.leader_id > 0:
                    return g.leader_id
        return None

    # -- actions ---------------------------------------------------------------------------------

    async def _kill(
        self, node_id: int, down_s: float, while_down: Callable[[], None] = lambda: None
    ) -> None:
        pid = self._pid(node_id)
        await asyncio.to_thread(launcher.kill, pid, signal.SIGKILL, 10.0)
        while_down()
        await asyncio.sleep(down_s)
        self.cluster = launcher.restart_node(self.cluster, node_id)

    def _cut_power(self, fault: Fault, node_id: int, rng: random.Random) -> None:
        """The killed node's disk as a power cut leaves it (power.py), in the history."""
        data_dir = launcher.node_dir(self.cluster.data_dir, node_id)
        cut = power.cut_power(data_dir, power.ledger_of(data_dir), rng, TORN_TAIL_BYTES_MAX)
        note = (
            f"{cut.bytes_lost} bytes not synced lost: {cut.truncated} files cut, "
            f"{cut.removed} removed, {cut.restored} renames undone"
        )
        self._event(fault, node_id, "power-cut", note)

    async def _cut_power_everywhere(self, fault: Fault, rng: random.Random) -> None:
        """Every node loses power at once: all SIGKILLed, all cut, all started again."""
        self._event(fault, None, "start")
        ids = [n.node_id for n in self.cluster.nodes]
        for node_id in ids:
            await asyncio.to_thread(launcher.kill, self._pid(node_id), signal.SIGKILL, 10.0)
        for node_id in ids:
            self._cut_power(fault, node_id, rng)
        await asyncio.sleep(fault.hold_s)
        for node_id in ids:
            self.cluster = launcher.restart_node(self.cluster, node_id)
        self._event(fault, None, "end")
        self.faults_done[fault.kind] += 1

    async def _pause(self, node_id: int, pause_s: float) -> None:
        self._signal(node_id, signal.SIGSTOP)
        self._paused.add(node_id)
        try:
            await asyncio.sleep(pause_s)
        finally:
            self._signal(node_id, signal.SIGCONT)
            self._paused.discard(node_id)

    async def _isolate(self, node_id: int, hold_s: float) -> None:
        assert self._cutter is not None, "a network fault without a namespace"
        host = self._host(node_id)
        self._cutter.isolate(host, [n.host for n in self.cluster.nodes if n.host != host])
        try:
            await asyncio.sleep(hold_s)
        finally:
            self._cutter.heal()

    def _host(self, node_id: int) -> str:
        return next(n.host for n in self.cluster.nodes if n.node_id == node_id)

    async def _rolling_restart(self) -> None:
        fault = Fault(0.0, "rolling-restart", 0, 0.0)
        self._event(fault, None, "start")
        for node in self.cluster.nodes:
            await asyncio.to_thread(launcher.kill, self._pid(node.node_id), signal.SIGTERM, 15.0)
            if launcher.alive(self._pid(node.node_id)):
                await asyncio.to_thread(launcher.kill, self._pid(node.node_id), signal.SIGKILL, 5.0)
            self.cluster = launcher.restart_node(self.cluster, node.node_id)
            await launcher.wait_ready(self.cluster, 60.0)
        self._event(fault, None, "end")
        self.faults_done["rolling-restart"] += 1

    def _pid(self, node_id: int) -> int:
        return next(n.pid for n in self.cluster.nodes if n.node_id == node_id)

    def _signal(self, node_id: int, sig: int) -> None:
        launcher.kill(self._pid(node_id), sig)

    def _event(self, fault: Fault, node: int | None, phase: str, note: str = "") -> None:
        node_wide = (
            "kill-meta-leader",
            "rolling-restart",
            "lose-unsynced",
            "lose-unsynced-all",
            "kill-coordinator",
            "kill-txn-coordinator",
        )
        partition = None if fault.kind in node_wide else fault.partition
        event: dict[str, object] = {
            "type": "info",
            "process": "nemesis",
            "f": "fault",
            "kind": fault.kind,
            "node": None if node is None else f"node{node}",
            "partition": partition,
            "phase": phase,
            "hold_s": fault.hold_s,
        }
        if note:
            event["note"] = note
        self._record(event)
