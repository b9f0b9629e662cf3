"""bench/compare.py: the pairing of the two reports and the goal arithmetic."""

from __future__ import annotations

from typing import Any

from bench import compare


def ours() -> dict[str, Any]:
    case = {"partitions": 1, "batch_size_bytes": 16384, "records_per_s": 100_000, "cpu": {}}
    return {
        "throughput": {"cases": [case, {**case, "partitions": 4, "records_per_s": 150_000}]},
        "consume": {"cases": [{"partitions": 1, "records_per_s": 300_000}]},
        "latency": {
            "cases": [
                {
                    "mode": "sequential",
                    "linger_ms": 0.0,
                    "mesh": "clear",
                    "p50_ms": 1.2,
                    "p99_ms": 3,
                },
                {"mode": "sequential", "linger_ms": 0.0, "mesh": "encrypted", "p50_ms": 1.4},
            ]
        },
        "failover": {"resume_median_ms": 800.0, "delivery": {"lost": 0, "duplicated": 0}},
    }


def peer() -> dict[str, Any]:
    return {
        "pipelined": {"msgs_per_s": 15_000},
        "sequential": {"p50_ms": 0.7, "p99_ms": 2},
        "sequential_via_follower": {"p50_ms": 0.95, "p99_ms": 2.5},
        "consume": {"msgs_per_s": 120_000},
        "failover": {"resume_median_ms": 5_000.0, "lost": 0, "duplicated": 0},
    }


def test_ratios_pair_one_partition_with_one_stream_and_judge_each_goal() -> None:
    goals = compare.combine(ours(), peer())["goals"]
    assert goals["pipelined"]["ratio"] == 6.67 and goals["pipelined"]["met"] is True
    assert goals["sequential_p50"]["ratio"] == 1.71 and goals["sequential_p50"]["met"] is False
    assert goals["failover"]["ratio"] == 0.16 and goals["failover"]["met"] is True
    assert goals["consume"]["ratio"] == 2.5 and goals["consume"]["met"] is False


def test_a_missing_side_is_not_measured_never_guessed() -> None:
    combined = compare.combine(ours(), {"errors": {"run": "nats-server missing"}})
    assert all(g["ratio"] is None and g["met"] is None for g in combined["goals"].values())
    text = compare.markdown(combined)
    assert "nats-server missing" in text and "| - |" in text


def test_the_markdown_shows_both_sides_and_the_verdicts() -> None:
    text = compare.markdown(compare.combine(ours(), peer()))
    assert "| pipelined, acked records/s (1 partition / 1 stream) | 100,000 | 15,000 | 6.67" in text
    assert "**no**" in text and "yes" in text
    assert "4 partition(s) 150,000" in text


def test_sequential_latency_is_judged_against_the_client_on_the_stream_leader() -> None:
    # Like for like: raftbroker's producer sends to the partition leader; the slower figure of
    # a JetStream client on a follower's server is shown beside it, never compared.
    combined = compare.combine(ours(), peer())
    assert combined["goals"]["sequential_p50"]["ratio"] == 1.71
    assert "its p50 is 0.95 ms" in compare.markdown(combined)


def test_sequential_latency_pairs_links_in_clear_with_plain_routes() -> None:
    # JetStream's routes run without TLS; raftbroker's encrypted figure is shown, not compared.
    report = ours()
    report["latency"]["cases"].reverse()  # the pairing must not depend on the order
    combined = compare.combine(report, peer())
    assert combined["raftbroker"]["sequential_p50"] == 1.2
    assert "encrypted (a cluster secret, as off loopback): p50 1.40 ms" in compare.markdown(
        combined
    )


