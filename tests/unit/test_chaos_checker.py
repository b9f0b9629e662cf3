"""The chaos checker on synthetic histories: clean ones pass, each injected anomaly is caught.

Each test starts from one clean history (two producers, a transactional id restarted once, a
consumer, three replica logs) and breaks exactly one thing; the checker must report that kind,
on that partition, and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.chaos.checker import check, check_file
from cluster.chaos.history import HistoryError, HistoryWriter, parse_event, read_history
from cluster.chaos.report import KINDS, Report

Row = list[Any]


class Story:
    """A history under construction: sends and their log, in time order."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.log: dict[int, list[Row]] = {0: [], 1: []}
        self.t = 0.0
        self.sequences: dict[tuple[int, int, int], int] = {}

    def add(self, type_: str, process: str, f: str, **fields: Any) -> dict[str, Any]:
        self.t += 1.0
        event = {"type": type_, "time_ms": self.t, "process": process, "f": f, **fields}
        self.events.append(event)
        return event

    def send(self, process: str, value: str, partition: int, pid: int, epoch: int = 0) -> Row:
        self.add("invoke", process, "send", partition=partition, value=value)
        key = (pid, epoch, partition)
        seq = self.sequences.get(key, 0)
        self.sequences[key] = seq + 1
        row = [len(self.log[partition]), value, pid, epoch, seq]
        self.log[partition].append(row)
        self.add(
            "ok",
            process,
            "send",
            partition=partition,
            value=value,
            offset=row[0],
            pid=pid,
            epoch=epoch,
            sequence=seq,
        )
        return row

    def finish(self) -> list[dict[str, Any]]:
        for partition, rows in self.log.items():
            self.add("ok", "c0", "seek", partition=partition, offset=0)
            self.add("ok", "c0", "poll", partition=partition, records=[list(r) for r in rows])
            self.add(
                "ok", "final", "final_read", partition=partition, records=[list(r) for r in rows]
            )
            for node in ("node1", "node2", "node3"):
                self.add(
                    "ok",
                    "final",
                    "replica_log",
                    partition=partition,
                    node=node,
                    records=[list(r) for r in rows],
                )
        return self.events


def clean_story() -> Story:
    s = Story()
    s.add("ok", "p0", "init", pid=10, epoch=0)
    s.add("ok", "p1", "init", pid=11, epoch=0)
    s.add("ok", "t0", "init", pid=20, epoch=0, transactional_id="txn")
    for i in range(6):
        s.send("p0", f"p0-{i}", i % 2, 10)
        s.send("p1", f"p1-{i}", i % 2, 11)
        s.send("t0", f"t0-{i}", i % 2, 20)
    s.add("info", "nemesis", "fault", kind="kill-leader", node="node1", partition=0, phase="start")
    s.send("p0", "p0-6", 0, 10)
    s.add("ok", "t0", "init", pid=20, epoch=1, transactional_id="txn")
    s.send("t0", "t0-new-0", 0, 20, epoch=1)
    s.send("t0", "t0-new-1", 1, 20, epoch=1)
    s.add("invoke", "t0", "send", partition=0, value="t0-zombie")
    s.add("fail", "t0", "send", partition=0, value="t0-zombie", error="INVALID_PRODUCER_EPOCH")
    s.add("ok", "p0", "stats", retries=3, dedup_hits=1)
    return s


def checked(events: list[dict[str, Any]]) -> Report:
    return check([parse_event(e) for e in events])


def kinds_found(report: Report) -> dict[str, int]:
    return {k: n for k, n in report.counts_by_kind.items() if n}


def test_a_clean_history_has_no_anomaly_and_its_figures() -> None:
    report = checked(clean_story().finish())
    assert report.ok, report.summary()
    assert set(report.counts_by_kind) == set(KINDS)
    figures = report.figures
    assert figures["operations"] == {
        "attempted": 22,
        "ok": 21,
        "fail": 1,
        "info": 0,
        "unfinished": 0,
    }
    assert (figures["retries"], figures["dedup_hits"]) == (3, 1)
    assert figures["failed_by_error"] == {"INVALID_PRODUCER_EPOCH": 1}
    assert (
        "  failed: INVALID_PRODUCER_EPOCH x1 (a replaced transactional producer (a zombie) "
        "fenced: expected)"
    ) in report.summary().splitlines()
    assert figures["faults"] == {"kill-leader": 1}
    assert figures["recovery_ms"]["count"] == 1 and figures["recovery_ms"]["median"] == 2.0
    assert figures["final_records"] == {0: 11, 1: 10}
    assert figures["partitions_checked"] == 2


