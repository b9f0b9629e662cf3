"""The issue's cluster goals, judged on `bench.cluster`'s report (its `goals` section).

Role: absolute targets for raftbroker alone, not ratios to the peer (those are
`bench.compare`'s): at least 100,000 acknowledged records/s with batching, a p50 produce
latency under 5 ms at 1,000 records/s, produce resuming within 2 s (median) after the partition
leader is SIGKILLed, losing and duplicating nothing. A figure a scenario did not produce (not
run, or failed) is `None` and its goal not met.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

GOAL_RECORDS_PER_S = 100_000
GOAL_P50_MS = 5.0
GOAL_FAILOVER_S = 2.0


def goal(target: float, measured: float | None, *, below: bool = False) -> dict[str, Any]:
    met = measured is not None and (measured < target if below else measured >= target)
    return {"target": target, "measured": measured, "met": met}


def latency_goal(cases: Sequence[Mapping[str, Any]], mode: str) -> dict[str, Any]:
    """The p50 goal for one latency mode (linger 0), with the rate that mode achieved."""
    case = next((c for c in cases if (c["mode"], c["linger_ms"]) == (mode, 0)), None)
    if case is None:
        return goal(GOAL_P50_MS, None, below=True)
    found = goal(GOAL_P50_MS, case["p50_ms"], below=True)
    return {**found, "achieved_rate_per_s": case["achieved_rate_per_s"]}


def delivery_goal(delivery: Mapping[str, Any]) -> dict[str, Any]:
    """Nothing acknowledged lost, nothing duplicated, in the failover scenario's read-back."""
    return {
        "lost": delivery.get("lost"),
        "duplicated": delivery.get("duplicated"),
        "met": bool(delivery) and delivery["lost"] == 0 and delivery["duplicated"] == 0,
    }


def goals(sections: Mapping[str, Any]) -> dict[str, Any]:
    throughput = sections.get("throughput", {}).get("best", {}).get("records_per_s")
    latency_cases = sections.get("latency", {}).get("cases", [])
    failover = sections.get("failover", {}).get("resume_median_ms")
    found = {
        "acked_records_per_s_with_batching": goal(GOAL_RECORDS_PER_S, throughput),
        "p50_latency_ms_at_1000_per_s": latency_goal(latency_cases, "sequential"),
        # Sequential sends reach 1,000/s only while the mean latency is under 1 ms: the same
        # goal at a true offered rate of 1,000 records/s.
        "p50_latency_ms_open_loop_1000_per_s": latency_goal(latency_cases, "open_loop"),
        "failover_resume_s_median": goal(
            GOAL_FAILOVER_S, None if failover is None else round(failover / 1000, 3), below=True
        ),
        "no_loss_no_duplicates": delivery_goal(sections.get("failover", {}).get("delivery", {})),
    }
    return {**found, "all_met": all(g["met"] for g in found.values())}
