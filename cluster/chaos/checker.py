"""The chaos checker: every way a broker has been caught losing, duplicating or reordering.

Role: a pure function from a history (`history.py`) to a `Report`: anomalies by kind, and the
figures of the run. The final read of each partition (after healing) is the authoritative log;
polls and replica dumps are further observations that must agree with it.

Kinds (each instance reported with what it concerns; at most `EXAMPLES_MAX` kept per kind, all
counted):
- lost: acknowledged, absent from the final read;
- duplicate: one value at two offsets, or one (pid, epoch, sequence) at two offsets;
- inconsistent-offset: one offset observed holding two values;
- ack-mismatch: the final read holds another value at an acknowledged offset;
- unexpected: a value nobody sent;
- aborted-read: a value whose send definitely failed, observed anyway;
- producer-order: within a session (pid, epoch) offsets do not rise with sequence, or the log
  holds its sequences with a gap or out of order; for sends acknowledged without their session
  (a Kafka client does not tell it), a process's offsets in a partition do not rise in the
  order it sent them (what an idempotent producer promises, as its sequences would show);
- consumer-order: a consumer's successive records are not at successive offsets;
- replica-divergence: two replicas (or a replica and the final read) disagree at an offset, or a
  replica's log is not contiguous;
- raft-applied-truncation: a replica of some Raft group (any partition's, the metadata's, a
  coordinator's) deleted entries it had applied: it had applied what its group did not commit,
  or lost what it acknowledged (a power cut without fsync), so replicas may disagree on state
  no final read shows;
- fenced-write: a session of a transactional id wrote to a partition after a newer session of
  that id reached it (the partition learns of a new epoch with that epoch's first batch there,
  as in Kafka without transactions);
- client-error: a Kafka client, as strict an oracle as the checker, said something broke: a
  fatal error, or an error or a log line (WARNING or worse) about sequences, epochs, a fenced
  or unknown producer, idempotence, or an answer it could not parse (`CLIENT_ALARM`;
  librdkafka says these when a broker breaks the protocol or its idempotence rules). Its
  waiting for a producer id ("Failed to acquire ... PID ...: retrying", as after a
  COORDINATOR_LOAD_IN_PROGRESS) is not one: a broker may answer so while it starts;
- group-owned-twice: two members of the consumer group held one partition in one generation;
- group-commit-backwards: the group's committed offset of a partition, read again, went back;
- group-lost: a record the group should have read (below the end it drained to) that no member
  read;
- group-order: within one generation a member's successive records of a partition are not at
  successive offsets (a record skipped, or delivered again without a rebalance);
- the transactions' kinds (txn-lost, txn-aborted-read, txn-torn, txn-duplicate,
  txn-dirty-read, lso-backwards, txn-hanging, ctp-not-exactly-once): txn_checker.py.
A record delivered again after a rebalance is no anomaly (uncommitted work is redone, at least
once): the figures count them.
"""

from __future__ import annotations

import itertools
import logging
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.chaos.history import Event, Record, read_history
from cluster.chaos.report import KINDS, Anomaly, Report
from cluster.chaos.txn_checker import check_transactions
from statemachine.records import SEQUENCE_MODULUS

EXAMPLES_MAX = 100
RECOVERY_FAULTS = ("kill-leader", "kill-meta-leader")
# What a Kafka client says when a broker broke idempotence or the protocol (librdkafka: "Fatal
# error", "out of order sequence number", "UNKNOWN_PRODUCER_ID", "Producer fenced by newer
# instance", "Protocol parse failure" under facility PROTOERR, ...).
CLIENT_ALARM = re.compile(
    r"fatal|out.of.order|sequence|idempoten|unknown.producer|fenced|producer.epoch"
    r"|protoerr|protocol parse",
    re.IGNORECASE,
)
CLIENT_RETRYING = re.compile(r"Failed to acquire \w+ PID from broker .*: retrying$")
CLIENT_LOG_LEVEL_MIN = logging.WARNING


def check_file(path: Path) -> Report:
    return check(read_history(path))


def check(events: Sequence[Event]) -> Report:
    history = _History(events)
    found = _Found()
    for partition in history.partitions():
        _check_partition(history, partition, found)
    _check_fencing(history, found)
    _check_clients(history, found)
    _check_group(history, found)
    for e in history.truncations:
        found.add("raft-applied-truncation", None, f"{e.get('node')}: {e.get('line')}")
    figures = _figures(history)
    transactions = check_transactions(events, found.add)
    if transactions:
        figures["transactions"] = transactions
    # Every duplicated value counted by its writer (the value's prefix, `s0` for the sink),
    # whatever the cap on examples: a control can ask which writers it duplicated.
    figures["duplicates_by_writer"] = dict(sorted(found.duplicates_by_writer.items()))
    return Report(tuple(found.examples), dict(found.counts), figures)


