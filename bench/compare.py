"""Side by side: raftbroker's benchmark JSON, Apache Kafka's and JetStream's, as ratios against
the goals.

Role: pure functions from the reports (`bench.cluster`, `bench.kafka` against raftbroker's
Kafka listener and against Apache Kafka, `bench.jetstream`, `bench.groups`) to one combined
JSON object and its markdown rendering; no I/O. A figure one side did not produce is `None`
and its goal is "not measured", never a guess.

Pairing: a raftbroker partition and a JetStream stream are each one Raft group, so the goal
ratios pair one partition with one stream; raftbroker's scaling over 4 and 16 partitions is
shown beside them. The sequential p50s the goals compare are each side's median over the
rounds that `python -m bench` runs in alternation (`ROUND_FIGURES`), when it ran them; the
scenario runs' own figures are kept beside them (`..._scenario`).
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from bench import compare_txns
from bench.compare_kafka import apache_figures, goals_vs_kafka, kafka_figures, kafka_table
from bench.report import Goals, cpu_text, dig, goal, goal_cells, group_figures, number, ratio

GOALS: Goals = {
    "pipelined": ("acknowledged records/s, pipelined, one partition vs one stream", 5.0, "min"),
    "sequential_p50": ("sequential publish p50 latency, ms", 1.0, "max"),
    "failover": ("failover: SIGKILL of the leader -> next ack, median ms", 0.5, "max"),
    "consume": ("consume from the start, records/s", 3.0, "min"),
    # Issue 21: librdkafka through the Kafka listener (bench.kafka), against the same JetStream
    # figures: one partition against one stream, as above.
    "kafka_pipelined": (
        "Kafka listener, librdkafka: acknowledged records/s, pipelined",
        30.0,
        "min",
    ),
    "kafka_sequential_p50": ("Kafka listener, librdkafka: sequential p50 latency, ms", 1.0, "max"),
    "kafka_consume": ("Kafka listener, librdkafka: consume records/s", 10.0, "min"),
    # Issue 22: with every acknowledgement fsynced first (raftbroker `fsync = true`, JetStream
    # `sync_interval: always`). The pipelined goal is against raftbroker's own figure without
    # fsync in the same scenario (`OWN_BASELINE`), the latency goal against JetStream's.
    "fsync_pipelined": (
        "with fsync: acknowledged records/s, pipelined, one partition, against its own "
        "without fsync",
        0.5,
        "min",
    ),
    "fsync_sequential_p50": ("with fsync: sequential publish p50 latency, ms", 1.0, "max"),
}
# Goals whose denominator is raftbroker's own figure (named here), not JetStream's.
OWN_BASELINE = {"fsync_pipelined": "fsync_pipelined_without"}
# Issue 23 (bench.groups): consumer groups, no goal stated; their ratios are shown beside.
RATIOS_ONLY = ("groups_consume", "groups_takeover_median", "groups_takeover_max")
# Which JetStream figure each Kafka-listener goal is measured against.
PEER_FIGURE = {
    "kafka_pipelined": "pipelined",
    "kafka_sequential_p50": "sequential_p50",
    "kafka_consume": "consume",
}


# The figure each side's sequential rounds stand for: (side in a round, its report, figure,
# its name in the markdown).
ROUND_FIGURES = (
    ("raftbroker", "raftbroker", "sequential_p50", "raftbroker"),
    ("kafka", "raftbroker", "kafka_sequential_p50", "Kafka listener"),
    ("apache_kafka", "apache_kafka", "kafka_sequential_p50", "Apache Kafka"),
    ("jetstream", "jetstream", "sequential_p50", "JetStream"),
)


def ours_pipelined(ours: dict[str, Any], partitions: int = 1) -> dict[str, Any] | None:
    cases = [c for c in dig(ours, "throughput", "cases") or [] if c["partitions"] == partitions]
    return max(cases, key=lambda c: c["records_per_s"], default=None)


def ours_sequential(ours: dict[str, Any], mesh: str) -> dict[str, Any]:
    """The sequential, linger-0 latency case with Raft links `mesh` ("clear" or "encrypted")."""
    return next(
        (
            c
            for c in dig(ours, "latency", "cases") or []
            if c["mode"] == "sequential" and c["linger_ms"] == 0 and c.get("mesh") == mesh
        ),
        {},
    )


def ours_figures(ours: dict[str, Any]) -> dict[str, Any]:
    # Compared: links in clear, as JetStream's routes (plain TCP) in its run.
    sequential = ours_sequential(ours, "clear")
    consume = [c for c in dig(ours, "consume", "cases") or [] if c["partitions"] == 1]
    best = ours_pipelined(ours)
    return {
        "pipelined": None if best is None else best["records_per_s"],
        "pipelined_case": best,
        "sequential_p50": sequential.get("p50_ms"),
        "sequential_p99": sequential.get("p99_ms"),
        "sequential_p50_encrypted": ours_sequential(ours, "encrypted").get("p50_ms"),
        "failover": dig(ours, "failover", "resume_median_ms"),
        "failover_lost": dig(ours, "failover", "delivery", "lost"),
        "failover_duplicated": dig(ours, "failover", "delivery", "duplicated"),
        "consume": max((c["records_per_s"] for c in consume), default=None),
        "fsync_pipelined": dig(ours, "fsync", "records_per_s_median", "fsync"),
        "fsync_pipelined_without": dig(ours, "fsync", "records_per_s_median", "no_fsync"),
        "fsync_sequential_p50": dig(ours, "fsync", "sequential_p50_ms_median", "fsync"),
        "fsync_sequential_p50_without": dig(ours, "fsync", "sequential_p50_ms_median", "no_fsync"),
        "raw_fsync_per_s": dig(ours, "fsync", "params", "raw_fsync_per_s"),
    }


def round_medians(rounds: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each side's median sequential p50 over the rounds (None: no round measured it)."""
    medians: dict[str, float | None] = {}
    for side, *_ in ROUND_FIGURES:
        values = [p50 for row in rounds if (p50 := dig(row, side, "p50_ms")) is not None]
        medians[side] = round(statistics.median(values), 3) if values else None
    return medians


