"""The side-by-side benchmark suite still runs end to end (numbers come from full runs only).

`python -m bench --quick` runs raftbroker's scenarios (native, and librdkafka through the Kafka
listener), the same librdkafka cases against Apache Kafka and JetStream's for a few seconds
each, one after the other; this checks that every
side produced every figure the comparison needs, that neither lost or duplicated anything in
its failover, that consumer groups were measured on both sides, that the sequential round
ran every side's compared case, that fsync, the idle cluster, memory, Kafka's own tools and
transactions were measured on both brokers, and that no server is left running. Under
`-m slow` (about 8 minutes): the default test run keeps to its 15-minute budget, and
`make bench` exercises the same code at length.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.procs import REPO


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quick_comparison_produces_every_figure_on_both_sides(tmp_path: Path) -> None:
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server is not installed (Debian package nats-server)")
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert out.exists(), done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == {
        "raftbroker": {},
        "jetstream": {},
        "kafka": {},
        "apache_kafka": {},
        "groups": {},
        "transactions": {},
        "rounds": {},
    }, report["errors"]
    # The compared sequential latencies come from the alternating rounds (one when quick).
    (row,) = report["sequential_rounds"]["rounds"]
    sides = ("raftbroker", "kafka", "apache_kafka", "jetstream")
    assert all(row[side]["p50_ms"] > 0 for side in sides), row
    assert report["raftbroker"]["sequential_p50"] == row["raftbroker"]["p50_ms"]
    assert report["jetstream"]["sequential_p50"] == row["jetstream"]["p50_ms"]
    for side in ("raftbroker", "jetstream"):
        figures = report[side]
        for name in ("pipelined", "sequential_p50", "failover", "consume"):
            assert figures[name] is not None and figures[name] > 0, (side, name, figures)
        assert (figures["failover_lost"], figures["failover_duplicated"]) == (0, 0), side
    for name in ("kafka_pipelined", "kafka_sequential_p50", "kafka_consume", "kafka_e2e_p99",
                 "kafka_failover"):  # fmt: skip
        assert report["raftbroker"][name] > 0 and report["apache_kafka"][name] > 0, name
    assert report["apache_kafka"]["kafka_sequential_p50"] == row["apache_kafka"]["p50_ms"]
    for name in ("groups_consume", "groups_takeover_median", "groups_takeover_max"):
        for side in ("raftbroker", "apache_kafka", "jetstream"):
            assert report[side][name] > 0, (side, name)
    # fsync on both, the idle cluster, memory and Kafka's own tools, against both brokers
    for name in ("kafka_fsync_pipelined", "kafka_fsync_sequential_p50", "kafka_idle_cpu",
                 "kafka_idle_rss_mb", "kafka_peak_rss_mb", "tools_producer", "tools_consumer",
                 "tools_e2e_p99"):  # fmt: skip
        assert report["raftbroker"][name] > 0 and report["apache_kafka"][name] > 0, name
    assert all(g["ratio"] is not None for g in report["goals"].values())
    quick = (
        "kafka_pipelined",
        "kafka_consume",
        "kafka_sequential_p50",
        "kafka_e2e_p99",
        "kafka_failover",
        "kafka_fsync_pipelined",
        "kafka_idle_cpu",
    )  # fmt: skip  (no 16 partitions)
    assert all(report["goals_vs_kafka"][name]["ratio"] is not None for name in quick)
    for side in ("raftbroker", "apache_kafka"):  # transactions (bench.kafka_txns), both brokers
        goals = report["transactions"][side]["goals"]
        assert all(g["ratio"] is not None and g["ratio"] > 0 for g in goals.values()), goals
    assert subprocess.run(["pgrep", "-f", "kafka.Kafka"], check=False).returncode == 1
    assert subprocess.run(["pgrep", "-x", "nats-server"], check=False).returncode == 1


def quick_run(tmp_path: Path, module: str, timeout_s: float) -> dict[str, Any]:
    """`python -m <module> --quick`, which must exit 0; its JSON report."""
    out = tmp_path / f"{module}.json"
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_quick_transactions_benchmark_measures_both_brokers(tmp_path: Path) -> None:
    """`python -m bench.kafka_txns --quick`: every case on raftbroker and on Apache Kafka,
    each goal's ratio computed, no case failed."""
    report = quick_run(tmp_path, "bench.kafka_txns", 580)
    assert report["errors"] == {}
    for side in ("raftbroker", "apache_kafka"):
        goals = report[side]["goals"]
        assert goals["txn_100_vs_plain"] > 0 and goals["read_committed_vs_uncommitted"] > 0
        assert report[side]["ctp"]["records"] == 5_000


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quick_scale_benchmark_measures_every_case(tmp_path: Path) -> None:
    """`python -m bench.scale --quick`: creation, the idle window (CPU, Raft messages per node
    pair, elections, memory) and the failover of the busiest node, on 20 partitions."""
    report = quick_run(tmp_path, "bench.scale", 280)
    run = report["partitions"]["20"]
    assert run["create"]["create_s"] > 0 and run["idle"]["cpu_percent_total"] > 0
    assert len(run["idle"]["messages_per_pair_per_s"]) == 3  # three node pairs
    assert run["idle"]["messages_per_pair_per_s_max"] > 0
    assert run["failover"]["partitions_led"] > 0 and run["failover"]["max_s"] > 0
    assert report["goals"]["at_partitions"] == 20
