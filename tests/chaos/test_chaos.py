"""The chaos harness end to end: a seeded run finds nothing, and a broken broker is caught.

The positive run is what CI runs on every change: `raftbroker chaos run` for 60 s of a seeded
schedule with at least four leader kills and two pauses (and network partitions inside a
namespace of its own where the machine allows) against a real 3-node cluster, checked for every
anomaly kind. The negative control runs the same command against nodes whose apply appends
retried batches again: a checker that stayed green there would be worthless.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster.chaos.nemesis import schedule
from tests.cluster.procs import REPO

pytestmark = pytest.mark.chaos
CI_SEED = 7
CI_DURATION_S = 60
CI_INTERVAL_S = 5


def chaos_run(out: Path, *args: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "chaos", "run", "--out", str(out), "--json", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert (out / "report.json").exists(), done.stderr[-3000:]
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return done.returncode, report


@pytest.mark.parametrize("network", [False, True])
def test_the_ci_schedule_has_the_faults_it_promises(network: bool) -> None:
    faults = schedule(CI_SEED, CI_DURATION_S, 4, CI_INTERVAL_S, network=network)
    kinds = [f.kind for f in faults]
    assert kinds.count("kill-leader") + kinds.count("kill-meta-leader") >= 4
    assert sum(k.startswith("pause") for k in kinds) >= 2
    assert not network or {"partition-leader", "split"} <= set(kinds)
    assert schedule(CI_SEED, CI_DURATION_S, 4, CI_INTERVAL_S, network=network) == faults


@pytest.mark.timeout(300)
def test_a_seeded_run_of_leader_kills_and_pauses_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    code, report = chaos_run(
        tmp_path,
        "--duration",
        str(CI_DURATION_S),
        "--seed",
        str(CI_SEED),
        "--fault-interval",
        str(CI_INTERVAL_S),
        timeout_s=280,
    )
    assert report["ok"], report["anomaly_examples"][:10]
    assert code == 0
    figures = report["figures"]
    assert figures["operations"]["ok"] > 1_000
    done = figures["faults"]
    assert done.get("kill-leader", 0) + done.get("kill-meta-leader", 0) >= 4, done
    assert done.get("pause-leader", 0) + done.get("pause-follower", 0) >= 2, done
    if not report["faults_skipped"]:  # the machine gave the run a network namespace
        assert done.get("partition-leader", 0) + done.get("split", 0) >= 2, done


@pytest.mark.timeout(240)
def test_the_checker_catches_a_broker_that_does_not_deduplicate(tmp_path: Path) -> None:
    code, report = chaos_run(
        tmp_path,
        "--duration",
        "30",
        "--seed",
        "3",
        "--fault-interval",
        "3",
        "--no-network",
        "--unsafe-disable-deduplication",
        timeout_s=220,
    )
    assert code == 1
    assert report["anomalies_by_kind"]["duplicate"] > 0, report["figures"]
    # The sink's reruns (fenced writes, whose fence the fault also disables) show up too.
    duplicated = [a["detail"] for a in report["anomaly_examples"] if a["kind"] == "duplicate"]
    assert any(d.startswith("s0-") for d in duplicated), duplicated[:10]