def broken(edit: Callable[[list[dict[str, Any]]], None]) -> Report:
    events = clean_story().finish()
    edit(events)
    return checked(events)


def final_of(events: list[dict[str, Any]], partition: int) -> list[Row]:
    rows: list[Row] = next(
        e["records"] for e in events if e["f"] == "final_read" and e["partition"] == partition
    )
    return rows


def every_view(events: list[dict[str, Any]], partition: int) -> list[list[Row]]:
    return [
        e["records"] for e in events if e.get("records") is not None and e["partition"] == partition
    ]


def test_lost_an_acknowledged_value_missing_from_the_log() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for rows in every_view(events, 1):
            rows.pop()  # the last record of partition 1, from every view

    assert kinds_found(broken(edit)) == {"lost": 1}


def test_duplicate_a_retry_appended_twice() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for rows in every_view(events, 0):
            again = list(rows[2])
            rows.append([len(rows), *again[1:]])

    report = broken(edit)
    assert report.counts_by_kind["duplicate"] == 1
    assert report.anomalies[0].partition == 0
    assert "producer-order" in kinds_found(report)  # the sequence repeats in the log, too
    writer = report.anomalies[0].detail.partition("-")[0]
    assert report.to_json()["figures"]["duplicates_by_writer"] == {writer: 1}


def test_duplicate_the_same_producer_sequence_at_two_offsets() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for rows in every_view(events, 1):
            rows.append([len(rows), "p0-1-copy", *rows[0][2:]])
        events.insert(
            0,
            {
                "type": "invoke",
                "time_ms": 0.5,
                "process": "p0",
                "f": "send",
                "partition": 1,
                "value": "p0-1-copy",
            },
        )

    assert broken(edit).counts_by_kind["duplicate"] == 1


def test_inconsistent_offset_two_views_disagree() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        poll = next(e for e in events if e["f"] == "poll" and e["partition"] == 0)
        poll["records"][3][1] = "p1-4"  # the consumer saw another (real) value there

    assert "inconsistent-offset" in kinds_found(broken(edit))


def test_ack_mismatch_acknowledged_offset_holds_another_value() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        ack = next(e for e in events if e["type"] == "ok" and e.get("value") == "p0-2")
        ack["offset"] = 0

    found = kinds_found(broken(edit))
    assert found["ack-mismatch"] == 1
    assert set(found) <= {"ack-mismatch", "producer-order"}  # its offset also fell below seq 0's


def test_unexpected_a_value_nobody_sent() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for rows in every_view(events, 1):
            rows.append([len(rows), "ghost", -1, -1, -1])

    assert kinds_found(broken(edit)) == {"unexpected": 1}


def test_aborted_read_a_failed_send_in_the_log() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for e in events:
            if e.get("value") == "p1-3" and e["type"] == "ok":
                for name in ("offset", "pid", "epoch", "sequence"):
                    del e[name]
                e.update(type="fail", error="OUT_OF_ORDER_SEQUENCE_NUMBER")

    assert kinds_found(broken(edit)) == {"aborted-read": 1}


def test_producer_order_a_gap_in_a_sessions_sequences() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for rows in every_view(events, 1):
            for row in rows:
                if row[1] == "p0-5":
                    row[4] += 1

    assert kinds_found(broken(edit)) == {"producer-order": 1}


def test_producer_order_offsets_fall_as_sequences_rise() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for e in events:
            if e["type"] == "ok" and e.get("value") in ("p1-0", "p1-2"):
                e["sequence"] = 1 if e["value"] == "p1-0" else 0

    assert "producer-order" in kinds_found(broken(edit))