@dataclass(slots=True)
class _Found:
    counts: Counter[str] = field(default_factory=lambda: Counter(dict.fromkeys(KINDS, 0)))
    examples: list[Anomaly] = field(default_factory=list)
    duplicates_by_writer: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, partition: int | None, detail: str) -> None:
        assert kind in KINDS, kind
        self.counts[kind] += 1
        if self.counts[kind] <= EXAMPLES_MAX:
            self.examples.append(Anomaly(kind, partition, detail))


class _History:
    """The history indexed for the checks."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = sorted(events, key=lambda e: e.time_ms)
        self.invoked: dict[str, Event] = {}
        self.outcome: dict[str, Event] = {}
        self.final: dict[int, list[Record]] = {}
        self.replicas: dict[int, dict[str, list[Record]]] = defaultdict(dict)
        self.observed: list[tuple[str, int, Record]] = []  # (source, partition, record)
        self.sent_order: dict[str, int] = {}  # value -> its invoke's place in the history
        self.client: list[Event] = []  # what Kafka clients reported and logged
        self.truncations: list[Event] = []  # the nodes' Raft replicas' (`raft_truncation`)
        for e in self.events:
            self._index(e)
        self._acked: dict[int, list[Event]] = defaultdict(list)  # ok sends, by partition
        for e in self.outcome.values():
            if e.type == "ok" and e.partition is not None:
                self._acked[e.partition].append(e)

    def _index(self, e: Event) -> None:
        if e.f == "send":
            value = e.get("value")
            if e.type == "invoke":
                self.sent_order[value] = len(self.sent_order)
            (self.invoked if e.type == "invoke" else self.outcome)[value] = e
        elif e.f in ("client_error", "client_log"):
            self.client.append(e)
        elif e.f == "raft_truncation":
            self.truncations.append(e)
        elif e.f == "final_read":
            assert e.partition is not None
            self.final[e.partition] = sorted(e.records)
            self.observed += [("final read", e.partition, r) for r in e.records]
        elif e.f == "replica_log":
            assert e.partition is not None
            self.replicas[e.partition][e.get("node")] = e.records
            self.observed += [(f"{e.get('node')} log", e.partition, r) for r in e.records]
        elif e.f in ("poll", "group_poll"):
            assert e.partition is not None
            self.observed += [(f"{e.process} {e.f}", e.partition, r) for r in e.records]

    def partitions(self) -> list[int]:
        sent = {e.partition for e in self.invoked.values() if e.partition is not None}
        return sorted(sent | set(self.final) | set(self.replicas))

    def acked(self, partition: int) -> list[Event]:
        return self._acked.get(partition, [])


def _check_partition(h: _History, partition: int, found: _Found) -> None:
    final = h.final.get(partition, [])
    by_offset = {r.offset: r for r in final}
    values_in_final = Counter(r.value for r in final)
    acked = h.acked(partition)
    for e in acked:
        value, offset = e.get("value"), e.get("offset")
        if value not in values_in_final:
            found.add("lost", partition, f"{value} acknowledged at offset {offset}")
        elif e.get("resent_offset", offset) != offset:
            found.add(
                "ack-mismatch",
                partition,
                f"{value} acked at {offset}, its resend at {e.get('resent_offset')}",
            )
        elif offset in by_offset and by_offset[offset].value != value:
            found.add(
                "ack-mismatch",
                partition,
                f"{value} acked at {offset}, log holds {by_offset[offset].value}",
            )
    _check_duplicates(final, partition, found)
    _check_observations(h, partition, found)
    _check_producer_order(acked, final, partition, found)
    _check_send_order(h, acked, partition, found)
    _check_consumers(h, partition, found)
    _check_replicas(h, partition, final, found)


def _check_duplicates(final: list[Record], partition: int, found: _Found) -> None:
    offsets: dict[str, list[int]] = defaultdict(list)
    triples: dict[tuple[int, int, int], list[Record]] = defaultdict(list)
    for r in final:
        offsets[r.value].append(r.offset)
        if r.pid >= 0 and r.sequence >= 0:
            triples[(r.pid, r.epoch, r.sequence)].append(r)
    for value, at in offsets.items():
        if len(at) > 1:
            found.add("duplicate", partition, f"{value} at offsets {at}")
            found.duplicates_by_writer[value.partition("-")[0]] += 1
    for (pid, epoch, seq), records in triples.items():
        if len({r.value for r in records}) > 1:  # the same value twice is reported above
            at = [r.offset for r in records]
            found.add("duplicate", partition, f"pid {pid} epoch {epoch} seq {seq} at {at}")


def _check_observations(h: _History, partition: int, found: _Found) -> None:
    values_at: dict[int, dict[str, str]] = defaultdict(dict)
    reported: set[str] = set()
    for source, p, r in h.observed:
        if p != partition:
            continue
        values_at[r.offset].setdefault(r.value, source)
        send = h.outcome.get(r.value)
        if r.value not in h.invoked and r.value not in reported:
            reported.add(r.value)
            found.add("unexpected", partition, f"{r.value} at {r.offset} ({source})")
        elif send is not None and send.type == "fail" and r.value not in reported:
            reported.add(r.value)
            found.add(
                "aborted-read",
                partition,
                f"{r.value} failed ({send.get('error')}) but is at {r.offset} ({source})",
            )
    for offset, values in sorted(values_at.items()):
        if len(values) > 1:
            seen = ", ".join(f"{v} ({s})" for v, s in values.items())
            found.add("inconsistent-offset", partition, f"offset {offset}: {seen}")


def _check_producer_order(
    acked: list[Event], final: list[Record], partition: int, found: _Found
) -> None:
    sessions: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in acked:
        if e.get("pid") >= 0 and e.get("sequence") >= 0:
            sessions[(e.get("pid"), e.get("epoch"))].append((e.get("sequence"), e.get("offset")))
    for (pid, epoch), pairs in sessions.items():
        pairs.sort()
        for (s1, o1), (s2, o2) in itertools.pairwise(pairs):
            if o2 <= o1:
                found.add(
                    "producer-order",
                    partition,
                    f"pid {pid} epoch {epoch}: seq {s1} acked at {o1}, seq {s2} at {o2}",
                )
    last: dict[tuple[int, int], Record] = {}
    for r in final:
        if r.pid < 0 or r.sequence < 0:
            continue
        before = last.get((r.pid, r.epoch))
        if before is not None and r.sequence != (before.sequence + 1) % SEQUENCE_MODULUS:
            found.add(
                "producer-order",
                partition,
                f"pid {r.pid} epoch {r.epoch}: seq "
                f"{before.sequence} at {before.offset}, then {r.sequence} at {r.offset}",
            )
        last[(r.pid, r.epoch)] = r


def _check_send_order(h: _History, acked: list[Event], partition: int, found: _Found) -> None:
    """Sends acknowledged without their session (pid -1) but with an offset: per process, the
    offsets rise in the order it sent them."""
    sent: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for e in acked:
        value = e.get("value")
        if e.get("pid") < 0 and e.get("offset") >= 0 and value in h.sent_order:
            sent[e.process].append((h.sent_order[value], e.get("offset"), value))
    for process, ordered in sent.items():
        ordered.sort()
        for (_, o1, v1), (_, o2, v2) in itertools.pairwise(ordered):
            if o2 <= o1:
                found.add(
                    "producer-order",
                    partition,
                    f"{process}: {v1} acked at {o1}, then {v2} (sent after it) at {o2}",
                )


def _check_consumers(h: _History, partition: int, found: _Found) -> None:
    expected: dict[str, int | None] = {}
    for e in h.events:
        if e.partition != partition:
            continue
        if e.f == "seek":
            expected[e.process] = e.get("offset")
        elif e.f == "poll":
            for r in e.records:
                want = expected.get(e.process)
                if want is not None and r.offset != want:
                    what = "skipped to" if r.offset > want else "went back to"
                    found.add(
                        "consumer-order",
                        partition,
                        f"{e.process} expected offset {want}, {what} {r.offset}",
                    )
                expected[e.process] = r.offset + 1


def _check_replicas(h: _History, partition: int, final: list[Record], found: _Found) -> None:
    logs = {"final read": final, **h.replicas.get(partition, {})}
    for name, records in logs.items():
        for before, after in itertools.pairwise(records):
            if after.offset != before.offset + 1:
                found.add(
                    "replica-divergence",
                    partition,
                    f"{name}: offset {before.offset} then {after.offset}",
                )
                break
    names = sorted(logs)
    maps = {n: {r.offset: r.value for r in logs[n]} for n in names}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for offset in sorted(maps[a].keys() & maps[b].keys()):
                if maps[a][offset] != maps[b][offset]:
                    found.add(
                        "replica-divergence",
                        partition,
                        f"offset {offset}: {a} has {maps[a][offset]}, {b} has {maps[b][offset]}",
                    )
                    break


def _check_fencing(h: _History, found: _Found) -> None:
    """Per transactional id: nothing from an older session lands after a newer one's first."""
    sessions: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in h.events:
        txn = e.get("transactional_id")
        if e.f == "init" and txn:
            sessions[txn].append((e.get("pid"), e.get("epoch")))
    for chain in sessions.values():
        rank = {s: i for i, s in enumerate(chain)}
        _fenced_sends(h, rank, found)
        for partition, final in h.final.items():
            _fenced_in_log(final, rank, partition, found)


