"""The arithmetic and text every comparison of benchmark reports shares (`bench.compare`,
`bench.compare_kafka`).

Role: pure functions, no I/O: reach into a report without guessing (`dig`: None where a figure
is missing), a ratio and a goal's verdict from two figures, a consumer group's figures, and
numbers and CPU as the markdown shows them.
"""

from __future__ import annotations

from typing import Any

# A goal: (what it measures, its target ratio, "min" if the ratio must reach it, "max" if it
# must stay under it).
Goals = dict[str, tuple[str, float, str]]


def dig(report: dict[str, Any] | None, *keys: str) -> Any:
    """report[k1][k2]... or None where any step is missing."""
    value: Any = report
    for key in keys:
        if not (isinstance(value, dict) and key in value):
            return None
        value = value[key]
    return value


def ratio(ours: float | None, peer: float | None) -> float | None:
    return None if ours is None or not peer else round(ours / peer, 2)


def goal(name: str, ours: float | None, peer: float | None, goals: Goals) -> dict[str, Any]:
    what, target, direction = goals[name]
    if ours is None or peer is None or peer == 0:
        return {"what": what, "ratio": None, "target": target, "met": None}
    ratio = ours / peer
    met = ratio >= target if direction == "min" else ratio <= target
    return {"what": what, "ratio": round(ratio, 2), "target": target, "met": met}


def goal_cells(goals: Goals, name: str, verdict: dict[str, Any] | None) -> tuple[str, str]:
    """A goal's target and verdict as a table shows them ("", "" for a row without one)."""
    if verdict is None:
        return "", ""
    target = f"{'>=' if goals[name][2] == 'min' else '<='} {verdict['target']}x"
    met = "" if verdict["met"] is None else ("yes" if verdict["met"] else "**no**")
    return target, met


def group_figures(groups: dict[str, Any], side: str) -> dict[str, Any]:
    """bench.groups' figures for one side ("raftbroker", "apache_kafka" or "jetstream")."""
    return {
        "groups_consume": dig(groups, side, "throughput", "records_per_s"),
        "groups_takeover_median": dig(groups, side, "crash", "takeover_median_s"),
        "groups_takeover_max": dig(groups, side, "crash", "takeover_max_s"),
    }


def number(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    return f"{value:,.0f}" if isinstance(value, int | float) else str(value)


def cpu_text(cpu: dict[str, Any] | None) -> str:
    if not cpu:
        return "-"
    not_servers = {"client", "total", "others_on_machine", "steal"}
    servers = sum(
        v["cpu_percent"] for k, v in cpu.items() if isinstance(v, dict) and k not in not_servers
    )
    client = dig(cpu, "client", "cpu_percent")
    return f"servers {servers:.0f}%, client {number(client)}%"