@pytest.mark.parametrize("jump", [2, -2])
def test_consumer_order_a_skip_or_a_step_back(jump: int) -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        poll = next(e for e in events if e["f"] == "poll" and e["partition"] == 1)
        rows = poll["records"]
        poll["records"] = rows[:4] + rows[4 + jump :] if jump > 0 else rows[:4] + rows[2:]

    report = broken(edit)
    assert kinds_found(report) == {"consumer-order": 1}
    assert ("skipped" if jump > 0 else "went back") in report.anomalies[0].detail


def test_replica_divergence_a_replica_holds_another_value() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        log = next(e for e in events if e["f"] == "replica_log" and e["node"] == "node2")
        log["records"][1] = [1, "p0-0", 10, 0, 0]

    assert "replica-divergence" in kinds_found(broken(edit))


def test_replica_divergence_a_hole_in_a_replica_log() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        log = next(e for e in events if e["f"] == "replica_log" and e["node"] == "node3")
        del log["records"][2]

    assert kinds_found(broken(edit)) == {"replica-divergence": 1}


def test_fenced_write_an_old_epoch_acked_after_the_new_one_reached_the_partition() -> None:
    events = clean_story()
    events.send("t0", "t0-late", 0, 20, epoch=0)  # the zombie, after epoch 1 wrote there
    report = checked(events.finish())
    found = kinds_found(report)
    assert found.pop("fenced-write") == 2  # the acknowledgement, and the record in the log
    assert found == {}


def test_a_zombie_write_before_the_new_epoch_reached_that_partition_is_fine() -> None:
    s = Story()
    s.add("ok", "t0", "init", pid=20, epoch=0, transactional_id="txn")
    s.send("t0", "old-0", 0, 20)
    s.add("ok", "t0", "init", pid=20, epoch=1, transactional_id="txn")
    s.send("t0", "old-1", 1, 20)  # partition 1 has not heard of epoch 1 yet: accepted
    s.send("t0", "new-0", 1, 20, epoch=1)
    assert checked(s.finish()).ok


def test_summary_and_json_name_the_anomaly(tmp_path: Path) -> None:
    events = clean_story().finish()
    for rows in every_view(events, 1):
        rows.pop()
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as history:
        for e in events:
            history.write(e)
    report = check_file(path)
    assert "ANOMALIES FOUND" in report.summary() and "lost" in report.summary()
    document = json.loads(json.dumps(report.to_json()))
    assert document["anomalies_by_kind"]["lost"] == 1 and document["ok"] is False


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        json.dumps({"type": "ok", "time_ms": 1, "process": "p", "f": "send", "partition": 0}),
        json.dumps({"type": "maybe", "time_ms": 1, "process": "p", "f": "stats"}),
        json.dumps({"type": "ok", "time_ms": 1, "process": "p", "f": "teleport"}),
        json.dumps({"type": "ok", "time_ms": 1, "process": "p", "f": "stats", "retries": "3"}),
        json.dumps(
            {
                "type": "ok",
                "time_ms": 1,
                "process": "c",
                "f": "poll",
                "partition": 0,
                "records": [[0, "v", 1, 0]],
            }
        ),
    ],
)
def test_a_malformed_line_is_an_error_naming_the_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "history.jsonl"
    good = json.dumps({"type": "ok", "time_ms": 0, "process": "p", "f": "stats"})
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(HistoryError, match="line 2"):
        read_history(path)


def test_ack_mismatch_a_resent_batch_answered_with_other_offsets() -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        ack = next(e for e in events if e["type"] == "ok" and e.get("value") == "p1-1")
        ack["resent_offset"] = ack["offset"] + 7  # a retry the broker appended again

    assert kinds_found(broken(edit)) == {"ack-mismatch": 1}


def test_dedup_hits_count_a_duplicate_batch_once() -> None:
    events = clean_story().finish()
    for e in events:
        if e["type"] == "ok" and e.get("value") in ("p0-1", "p1-1"):
            e["duplicate"] = True  # records of a batch the producer's stats already counted
        if e["type"] == "ok" and e.get("value") == "t0-1":
            e.update(duplicate=True, resent_offset=e["offset"])  # a resend answered alike
    assert checked(events).figures["dedup_hits"] == 1 + 1


# -- what Kafka clients report, and sends acknowledged without their session -------------------