def _fenced_sends(h: _History, rank: dict[tuple[int, int], int], found: _Found) -> None:
    first_ack: dict[tuple[int, int], float] = {}  # (rank, partition) -> time of the first ok
    oks = [
        e for e in h.outcome.values() if e.type == "ok" and (e.get("pid"), e.get("epoch")) in rank
    ]
    for e in sorted(oks, key=lambda e: e.time_ms):
        first_ack.setdefault((rank[(e.get("pid"), e.get("epoch"))], e.get("partition")), e.time_ms)
    # (rank, partition) -> when a newer session first reached that partition: once, not per send
    fenced_at: dict[tuple[int, int], float] = {}
    for r, p in first_ack:
        newer = [t for (r2, p2), t in first_ack.items() if r2 > r and p2 == p]
        if newer:
            fenced_at[(r, p)] = min(newer)
    for e in oks:
        fence = fenced_at.get((rank[(e.get("pid"), e.get("epoch"))], e.get("partition")))
        if fence is not None and h.invoked[e.get("value")].time_ms > fence:
            found.add(
                "fenced-write",
                e.partition,
                f"{e.get('value')} from epoch {e.get('epoch')}"
                f" acked after a newer session wrote to the partition",
            )


def _fenced_in_log(
    final: list[Record], rank: dict[tuple[int, int], int], partition: int, found: _Found
) -> None:
    newest = -1
    for r in final:
        mine = rank.get((r.pid, r.epoch))
        if mine is None:
            continue
        if mine < newest:
            found.add(
                "fenced-write",
                partition,
                f"{r.value} of fenced epoch {r.epoch} at "
                f"{r.offset}, after a newer session's record",
            )
        newest = max(newest, mine)


