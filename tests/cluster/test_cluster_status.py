"""`raftbroker cluster status` tells the truth about replication, at once, as Kafka's
`--under-replicated-partitions` does.

Two topics on a real 3-node cluster: one with a replica on every node, one with two replicas
per partition (so some partitions have none on a given node). With a node SIGKILLed, the very
next status must show every partition with a replica on it as not ok (under-replicated, or
without a leader while one is elected), name the node unreachable, and exit 1, while the
partitions without a replica there stay ok; once leaders are elected, the replicated topic's
partitions are led elsewhere with exactly the surviving replicas in sync. Restarted, the
node is back in sync and the status exits 0 again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.client import Admin, Client, Producer
from cluster.local import launcher
from tests.cluster.conftest import running_cluster
from tests.cluster.procs import REPO
from tests.polling import poll_until

STATUS_TIMEOUT_S = 30.0
FAILOVER_TIMEOUT_S = 15.0
RECORDS = 30


def status(cluster: launcher.LocalCluster, *flags: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "cluster", "status", "--json", "--check", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=STATUS_TIMEOUT_S,
        check=False,
        env={**os.environ, "RAFTBROKER_BOOTSTRAP": ",".join(cluster.bootstrap)},
    )
    assert result.returncode in (0, 1), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return result.returncode, report


Rows = dict[tuple[str, int], dict[str, Any]]


def by_partition(report: dict[str, Any]) -> Rows:
    return {(r["topic"], r["partition"]): r for r in report["partitions"]}


async def create_topics(cluster: launcher.LocalCluster) -> None:
    client = Client(cluster.bootstrap, request_timeout_s=5.0)
    try:
        await Admin(client).create_topic("everywhere", 3, 3)
        await Admin(client).create_topic("pairs", 3, 2)
        async with Producer(client) as producer:
            acks = [await producer.send("everywhere", b"%d" % i) for i in range(RECORDS)]
            await asyncio.gather(*acks)
    finally:
        await client.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[launcher.LocalCluster]:
    with running_cluster(tmp_path) as started:
        asyncio.run(create_topics(started))
        yield started


@pytest.mark.alone  # timed against the in-sync lag
def test_a_killed_node_shows_under_replicated_at_once_and_exits_1(
    cluster: launcher.LocalCluster,
) -> None:
    def healthy_status() -> dict[str, Any] | None:
        code, report = status(cluster)
        return report if code == 0 else None

    healthy = poll_until(healthy_status, 10, "a healthy status")
    assert healthy["healthy"] and all(r["state"] == "ok" for r in healthy["partitions"])
    assert all(sorted(r["in_sync"]) == sorted(r["replicas"]) for r in healthy["partitions"])
    assert sum(by_partition(healthy)[("everywhere", p)]["high_watermark"] for p in range(3)) == (
        RECORDS
    )
    victim = cluster.nodes[2]
    on_victim = {k for k, r in by_partition(healthy).items() if victim.node_id in r["replicas"]}
    assert {k for k in on_victim if k[0] == "pairs"} != {("pairs", p) for p in range(3)}

    launcher.kill(victim.pid, signal.SIGKILL, wait_s=10)
    code, report = status(cluster)  # the very next one, no waiting

    assert code == 1
    assert not report["healthy"]
    assert [n["reachable"] for n in report["nodes"]] == [True, True, False]
    for key, row in by_partition(report).items():
        if key in on_victim:
            assert row["under_replicated"], row
            assert row["state"] in ("under-replicated", "no leader"), row
            assert victim.node_id not in row["in_sync"], row
        else:
            assert row["state"] == "ok", row
    only = status(cluster, "--under-replicated-partitions")[1]
    assert set(by_partition(only)) == on_victim

    def failed_over() -> Rows | None:
        rows = by_partition(status(cluster)[1])
        everywhere = [rows[("everywhere", p)] for p in range(3)]
        settled = all(r["state"] == "under-replicated" for r in everywhere)
        return rows if settled else None

    rows = poll_until(failed_over, FAILOVER_TIMEOUT_S, "new leaders for every partition")
    for p in range(3):
        row = rows[("everywhere", p)]
        assert row["leader"] != victim.node_id
        assert sorted(row["in_sync"]) == sorted(set(row["replicas"]) - {victim.node_id})
        assert row["detail"].startswith(f"node {victim.node_id} not in sync")
        assert row["log_start_offset"] == 0
    assert sum(rows[("everywhere", p)]["high_watermark"] for p in range(3)) == RECORDS

    launcher.restart_node(cluster, victim.node_id)
    poll_until(lambda: status(cluster)[0] == 0, FAILOVER_TIMEOUT_S, "node 3 back in sync")