def with_client_events(*extra: dict[str, Any]) -> Report:
    s = clean_story()
    for e in extra:
        s.add("info", e.pop("process", "p0"), e.pop("f"), **e)
    return checked(s.finish())


def log_line(level: int, facility: str, message: str) -> dict[str, Any]:
    return {"f": "client_log", "level": level, "facility": facility, "message": message}


def client_error(name: str, reason: str, *, fatal: bool = False) -> dict[str, Any]:
    return {"f": "client_error", "error": name, "reason": reason, "fatal": fatal}


@pytest.mark.parametrize(
    "event",
    [
        client_error("_FATAL", "Producer fenced by newer instance", fatal=True),
        client_error("_INCONSISTENT", "Fatal idempotence error (not fatal: said anyway)"),
        log_line(40, "FATAL", "Fatal error: Broker: Out of order sequence number"),
        log_line(30, "PROTOERR", "Protocol parse failure for Fetch v12(flex) at 55/117"),
        log_line(40, "PROTOERR", "chaos [0]: invalid MessageSetSize -1"),
        log_line(30, "PRODUCE", "ProduceRequest failed: UNKNOWN_PRODUCER_ID: epoch bump"),
    ],
)
def test_client_error_a_kafka_clients_alarm(event: dict[str, Any]) -> None:
    report = with_client_events(event)
    assert kinds_found(report) == {"client-error": 1}
    assert report.anomalies[0].partition is None
    assert "client: p0 " in report.summary()


@pytest.mark.parametrize(
    "event",
    [
        client_error("_TRANSPORT", "127.0.0.2:9092/1: Connect failed: Connection refused"),
        log_line(40, "FAIL", "127.0.0.2:9092/1: Disconnected: connection reset by peer"),
        log_line(20, "EOS", "sequence 17 acknowledged"),  # below WARNING: not an alarm
        log_line(
            30,
            "GETPID",
            "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.3:9092/2: "
            "Broker: Coordinator load in progress: retrying",
        ),
    ],
)
def test_a_kafka_clients_ordinary_complaints_are_no_anomaly(event: dict[str, Any]) -> None:
    report = with_client_events(event)
    assert report.ok, report.summary()
    client = report.figures["client"]
    assert client["errors"] + client["log_lines"] == 1 and client["fatal"] == 0
    assert "Kafka clients: " in report.summary()


def test_a_native_run_says_nothing_of_kafka_clients() -> None:
    report = checked(clean_story().finish())
    assert report.figures["client"] == {"errors": 0, "fatal": 0, "log_lines": 0}
    assert "Kafka clients" not in report.summary()


def kafka_story(offsets: list[int]) -> list[dict[str, Any]]:
    """A Kafka client's sends (no pid, epoch or sequence), acknowledged at `offsets`."""
    s = Story()
    s.add("ok", "k0", "init", pid=-1, epoch=-1)
    for i, offset in enumerate(offsets):
        s.add("invoke", "k0", "send", partition=0, value=f"k0-{i}")
        s.log[0].append([offset, f"k0-{i}", 50, 0, offset])  # the log knows the session
    for i, offset in enumerate(offsets):
        fields = {"offset": offset, "pid": -1, "epoch": -1, "sequence": -1}
        s.add("ok", "k0", "send", partition=0, value=f"k0-{i}", **fields)
    s.log[0].sort()
    return s.finish()


def test_sends_without_their_session_acked_in_the_order_sent() -> None:
    assert checked(kafka_story([0, 1, 2, 3])).ok


def test_producer_order_sends_without_their_session_acked_out_of_order() -> None:
    report = checked(kafka_story([0, 2, 1, 3]))
    assert kinds_found(report) == {"producer-order": 1}
    assert "k0: k0-1 acked at 2, then k0-2 (sent after it) at 1" in report.anomalies[0].detail


def test_client_events_must_be_well_formed() -> None:
    good = {"type": "info", "time_ms": 1, "process": "p0"}
    parse_event({**good, **client_error("_FATAL", "x", fatal=True)})
    with pytest.raises(HistoryError, match="fatal"):
        parse_event({**good, **client_error("_FATAL", "x"), "fatal": 1})
    with pytest.raises(HistoryError, match="level"):
        parse_event({**good, **log_line(40, "FAIL", "x"), "level": True})