def _check_clients(h: _History, found: _Found) -> None:
    for e in h.client:
        if e.f == "client_error":
            said = f"{e.get('error')}: {e.get('reason')}"
            alarm = e.get("fatal") or CLIENT_ALARM.search(said)
            what = ("fatal error " if e.get("fatal") else "error ") + said
        else:
            said = f"{e.get('facility')} {e.get('message')}"
            alarm = (
                e.get("level") >= CLIENT_LOG_LEVEL_MIN
                and CLIENT_ALARM.search(said)
                and not CLIENT_RETRYING.search(said)
            )
            what = f"logged {logging.getLevelName(e.get('level'))} {said}"
        if alarm:
            found.add("client-error", None, f"{e.process} {what}")


def _check_group(h: _History, found: _Found) -> None:
    owners: dict[tuple[int, int], str] = {}  # (generation, partition) -> member
    last_committed: dict[int, int] = {}
    expected: dict[tuple[str, int, int | None], int] = {}  # (member, generation, partition)
    for e in h.events:
        if e.f == "assigned":
            generation, member = e.get("generation"), e.get("member")
            for p in e.get("partitions"):
                other = owners.setdefault((generation, p), member)
                if other != member:
                    found.add("group-owned-twice", p, f"generation {generation}: {other}, {member}")
        elif e.f == "committed":
            for p, offset in e.get("offsets"):
                if offset < last_committed.get(p, -1):
                    found.add(
                        "group-commit-backwards", p, f"read {last_committed[p]}, then {offset}"
                    )
                last_committed[p] = max(offset, last_committed.get(p, -1))
        elif e.f == "group_poll":
            for r in e.records:
                key = (e.get("member"), e.get("generation"), e.partition)
                want = expected.get(key)
                if want is not None and r.offset != want:
                    found.add(
                        "group-order",
                        e.partition,
                        f"{e.process} generation {key[1]}: expected {want}, read {r.offset}",
                    )
                expected[key] = r.offset + 1
    _check_group_read_everything(h, found)