def _with_rounds(
    figures: dict[str, dict[str, Any]], rounds: list[dict[str, Any]]
) -> dict[str, float | None]:
    """Put each side's median over `rounds` in place of its scenario figure (kept as
    `<figure>_scenario`); the medians."""
    medians = round_medians(rounds)
    for side, report, figure, _ in ROUND_FIGURES:
        figures[report][f"{figure}_scenario"] = figures[report][figure]
        figures[report][figure] = medians[side]
    return medians


def peer_figures(peer: dict[str, Any]) -> dict[str, Any]:
    return {
        "pipelined": dig(peer, "pipelined", "msgs_per_s"),
        "pipelined_case": dig(peer, "pipelined"),
        "sequential_p50": dig(peer, "sequential", "p50_ms"),
        "sequential_p99": dig(peer, "sequential", "p99_ms"),
        # Compared: its client on the stream leader's server, as raftbroker's producer sends to
        # the partition leader. Through a follower's server it crosses one more hop each way.
        "sequential_p50_via_follower": dig(peer, "sequential_via_follower", "p50_ms"),
        "failover": dig(peer, "failover", "resume_median_ms"),
        "failover_lost": dig(peer, "failover", "lost"),
        "failover_duplicated": dig(peer, "failover", "duplicated"),
        # The peer's fastest consumer (nats-py's ordered push consumer reads 3x its pull one),
        # so the ratio is against the best a JetStream user gets, not the slowest mode.
        "consume": dig(peer, "consume", "fastest_msgs_per_s") or dig(peer, "consume", "msgs_per_s"),
        "fsync_pipelined": dig(peer, "fsync", "pipelined", "msgs_per_s"),
        "fsync_sequential_p50": dig(peer, "fsync", "sequential", "p50_ms"),
        "fsync_server": dig(peer, "fsync", "server"),
    }