# -- the consumer group ---------------------------------------------------------------------------


def group_story() -> list[dict[str, Any]]:
    """Two members: g0 holds both partitions in generation 1 and commits what it read of
    partition 0, then generation 2 splits them and g1 reads partition 1 again from the start
    (g0 never committed it): read again after a rebalance, no anomaly. The group drains."""
    s = clean_story()
    events = s.finish()
    s.add("ok", "g0", "assigned", group="g", member="m0", generation=1, partitions=[0, 1])
    head0 = [list(r) for r in s.log[0][:4]]
    s.add("ok", "g0", "group_poll", group="g", member="m0", generation=1, partition=0,
          records=head0)  # fmt: skip
    s.add("ok", "g0", "group_poll", group="g", member="m0", generation=1, partition=1,
          records=[list(r) for r in s.log[1][:2]])  # fmt: skip
    s.add("ok", "g0", "commit", group="g", member="m0", generation=1, offsets=[[0, 4]], error="")
    s.add("ok", "w0", "committed", group="g", offsets=[[0, 4]])
    s.add("ok", "g0", "assigned", group="g", member="m0", generation=2, partitions=[0])
    s.add("ok", "g1", "assigned", group="g", member="m1", generation=2, partitions=[1])
    s.add("ok", "g0", "group_poll", group="g", member="m0", generation=2, partition=0,
          records=[list(r) for r in s.log[0][4:]])  # fmt: skip
    s.add("ok", "g1", "group_poll", group="g", member="m1", generation=2, partition=1,
          records=[list(r) for r in s.log[1]])  # fmt: skip
    s.add("ok", "w0", "committed", group="g", offsets=[[0, 11], [1, 10]])
    s.add("ok", "runner", "group_drain", group="g", ends=[[0, 11], [1, 10]])
    return events


def test_a_group_that_reads_everything_once_per_generation_is_clean() -> None:
    report = checked(group_story())
    assert report.ok, report.summary()
    group = report.figures["group"]
    assert (group["members"], group["generations"], group["records_read"]) == (2, 2, 21)
    assert group["read_again"] == 2 and group["drained"] is True
    assert "consumer group: 2 members, 2 generations, 21 records read (2 again" in (
        report.summary()
    )


def polls_of(events: list[dict[str, Any]], member: str, generation: int, partition: int) -> Row:
    return next(
        e["records"]
        for e in events
        if e["f"] == "group_poll"
        and (e["member"], e["generation"], e["partition"]) == (member, generation, partition)
    )


def test_group_owned_twice_one_partition_two_members_one_generation() -> None:
    events = group_story()
    g0 = next(e for e in events if e["f"] == "assigned" and e["generation"] == 2)
    g0["partitions"] = [0, 1]  # g0 says it holds partition 1 in generation 2, as g1 does
    assert kinds_found(checked(events)) == {"group-owned-twice": 1}


def test_group_commit_backwards_a_commit_read_lower_later() -> None:
    events = group_story()
    later = events[-1]["time_ms"] - 0.5  # after the read of 11, before the drain
    events.append({"type": "ok", "time_ms": later, "process": "w0", "f": "committed",
                   "group": "g", "offsets": [[0, 3]]})  # fmt: skip
    assert kinds_found(checked(events)) == {"group-commit-backwards": 1}


def test_group_lost_a_record_no_member_read() -> None:
    events = group_story()
    for member, generation in (("m0", 1), ("m1", 2)):  # offset 0 of partition 1, read by none
        rows = polls_of(events, member, generation, 1)
        rows[:] = [r for r in rows if r[0] != 0]
    assert kinds_found(checked(events)) == {"group-lost": 1}


def test_group_order_a_record_delivered_again_without_a_rebalance() -> None:
    events = group_story()
    rows = polls_of(events, "m0", 2, 0)
    rows.insert(1, rows[0])  # offset 4 twice in one generation
    assert kinds_found(checked(events)) == {"group-order": 1}


def test_a_run_without_a_group_has_no_group_figures() -> None:
    report = checked(clean_story().finish())
    assert report.figures["group"] is None
    assert "consumer group" not in report.summary()