def kafka() -> dict[str, Any]:
    return {
        "pipelined": {
            "cases": [
                {"partitions": 1, "records_per_s": 600_000, "memory": memory(90.0)},
                {"partitions": 16, "records_per_s": 700_000},
            ]
        },
        "consume": {
            "cases": [
                {"partitions": 1, "records_per_s": 1_500_000},
                {"partitions": 16, "records_per_s": 1_300_000},
            ]
        },
        "sequential": {"p50_ms": 0.6, "p99_ms": 1.5},
        "e2e": {"p50_ms": 0.5, "p99_ms": 1.6},
        "failover": {"p50_ms": 1_000.0},
        "fsync": {"pipelined": {"records_per_s": 300_000}, "sequential": {"p50_ms": 1.2}},
        "idle": {"cpu_percent_total": 150.0, "memory": memory(90.0)},
        "tools": tools(400_000, 3.0),
    }


def memory(rss_mb: float) -> dict[str, Any]:
    """bench.harness.memory_mb's report of three nodes, the largest `rss_mb`."""
    return {f"node{i}": {"rss_mb": rss_mb - i, "peak_rss_mb": 2 * rss_mb - i} for i in range(3)}


def tools(records_per_s: float, e2e_p99_ms: float) -> dict[str, Any]:
    """bench.kafka_tools' report: Kafka's own tools' summaries."""
    return {
        "producer_performance": {"records_per_s": records_per_s, "p99_ms": 20.0},
        "consumer_performance": {"fetch_records_per_s": 2 * records_per_s},
        "end_to_end_latency": {"p50_ms": 1.0, "p99_ms": e2e_p99_ms},
    }


def test_the_kafka_listener_goals_pair_its_one_partition_with_jetstreams_one_stream() -> None:
    combined = compare.combine(ours(), peer(), kafka())
    goals = combined["goals"]
    assert goals["kafka_pipelined"]["ratio"] == 40.0 and goals["kafka_pipelined"]["met"] is True
    assert goals["kafka_consume"]["ratio"] == 12.5 and goals["kafka_consume"]["met"] is True
    assert goals["kafka_sequential_p50"]["ratio"] == 0.86
    assert goals["kafka_sequential_p50"]["met"] is True
    text = compare.markdown(combined)
    assert (
        "| Kafka listener, kcat: pipelined acked records/s (1 partition) | 600,000 | 15,000" in text
    )
    assert "pipelined with 16 partitions 700,000" in text


def apache_kafka() -> dict[str, Any]:
    """bench.kafka's report against Apache Kafka: the same cases, its own figures."""
    return {
        "broker": "apache-kafka",
        "cluster": {"kafka": "4.4.0", "mode": "KRaft combined", "heap_mb": 1024},
        "pipelined": {
            "cases": [
                {"partitions": 1, "records_per_s": 500_000, "memory": memory(450.0)},
                {"partitions": 16, "records_per_s": 1_000_000},
            ]
        },
        "consume": {
            "cases": [
                {"partitions": 1, "records_per_s": 2_000_000},
                {"partitions": 16, "records_per_s": 1_000_000},
            ]
        },
        "sequential": {"p50_ms": 2.4, "p99_ms": 8.0},
        "e2e": {"p50_ms": 20.0, "p99_ms": 1.0},
        "failover": {"p50_ms": 8_000.0},
        "fsync": {"pipelined": {"records_per_s": 200_000}, "sequential": {"p50_ms": 6.0}},
        "idle": {"cpu_percent_total": 15.0, "memory": memory(450.0)},
        "tools": tools(100_000, 30.0),
    }


