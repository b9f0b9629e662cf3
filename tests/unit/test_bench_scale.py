"""bench/scale.py's arithmetic: messages per node pair from the nodes' counters, and issue 38's
verdicts from a run's figures."""

from __future__ import annotations

from typing import Any

from bench import scale

METRICS = """raftbroker_raft_messages_total{direction="received",peer="127.0.0.3:9000"} 7.0
raftbroker_raft_messages_total{direction="sent",peer="127.0.0.3:9000"} 1200.0
raftbroker_raft_messages_total{direction="sent",peer="127.0.0.4:9000"} 1.5e+03
"""


def test_the_metrics_lines_are_read() -> None:
    assert scale._MESSAGES.findall(METRICS) == [
        ("received", "127.0.0.3:9000", "7.0"),
        ("sent", "127.0.0.3:9000", "1200.0"),
        ("sent", "127.0.0.4:9000", "1.5e+03"),
    ]


def test_a_pairs_rate_counts_both_ways_over_the_window() -> None:
    a, b, c = "127.0.0.2:9000", "127.0.0.3:9000", "127.0.0.4:9000"
    before = {(a, b): 100.0, (b, a): 50.0, (a, c): 0.0}
    after = {(a, b): 300.0, (b, a): 150.0, (a, c): 40.0}
    assert scale.pair_rates(before, after, 10.0) == {f"{a} - {b}": 30.0, f"{a} - {c}": 4.0}


def run(cpu: float, rate: float, create_s: float, failover_s: float, elections: int) -> Any:
    return {
        "create": {"create_s": create_s},
        "idle": {"cpu_percent_total": cpu, "messages_per_pair_per_s_max": rate},
        "failover": {"max_s": failover_s, "survivor_elections": elections},
    }


def test_the_goals_are_judged_at_the_largest_count() -> None:
    verdict = scale.goals({"200": run(40.0, 900.0, 2.0, 1.0, 0),
                           "1000": run(9.0, 1_000.0, 4.9, 2.5, 0)})  # fmt: skip
    assert verdict["at_partitions"] == 1_000
    assert verdict["idle_cpu_met"] and verdict["create_met"] and verdict["failover_met"]
    assert verdict["pair_rate_ratio"] == 1.11 and verdict["pair_rate_met"]
    assert verdict["survivor_elections_met"]


def test_todays_cluster_misses_them() -> None:
    verdict = scale.goals({"200": run(44.0, 2_000.0, 3.0, 1.0, 0),
                           "1000": run(172.0, 10_000.0, 13.9, 4.0, 3)})  # fmt: skip
    missed = ("idle_cpu_met", "pair_rate_met", "create_met", "failover_met",
              "survivor_elections_met")  # fmt: skip
    assert not any(verdict[name] for name in missed)
    assert scale.goals({}) == {}