def combine(  # noqa: PLR0917 - one report per side, in the order the run makes them
    ours: dict[str, Any],
    peer: dict[str, Any],
    kafka: dict[str, Any] | None = None,
    groups: dict[str, Any] | None = None,
    rounds: list[dict[str, Any]] | None = None,
    apache: dict[str, Any] | None = None,
    txns: dict[str, Any] | None = None,
) -> dict[str, Any]:
    a = ours_figures(ours) | kafka_figures(kafka or {}) | group_figures(groups or {}, "raftbroker")
    b = peer_figures(peer) | group_figures(groups or {}, "jetstream")
    theirs = apache_figures(apache or {}, groups or {})
    sides = {"raftbroker": a, "jetstream": b, "apache_kafka": theirs}
    medians = _with_rounds(sides, rounds) if rounds else None
    b |= {name: b[figure] for name, figure in PEER_FIGURE.items()}
    return {
        "benchmark": "raftbroker vs Apache Kafka and NATS JetStream, same machine, same run",
        "machine": ours.get("machine") or peer.get("machine"),
        "raftbroker": {k: v for k, v in a.items() if not k.endswith("_case")},
        "jetstream": {k: v for k, v in b.items() if not k.endswith("_case")},
        "apache_kafka": theirs,
        "goals": {
            name: goal(
                name, a[name], a[OWN_BASELINE[name]] if name in OWN_BASELINE else b[name], GOALS
            )
            for name in GOALS
        },
        "goals_vs_kafka": goals_vs_kafka(a, theirs),
        "transactions": compare_txns.txn_figures(txns),
        "ratios": {name: ratio(a[name], b[name]) for name in RATIOS_ONLY},
        "scaling": {
            str(p): (ours_pipelined(ours, p) or {}).get("records_per_s") for p in (1, 4, 16)
        },
        "idle_cpu_percent_per_group": dig(ours, "idle", "cpu_percent_per_partition_group"),
        "cpu_in_pipelined": {
            "raftbroker": dig(a, "pipelined_case", "cpu"),
            "jetstream": dig(b, "pipelined_case", "cpu"),
        },
        "sequential_rounds": {"rounds": rounds or [], "medians": medians},
        "versions": {
            "jetstream": peer.get("versions"),
            "apache_kafka": (apache or {}).get("cluster"),
            "python": dig(ours, "machine", "python"),
        },
        "fsync_before_ack": {
            "raftbroker": "no (fsync = false, set for the comparison: an ack means a "
            "majority's page cache; the default fsync = true is in the fsync row and note)",
            "jetstream": dig(peer, "config", "fsync") or "no (NATS 2.9 syncs every 2 min)",
        },
        "links_between_nodes": {
            "raftbroker": dig(ours, "config", "raft_links") or "?",
            "jetstream": dig(peer, "config", "routes") or "?",
        },
        "errors": {
            "raftbroker": ours.get("errors") or {},
            "jetstream": peer.get("errors") or {},
            "kafka": (kafka or {}).get("errors") or {},
            "apache_kafka": (apache or {}).get("errors") or {},
            "groups": (groups or {}).get("errors") or {},
            "transactions": (txns or {}).get("errors") or {},
            "rounds": {
                f"{index}-{side}": row[side]["errors"]
                for index, row in enumerate(rounds or [], 1)
                for side in row
                if row[side].get("errors")
            },
        },
        "reports": {
            "raftbroker": ours,
            "jetstream": peer,
            "kafka": kafka,
            "apache_kafka": apache,
            "groups": groups,
            "transactions": txns,
        },
    }