def test_apache_kafka_is_the_first_peer_its_goals_ratios_of_the_same_workloads() -> None:
    combined = compare.combine(ours(), peer(), kafka(), apache=apache_kafka())
    goals = combined["goals_vs_kafka"]
    assert goals["kafka_pipelined"] == {**goals["kafka_pipelined"], "ratio": 1.2, "met": True}
    assert goals["kafka_pipelined_16"] == {**goals["kafka_pipelined_16"], "ratio": 0.7}
    assert goals["kafka_pipelined_16"]["met"] is False
    assert goals["kafka_consume"]["ratio"] == 0.75 and goals["kafka_consume"]["met"] is False
    assert goals["kafka_sequential_p50"]["ratio"] == 0.25
    assert goals["kafka_sequential_p50"]["met"] is True
    text = compare.markdown(combined)
    assert text.index("## raftbroker vs Apache Kafka") < text.index("## raftbroker vs NATS")
    assert "| pipelined, acked records/s, 1 partition (kcat) | 600,000 | 500,000 | 1.20 |" in text
    assert "Apache Kafka 4.4.0 (KRaft combined;" in text
    assert goals["kafka_failover"]["ratio"] == 0.12 and goals["kafka_failover"]["met"] is True
    assert goals["kafka_e2e_p99"]["ratio"] == 1.6 and goals["kafka_e2e_p99"]["met"] is False
    assert "| failover: leader SIGKILL -> next ack, ms (p50 of the kills) | 1,000 | 8,000 |" in text
    # fsync on both sides, idle CPU at 1,000 partitions: goals; memory and Kafka's tools: ratios
    assert goals["kafka_fsync_pipelined"]["ratio"] == 1.5
    assert goals["kafka_fsync_pipelined"]["met"] is True
    assert goals["kafka_idle_cpu"]["ratio"] == 10.0 and goals["kafka_idle_cpu"]["met"] is False
    assert (
        "| idle, 1,000 partitions: resident memory, MB per node | 90 | 450 | 0.20 |  |  |" in text
    )
    assert "peak resident memory, MB per node | 180 | 900 | 0.20 |" in text
    assert (
        "| Kafka's ProducerPerformance: acked records/s, 1 partition | 400,000 | 100,000 |" in text
    )
    assert "| Kafka's EndToEndLatency: p99, ms (whole ms) | 3 | 30 | 0.10 |" in text
    assert "with fsync on both: sequential p50, ms (confluent-kafka) | 1.20 | 6.00 | 0.20 |" in text
    # Without Apache Kafka's report, its goals are not measured, never guessed.
    alone = compare.combine(ours(), peer(), kafka())["goals_vs_kafka"]
    assert all(g["met"] is None for g in alone.values())


def test_without_a_kafka_report_its_goals_are_not_measured() -> None:
    goals = compare.combine(ours(), peer())["goals"]
    assert goals["kafka_pipelined"] == {**goals["kafka_pipelined"], "ratio": None, "met": None}


def test_the_fsync_goals_pair_throughput_with_its_own_and_latency_with_jetstreams() -> None:
    with_fsync = {
        "fsync": {
            "records_per_s_median": {"fsync": 60_000, "no_fsync": 100_000},
            "sequential_p50_ms_median": {"fsync": 0.9, "no_fsync": 0.5},
            "params": {"raw_fsync_per_s": 5_000},
        }
    }
    peer_fsync = {"fsync": {"sequential": {"p50_ms": 1.2}, "pipelined": {"msgs_per_s": 25_000}}}
    combined = compare.combine(ours() | with_fsync, peer() | peer_fsync)
    goals = combined["goals"]
    assert goals["fsync_pipelined"]["ratio"] == 0.6 and goals["fsync_pipelined"]["met"] is True
    assert goals["fsync_sequential_p50"]["ratio"] == 0.75
    assert goals["fsync_sequential_p50"]["met"] is True
    text = compare.markdown(combined)
    assert "| with fsync: sequential publish p50, ms | 0.90 | 1.20 | 0.75 | <= 1.0x | yes |" in text
    assert "60,000 acked records/s against 100,000 without fsync, ratio 0.60" in text
    # Without the scenario on either side, the goals are not measured, never guessed.
    missing = compare.combine(ours(), peer())["goals"]
    assert missing["fsync_pipelined"]["met"] is None
    assert missing["fsync_sequential_p50"]["met"] is None


def groups() -> dict[str, Any]:
    def side(rate: int, median: float, top: float) -> dict[str, Any]:
        crash = {"takeover_median_s": median, "takeover_max_s": top}
        return {"throughput": {"records_per_s": rate}, "crash": crash}

    config = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 2000}
    return {"raftbroker": side(240_000, 7.9, 8.4), "jetstream": side(40_000, 6.3, 6.5)} | {
        "config": config
    }


