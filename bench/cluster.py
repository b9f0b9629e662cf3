"""Cluster benchmark: a real 3-node cluster (replication 3) on loopback, measured end to end.

Role: the measured answer to the issue's cluster goals, with the client library driven as a
user drives it: at least 100,000 acknowledged records/s with batching, a p50 produce latency
under 5 ms at 1,000 records/s, and produce resuming within 2 s (median of 5) after the
partition leader is SIGKILLed, losing and duplicating nothing. Run it as
`python -m bench.cluster [--quick] [--out FILE] [--scenarios a,b]`; it prints one JSON object on
stdout (progress goes to stderr) and exits 1 if a scenario failed; a goal missed is a result.

Every scenario starts a fresh cluster of `raftbroker node` processes on 127.0.0.2-4
(`cluster.local.launcher`) in a temporary directory, with the default node configuration but
`fsync = false` (an ack means "in the page cache of a majority", as the peer's in NATS 2.9;
the `fsync` scenario measures the default, `fsync = true`), and stops it by PID in a `finally`
(also on SIGTERM). The client is this process, on uvloop when installed (as `raftbroker` runs).
The nodes have no cluster secret, so their Raft links run in clear (allowed on loopback only):
like for like with `bench.jetstream`, whose routes are plain TCP. The latency scenario also
measures sequential sends with the links encrypted (AES-GCM, as every cluster off loopback runs).

Scenarios:
- throughput: one idempotent Producer with its own batching (16 KiB/2 ms and 64 KiB/5 ms),
  100-byte values (a 12-digit index, then random letters as kafka-producer-perf-test uses:
  about 60% after zlib), acks=all, every send future awaited. The send loop runs until the
  producer's buffer is full (`send` then waits for space), so after a ramp it sends exactly
  as fast as acks return; acks and CPU (/proc/<pid>/stat of each node and of the client, and
  /proc/stat for the rest of the machine) are counted over a timed window only. 1, 4 and 16
  partitions, each case on its own fresh cluster.
- consume: each throughput topic read back from offset 0 by one Consumer, with CPU.
- latency: one partition, linger 0 unless stated. Sequential: each send issued as soon as the
  previous one is acknowledged (as `bench.jetstream` publishes), so the rate is 1 / mean
  latency; it is reported. Open loop: sends issued every millisecond regardless of acks, the
  latency under a true 1,000 records/s. Then sequential again on a cluster with a secret
  (links encrypted), reported beside the compared figure.
- failover: a record every 2 ms on one partition, awaited through the Producer's own retries;
  SIGKILL of the partition leader, then the time to the first ack of a send issued after the
  kill, and to the first survivor that reports leading the group; the node is restarted and
  waited for until it has applied the group's commit index; 5 times. Then the topic is read
  back: acknowledged records absent and values present twice must both be 0.
- idle: CPU % of each node over an idle period with no partitions, then with 16 partitions.

Baselines in the same run: asyncio TCP round trips on loopback (the floor of any request's
latency, to a peer process and within this loop) and `bench.apply`'s quick mode (one replica's
apply rate). Load averages at start and end, and other processes' CPU during each window,
say how much the rest of the machine disturbed the numbers.

This module is the command, the side (`Raftbroker`, the `Side` of `bench.side`) and its report;
the scenarios are in `bench.cluster_throughput` (throughput, consume, fsync),
`bench.cluster_latency`, `bench.cluster_failover` and `bench.cluster_baselines` (baseline,
idle), the goals in `bench.cluster_goals`, the cluster itself in `bench.nodes`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.cluster_baselines import baseline_scenario, idle_scenario
from bench.cluster_failover import failover_scenario
from bench.cluster_goals import goals
from bench.cluster_latency import latency_scenario, sequential_scenario
from bench.cluster_throughput import fsync_scenario, throughput_scenario
from bench.harness import emit, event_loop_name, load_average, run_header, run_loop
from bench.nodes import NODES, REPLICATION, Settings, progress
from bench.side import Scenario, Sections, arguments, known, run_scenarios, with_notes
from cluster.local import launcher


@dataclass(frozen=True, slots=True)
class Raftbroker:
    """raftbroker's side of the comparison (a `Side`), and the two scenarios only it runs."""

    settings: Settings

    async def pipelined(self) -> Sections:
        return await throughput_scenario(self.settings)

    async def latency(self) -> Sections:
        return await latency_scenario(self.settings)

    async def sequential(self) -> Sections:
        return await sequential_scenario(self.settings)

    async def failover(self) -> Sections:
        return await failover_scenario(self.settings)

    async def fsync(self) -> Sections:
        return await fsync_scenario(self.settings)

    async def baseline(self) -> Sections:
        return await baseline_scenario(self.settings)

    async def idle(self) -> Sections:
        return await idle_scenario(self.settings)


# Each `--scenarios` name, in the order a run takes them, and the method it runs.
SCENARIOS: dict[str, Scenario[Raftbroker]] = {
    "baseline": Raftbroker.baseline,
    "throughput": Raftbroker.pipelined,
    "latency": Raftbroker.latency,
    "sequential": Raftbroker.sequential,
    "failover": Raftbroker.failover,
    "idle": Raftbroker.idle,
    "fsync": Raftbroker.fsync,
}
# `sequential` repeats a case of `latency`: `python -m bench` runs it in its rounds, not here.
DEFAULT_SCENARIOS = tuple(name for name in SCENARIOS if name != "sequential")


def config(settings: Settings) -> dict[str, Any]:
    return {
        "quick": settings.quick,
        "nodes": NODES,
        "replication": REPLICATION,
        "hosts": [launcher.host_of(i) for i in range(NODES)],
        "node_config": "defaults but fsync = false (acks mean a majority's page cache, as "
        "NATS 2.9's; the default fsync = true is measured in the fsync scenario)",
        "raft_links": "in clear: no cluster secret (loopback only), as NATS routes without "
        "TLS; the latency scenario also runs with them encrypted",
        "client_event_loop": event_loop_name(),
        "client_process": "this one",
    }


async def run(settings: Settings, names: Iterable[str]) -> dict[str, Any]:
    started, load_start = datetime.now(UTC), load_average()
    side = Raftbroker(settings)
    sections, errors = await run_scenarios(side, SCENARIOS, names, progress, with_notes)
    return {
        "benchmark": "raftbroker 3-node cluster on loopback, end to end through cluster.client",
        **run_header(started, load_start),
        "config": config(settings),
        **sections,
        "goals": goals(sections),
        "errors": errors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        "python -m bench.cluster",
        __doc__,
        "a few seconds per scenario, for CI smoke tests",
        f"comma-separated subset of {','.join(SCENARIOS)} (default: all but sequential)",
        DEFAULT_SCENARIOS,
    )
    args = parser.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    known(parser, names, SCENARIOS)
    return emit(run_loop(run(Settings.of(args.quick), names)), args.out)


if __name__ == "__main__":
    sys.exit(main())