def markdown(c: dict[str, Any]) -> str:
    a, b, goals = c["raftbroker"], c["jetstream"], c["goals"]
    machine = c.get("machine") or {}
    rows = [
        ("pipelined, acked records/s (1 partition / 1 stream)", "pipelined", 0),
        ("sequential publish p50, ms (rounds: see below)", "sequential_p50", 2),
        ("sequential publish p99, ms (scenario runs)", "sequential_p99", 2),
        ("failover, kill -> next ack, median ms", "failover", 0),
        ("consume from the start, records/s (JetStream: its fastest consumer)", "consume", 0),
        ("failover: lost / duplicated", None, 0),
        ("Kafka listener, kcat: pipelined acked records/s (1 partition)", "kafka_pipelined", 0),
        (
            "Kafka listener, confluent-kafka: sequential p50, ms (rounds)",
            "kafka_sequential_p50",
            2,
        ),
        ("Kafka listener, kcat: consume records/s (1 partition)", "kafka_consume", 0),
        ("with fsync: sequential publish p50, ms", "fsync_sequential_p50", 2),
        (
            "consumer group of 3 (librdkafka, 4 partitions / JetStream: 3 pull subscribers on "
            "one durable), records/s",
            "groups_consume",
            0,
        ),
        (
            "consumer group: member SIGKILLed -> its work read by another, median s",
            "groups_takeover_median",
            2,
        ),
        ("consumer group: the same, max s", "groups_takeover_max", 2),
    ]
    lines = [
        "# raftbroker vs Apache Kafka and NATS JetStream",
        "",
        "Generated by `python -m bench` (do not edit by hand). Same machine, one after the "
        "other, in one run.",
        "",
        *kafka_table(c),
        "",
        "## raftbroker vs NATS JetStream",
        "",
        f"- Machine: {machine.get('cpu_count', '?')} CPUs, {machine.get('platform', '?')}, "
        f"Python {machine.get('python', '?')}.",
        "- Versions: "
        + ", ".join(f"{k} {v}" for k, v in (dig(c, "versions", "jetstream") or {}).items())
        + ".",
        f"- fsync before ack: raftbroker {c['fsync_before_ack']['raftbroker']}; JetStream "
        f"{c['fsync_before_ack']['jetstream']}.",
        f"- Links between nodes: raftbroker {c['links_between_nodes']['raftbroker']}; "
        f"JetStream {c['links_between_nodes']['jetstream']}.",
        "- Workload: 100-byte values, a unique id per message (idempotent producer / "
        "`Nats-Msg-Id`), every publish acknowledged by a majority of 3 replicas on 127.0.0.2-4.",
        "",
        "| measure | raftbroker | JetStream | ratio | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for label, key, digits in rows:
        if key is None:
            lines.append(
                f"| {label} | {number(a['failover_lost'])} / {number(a['failover_duplicated'])} | "
                f"{number(b['failover_lost'])} / {number(b['failover_duplicated'])} | | 0 / 0 | |"
            )
            continue
        g = goals.get(key)
        goal_text, met = goal_cells(GOALS, key, g)
        shown = c["ratios"].get(key) if g is None else g["ratio"]
        ratio_text = "" if shown is None else number(shown, 2)
        lines.append(
            f"| {label} | {number(a[key], digits)} | {number(b[key], digits)} | {ratio_text} "
            f"| {goal_text} | {met} |"
        )
    cpu = c["cpu_in_pipelined"]
    lines += [
        "",
        _rounds_text(c),
        "",
        "Sequential publishes: JetStream's client is connected to the stream leader's server "
        "(raftbroker's producer sends to the partition leader); connected to a follower's "
        f"server instead, its p50 is {number(b.get('sequential_p50_via_follower'), 2)} ms (the "
        "publish and its ack cross one more hop). raftbroker with its Raft links encrypted "
        f"(a cluster secret, as off loopback): p50 {number(a.get('sequential_p50_encrypted'), 2)} "
        "ms.",
        "",
        f"CPU during the pipelined run: raftbroker {cpu_text(cpu['raftbroker'])}; JetStream "
        f"{cpu_text(cpu['jetstream'])} (% of one core; the machine has "
        f"{machine.get('cpu_count', '?')} cores).",
        "",
        "raftbroker scaling, acked records/s with one producer: "
        + ", ".join(f"{p} partition(s) {number(v)}" for p, v in c["scaling"].items())
        + f"; idle CPU per partition group per node: "
        f"{number(dig(c, 'idle_cpu_percent_per_group', 'node1'), 2)}% of a core.",
        "",
        "Kafka listener (librdkafka 2.x, `python -m bench.kafka`): pipelined with 16 "
        f"partitions {number(a.get('kafka_pipelined_16'))} acked records/s, consumed "
        f"{number(a.get('kafka_consume_16'))} records/s; sequential p99 "
        f"{number(a.get('kafka_sequential_p99'), 2)} ms. Its goals in this table are ratios to "
        "the same JetStream figures as above (one partition against one stream); against "
        "Apache Kafka, the table at the top.",
        "",
        _fsync_text(a, b, goals["fsync_pipelined"]),
        "",
        _groups_text(dig(c, "reports", "groups", "config") or {}),
        "",
        *compare_txns.markdown(c["transactions"]),
        "",
        "Errors: " + (json.dumps(c["errors"]) if any(c["errors"].values()) else "none") + ".",
        "",
    ]
    return "\n".join(lines)


def _rounds_text(c: dict[str, Any]) -> str:
    rounds = dig(c, "sequential_rounds", "rounds") or []
    scenario = ", ".join(
        f"{label} {number(c[report].get(f'{figure}_scenario', c[report][figure]), 2)}"
        for _, report, figure, label in ROUND_FIGURES
    )
    if not rounds:
        return f"Sequential p50 in the scenario runs (no rounds run): {scenario} ms."
    each = "; ".join(
        f"round {index}: "
        + ", ".join(
            f"{label} {number(dig(row, side, 'p50_ms'), 3)}" for side, _, _, label in ROUND_FIGURES
        )
        for index, row in enumerate(rounds, 1)
    )
    return (
        "Sequential p50, ms, in rounds (each side's compared case alone, on a fresh cluster, "
        "one after the other, the order rotated each round); the goal rows above compare each "
        f"side's median over them: {each}. In the scenario runs, minutes apart: {scenario} ms."
    )


def _groups_text(config: dict[str, Any]) -> str:
    return (
        "Consumer groups (`python -m bench.groups`, no goal stated): each member its own "
        "process; raftbroker's are confluent-kafka consumers with `session.timeout.ms` "
        f"{number(config.get('session_timeout_ms'))} and `heartbeat.interval.ms` "
        f"{number(config.get('heartbeat_interval_ms'))}; JetStream's pull from one durable "
        "consumer with explicit acks and `ack_wait` "
        f"{number(config.get('jetstream_ack_wait_s'))} s, each "
        "acknowledging a batch when it fetches the next. A crash holds up a raftbroker "
        "member's partitions until the session times out and the group rebalances; it holds "
        "up a JetStream member's unacknowledged batch until `ack_wait` passes (its other "
        "members read new messages meanwhile)."
    )


def _fsync_text(a: dict[str, Any], b: dict[str, Any], pipelined: dict[str, Any]) -> str:
    met = {None: "not measured", True: "met", False: "**not met**"}[pipelined["met"]]
    return (
        "With fsync before every acknowledgement (raftbroker `fsync = true`, its default, in "
        "alternation with `fsync = false` on fresh clusters; JetStream `sync_interval: always`, "
        f"{number(b.get('fsync_server'))}: NATS 2.9 has no such setting): pipelined, one "
        "partition, "
        f"{number(a.get('fsync_pipelined'))} acked records/s against "
        f"{number(a.get('fsync_pipelined_without'))} without fsync, ratio "
        f"{number(pipelined['ratio'], 2)} (goal >= {pipelined['target']}: {met}); JetStream "
        f"{number(b.get('fsync_pipelined'))}. Sequential p50 without fsync in the same scenario "
        f"{number(a.get('fsync_sequential_p50_without'), 2)} ms. This machine's disk: "
        f"{number(a.get('raw_fsync_per_s'))} fsynced one-record appends/s (`bench.storage`)."
    )