def _check_group_read_everything(h: _History, found: _Found) -> None:
    drains = [e for e in h.events if e.f == "group_drain"]
    if not drains:
        return
    read = {(e.partition, r.offset) for e in h.events if e.f == "group_poll" for r in e.records}
    for p, end in drains[-1].get("ends"):
        missed = [r for r in h.final.get(p, []) if r.offset < end and (p, r.offset) not in read]
        for r in missed:
            found.add("group-lost", p, f"{r.value} at {r.offset}: no member read it")


def _group_figures(h: _History) -> dict[str, Any] | None:
    polls = [e for e in h.events if e.f == "group_poll"]
    if not any(e.f == "assigned" for e in h.events):
        return None
    deliveries = Counter((e.partition, r.offset) for e in polls for r in e.records)
    commits = Counter(e.type for e in h.events if e.f == "commit")
    drains = [e for e in h.events if e.f == "group_drain"]
    return {
        "members": len({e.process for e in h.events if e.f == "assigned"}),
        "generations": len({e.get("generation") for e in h.events if e.f == "assigned"}),
        "records_read": len(deliveries),
        "read_again": sum(n - 1 for n in deliveries.values()),
        "commits": {kind: commits[kind] for kind in ("ok", "fail", "info")},
        "drained": bool(drains) and drains[-1].type == "ok",
    }


def _figures(h: _History) -> dict[str, Any]:
    outcomes = Counter(e.type for e in h.outcome.values())
    faults = Counter(
        e.get("kind") for e in h.events if e.f == "fault" and e.get("phase", "start") == "start"
    )
    recovery = _recovery_ms(h)
    return {
        "operations": {
            "attempted": len(h.invoked),
            "ok": outcomes["ok"],
            "fail": outcomes["fail"],
            "info": outcomes["info"],
            "unfinished": len(h.invoked.keys() - h.outcome.keys()),
        },
        "failed_by_error": dict(
            Counter(str(e.get("error")) for e in h.outcome.values() if e.type == "fail")
        ),
        "retries": sum(e.get("retries", 0) for e in h.events if e.f == "stats"),
        # Producers' own counts (per batch), plus the resends answered with their original
        # offsets (a producer's records also say `duplicate`: counting those would count twice).
        "dedup_hits": sum(e.get("dedup_hits", 0) for e in h.events if e.f == "stats")
        + sum(
            1
            for e in h.outcome.values()
            if e.type == "ok" and e.get("resent_offset", -1) == e.get("offset") >= 0
        ),
        "client": {
            "errors": sum(e.f == "client_error" for e in h.client),
            "fatal": sum(e.f == "client_error" and e.get("fatal") is True for e in h.client),
            "log_lines": sum(e.f == "client_log" for e in h.client),
        },
        "faults": dict(faults),
        "final_records": {p: len(rs) for p, rs in sorted(h.final.items())},
        "recovery_ms": {
            "count": len(recovery),
            "median": statistics.median(recovery) if recovery else None,
            "max": max(recovery) if recovery else None,
        },
        "longest_write_gap_ms": {p: _longest_gap(h.acked(p)) for p in h.partitions()},
        "partitions_checked": len(h.partitions()),
        "group": _group_figures(h),
    }


def _recovery_ms(h: _History) -> list[float]:
    """For each kill: until the first acknowledgement of a send issued after it (a reply that
    was already on its way when the node died does not show that writes resumed)."""
    oks = sorted(
        (e.time_ms, h.invoked[e.get("value")].time_ms, e.partition)
        for e in h.outcome.values()
        if e.type == "ok" and e.get("value") in h.invoked
    )
    out = []
    for e in h.events:
        if e.f != "fault" or e.get("kind") not in RECOVERY_FAULTS or e.get("phase") != "start":
            continue
        want = e.partition if e.get("kind") == "kill-leader" else None
        after = (t for t, issued, p in oks if issued > e.time_ms and (want is None or p == want))
        first = next(after, None)
        if first is not None:
            out.append(round(first - e.time_ms, 1))
    return out


def _longest_gap(acked: Iterable[Event]) -> float | None:
    times = sorted(e.time_ms for e in acked)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return round(max(gaps), 1) if gaps else None
