"""A raftbroker cluster for one scenario: started fresh, ready, stopped by PID; the run's settings.

Role: what every raftbroker scenario stands on (`bench.cluster`'s, and `bench.kafka`'s and
`bench.groups`', which start their clusters here too): `fresh_cluster` starts 3 `raftbroker
node` processes on 127.0.0.2-4 (`cluster.local.launcher`) in a temporary directory, waits until
they serve, and stops them by PID in a `finally` (a failure carries the nodes' log tails);
`create_topic` returns once every node sees a leader for every partition. The nodes run without
a cluster secret (Raft links in clear, as JetStream's routes) and with `fsync = false` (as NATS
2.9 acknowledges from its page cache) unless a scenario asks otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench import apply as apply_bench
from bench.harness import log_tails as harness_log_tails
from bench.harness import poll_until, reporter
from cluster.client import Admin, Client, ProducerConfig
from cluster.local import launcher

NODES = 3
REPLICATION = 3
METADATA_GROUP = "__metadata"
LOG_TAIL_LINES = 8

progress = reporter("bench.cluster")


@dataclass(frozen=True, slots=True)
class Settings:
    """Lengths and sizes of a run: the full one, or `--quick` for CI smoke tests."""

    quick: bool
    throughput_ramp_s: float
    throughput_s: float
    partitions: tuple[int, ...]
    batches: tuple[tuple[int, float], ...]  # (batch_size_bytes, linger_ms)
    latency_s: float
    latency_cases: tuple[tuple[str, float], ...]  # (mode, linger_ms)
    failover_kills: int
    idle_s: float
    tcp_round_trips: int
    apply_seconds: float

    @classmethod
    def of(cls, quick: bool) -> Settings:
        if quick:
            return cls(
                quick=True,
                throughput_ramp_s=0.5,
                throughput_s=2.0,
                partitions=(1,),  # the compared case: the smoke test needs its figures only
                batches=((16_384, 2.0),),
                latency_s=2.0,
                latency_cases=(("sequential", 0.0), ("open_loop", 0.0)),
                failover_kills=1,
                idle_s=2.0,
                tcp_round_trips=500,
                apply_seconds=apply_bench.QUICK_SECONDS,
            )
        return cls(
            quick=False,
            throughput_ramp_s=2.0,
            throughput_s=10.0,
            partitions=(1, 4, 16),
            batches=((16_384, 2.0), (65_536, 5.0)),
            latency_s=5.0,
            latency_cases=(
                ("sequential", 0.0),
                ("sequential", ProducerConfig().linger_ms),
                ("open_loop", 0.0),
            ),
            failover_kills=5,
            idle_s=10.0,
            tcp_round_trips=5_000,
            apply_seconds=0.05,
        )


@dataclass(slots=True)
class BenchCluster:
    """A running local cluster (its node PIDs change on restart) and a client of it."""

    local: launcher.LocalCluster
    client: Client

    def node(self, node_id: int) -> launcher.NodeProcess:
        return next(n for n in self.local.nodes if n.node_id == node_id)

    def node_pids(self) -> dict[str, int]:
        return {f"node{n.node_id}": n.pid for n in self.local.nodes}

    def process_pids(self) -> dict[str, int]:
        return {**self.node_pids(), "client": os.getpid()}


# The peer's configuration in every scenario but `fsync`: NATS 2.9 acknowledges from its page
# cache, so raftbroker's nodes do too (the default, `fsync = true`, is measured in `fsync`).
NO_FSYNC_TOML = "fsync = false\n"
FSYNC_TOML = "fsync = true\n"


@contextlib.asynccontextmanager
async def fresh_cluster(
    extra_toml: str = NO_FSYNC_TOML, *, encrypted: bool = False
) -> AsyncIterator[BenchCluster]:
    """A new 3-node cluster in a temporary directory, ready; stopped by PID and removed after.

    `extra_toml` is added to every node's configuration (`fsync = false` unless told
    otherwise, as the peer); with `encrypted` the nodes share a secret and their Raft links
    are encrypted.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="raftbroker-bench-"))
    try:
        local = launcher.up(data_dir, NODES, extra_toml, encrypted=encrypted)
        bench = BenchCluster(local, Client(local.bootstrap, request_timeout_s=5.0))
        try:
            await wait_ready(bench)
            yield bench
        except BaseException as exc:
            exc.add_note(log_tails(data_dir))
            raise
        finally:
            await bench.client.close()
            launcher.down(bench.local.current())  # as cluster.json has it: restarts' new PIDs
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def log_tails(data_dir: Path) -> str:
    return harness_log_tails(sorted(data_dir.glob("node*.log")), LOG_TAIL_LINES)


async def wait_ready(bench: BenchCluster) -> None:
    """Until every node knows a metadata leader and the cluster lists every broker."""

    async def ready() -> bool:
        admin = Admin(bench.client)
        for node in bench.local.nodes:
            status = await admin.cluster_status(node.client_address)
            meta = [g for g in status.groups if g.group == METADATA_GROUP]
            if not meta or meta[0].leader_id < 0:
                return False
        return len((await bench.client.refresh()).brokers) == NODES

    await poll_until(ready, "cluster ready")


async def wait_all_groups_led(bench: BenchCluster, topic: str, partitions: int) -> None:
    """Until every node sees a leader for every partition group of `topic`."""

    async def led() -> bool:
        for node in bench.local.nodes:
            status = await Admin(bench.client).cluster_status(node.client_address)
            leaders = [g.leader_id for g in status.groups if g.group.startswith(f"{topic}-")]
            if len(leaders) != partitions or min(leaders) < 0:
                return False
        return True

    await poll_until(led, f"{topic}: every group led on every node")


async def create_topic(bench: BenchCluster, topic: str, partitions: int) -> None:
    await Admin(bench.client).create_topic(topic, partitions, REPLICATION)
    await wait_all_groups_led(bench, topic, partitions)


async def leaders_by_node(bench: BenchCluster, topic: str) -> dict[str, int]:
    meta = await bench.client.refresh([topic])
    counts = Counter(pm.leader_id for pm in meta.topics[0].partitions)
    return {f"node{node_id}": count for node_id, count in sorted(counts.items())}