def test_apache_kafkas_consumer_group_is_its_column_beside_raftbrokers() -> None:
    report = groups() | {"apache_kafka": groups()["jetstream"]}
    combined = compare.combine(ours(), peer(), kafka(), report, apache=apache_kafka())
    assert combined["apache_kafka"]["groups_consume"] == 40_000
    text = compare.markdown(combined)
    assert (
        "| consumer group of 3 (librdkafka, 4 partitions), records/s | 240,000 | 40,000 | 6.00 |"
        in text
    )


def test_consumer_groups_are_shown_side_by_side_as_ratios_without_a_goal() -> None:
    combined = compare.combine(ours(), peer(), None, groups())
    assert combined["ratios"] == {
        "groups_consume": 6.0,
        "groups_takeover_median": 1.25,
        "groups_takeover_max": 1.29,
    }
    assert not any(name.startswith("groups") for name in combined["goals"])
    text = compare.markdown(combined)
    assert "median s | 7.90 | 6.30 | 1.25 |  |  |" in text
    assert "`session.timeout.ms` 6,000" in text


def test_a_groups_run_that_failed_is_not_measured() -> None:
    combined = compare.combine(ours(), peer(), None, {"errors": {"raftbroker-crash": "boom"}})
    assert combined["ratios"]["groups_takeover_median"] is None
    assert "boom" in compare.markdown(combined)


def rounds(*p50s: tuple[float | None, float | None, float | None]) -> list[dict[str, Any]]:
    """Rounds of (raftbroker, Kafka listener, JetStream) sequential p50s, as bench runs them."""
    sides = ("raftbroker", "kafka", "jetstream")
    return [
        {
            side: {"p50_ms": p50, "errors": {} if p50 else {"sequential": "failed"}}
            for side, p50 in zip(sides, row, strict=True)
        }
        for row in p50s
    ]


def test_the_sequential_goals_compare_each_sides_median_over_the_rounds() -> None:
    kafka = {"sequential": {"p50_ms": 0.9}}
    played = rounds((0.5, 0.45, 0.6), (0.7, 0.5, 0.4), (0.4, 0.55, 0.5))
    combined = compare.combine(ours(), peer(), kafka, None, played)
    # Medians 0.5 / 0.5 / 0.5, not the scenario runs' 1.2 / 0.9 / 0.7.
    assert combined["sequential_rounds"]["medians"] == {
        "raftbroker": 0.5,
        "kafka": 0.5,
        "apache_kafka": None,  # these rounds did not run it
        "jetstream": 0.5,
    }
    goals = combined["goals"]
    assert goals["sequential_p50"]["ratio"] == 1.0 and goals["sequential_p50"]["met"] is True
    assert goals["kafka_sequential_p50"]["ratio"] == 1.0
    ours_side, peer_side = combined["raftbroker"], combined["jetstream"]
    assert (ours_side["sequential_p50_scenario"], peer_side["sequential_p50_scenario"]) == (
        1.2,
        0.7,
    )
    assert ours_side["kafka_sequential_p50_scenario"] == 0.9
    text = compare.markdown(combined)
    round_2 = "round 2: raftbroker 0.700, Kafka listener 0.500, Apache Kafka -, JetStream 0.400"
    assert round_2 in text
    assert "In the scenario runs, minutes apart: raftbroker 1.20" in text


def test_a_side_that_failed_a_round_is_judged_on_the_rounds_it_ran() -> None:
    played = rounds((0.5, None, 0.6), (0.7, None, None))
    combined = compare.combine(ours(), peer(), {"sequential": {"p50_ms": 0.9}}, None, played)
    assert combined["sequential_rounds"]["medians"] == {
        "raftbroker": 0.6,
        "kafka": None,
        "apache_kafka": None,
        "jetstream": 0.6,
    }
    assert combined["goals"]["kafka_sequential_p50"]["met"] is None  # not measured, not 0.9
    assert set(combined["errors"]["rounds"]) == {"1-kafka", "2-kafka", "2-jetstream"}
