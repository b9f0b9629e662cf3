"""The pysyncobj hardening in cluster/raft.py, proven on a real 3-process Raft group.

Pipelined load with frequent log compaction is what made stock pysyncobj 0.3.17 rewind a
follower's next index, truncate entries the follower had applied, and sometimes leave a
follower stuck forever. Every replica must apply every command, in the same order (equal
digests), without one truncation warning.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cluster.local import launcher
from tests.cluster.procs import running, spawn, wait_until

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def run_group(
    tmp_path: Path, *, commands: int, size: int, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    # A port free on all three addresses, below the kernel's ephemeral range.
    port = launcher.choose_ports(len(HOSTS), os.getpid())[2]
    addresses = ",".join(f"{h}:{port}" for h in HOSTS)
    tmp_path.mkdir(parents=True, exist_ok=True)
    reports = [tmp_path / f"report{i}.json" for i in range(3)]
    procs = [
        spawn(
            [
                "-m",
                "tests.cluster.raft_harness",
                "--index",
                str(i),
                "--addresses",
                addresses,
                "--dir",
                str(tmp_path / f"node{i}"),
                "--out",
                str(reports[i]),
                "--commands",
                str(commands),
                "--size",
                str(size),
                "--window",
                "2000",
                "--compaction",
                "300",
                "--deadline-s",
                "40",
                "--small-reads",
                *extra,
            ],
            tmp_path / f"node{i}.log",
        )
        for i in range(3)
    ]
    with running(procs), contextlib.suppress(TimeoutError):
        wait_until(lambda: all(r.exists() for r in reports), 60, "all three replica reports")
    # A replica stuck for good never reports: that is a finding, not an error of the test.
    return [
        json.loads(r.read_text()) if r.exists() else {"index": i, "stuck": True}
        for i, r in enumerate(reports)
    ]


def anomalies(reports: list[dict[str, Any]], commands: int) -> list[str]:
    found = []
    for r in reports:
        if r.get("stuck"):
            found.append(f"replica {r['index']} never reported: stuck")
            continue
        if r["count"] != commands:
            found.append(f"replica {r['index']} applied {r['count']} of {commands}")
        if r["truncations"]:
            found.append(f"replica {r['index']} truncated applied entries {r['truncations']}x")
        if r["failures"]:
            found.append(f"replica {r['index']}: {r['failures']} proposals failed")
        if not r["healthy"]:
            found.append(f"replica {r['index']} unhealthy: {r['detail']}")
    if len({r.get("digest") for r in reports}) != 1:
        found.append("replicas applied different logs")
    return found


def test_pipelined_load_with_compaction_keeps_every_replica_applying(tmp_path: Path) -> None:
    commands = 20_000
    reports = run_group(tmp_path, commands=commands, size=1_024)
    assert sum(r["proposed"] for r in reports) == 1
    assert anomalies(reports, commands) == []


@pytest.mark.slow
def test_negative_control_stock_pysyncobj_is_caught(tmp_path: Path) -> None:
    # Unpatched, the fault shows in roughly a third of runs here: six runs make a miss rare.
    for attempt in range(6):
        reports = run_group(
            tmp_path / str(attempt), commands=20_000, size=2_048, extra=("--unpatched",)
        )
        if anomalies(reports, 20_000):
            return
    pytest.fail("six runs of stock pysyncobj showed no truncation and no stuck follower")
