"""Consumer groups: librdkafka consumers in a raftbroker group and in an Apache Kafka one, beside
JetStream pull consumers.

Role: the measured answer to issue 23's speed section. Run it as `python -m bench.groups
[--quick] [--out FILE]`; one JSON object on stdout (progress on stderr); exit 1 if a case
failed (a slow result is a result). Each side gets a fresh 3-node cluster per case, as in
`bench.kafka` and `bench.jetstream`, and every member is a process of its own
(`bench.group_member`), so a crash is a real SIGKILL.

raftbroker, and Apache Kafka (`bench.kafka.fresh_brokers`: the same 3 KRaft nodes as
`bench.kafka --broker apache-kafka`, its new-group rebalance delay 0), the same case on each: a
topic of 4 partitions (replication 3); a group of 3 confluent-kafka consumers
(librdkafka, Kafka's range assignor, eager rebalances), `session.timeout.ms` 6,000 (Kafka's
smallest by default, `group.min.session.timeout.ms`) and `heartbeat.interval.ms` 2,000 (a
third of it, as Kafka advises), auto-commit at the client's default.

JetStream: one stream (3 replicas), one durable pull consumer with explicit acks and
`ack_wait` 6 s (the session timeout's counterpart: how long a crashed member's work waits),
and 3 processes pulling from it. JetStream has no partitions to own: its members share one
consumer, so what a crash holds up is the batch it fetched and had not acknowledged, not a
partition. Each member acknowledges a batch when it has fetched the next, as auto-commit
commits at the next poll.

Cases:
- throughput: the topic (stream) filled first (kcat for raftbroker, `publish_async` for
  JetStream, as in the other benchmarks), then the 3 members start and read it all:
  records/s from the group's first record read to its last (each member counts only), and
  the seconds from starting the members to the first record.
- crash: records produced steadily (one every 2 ms); once the group is stable (every
  partition assigned and read by its owner since), the oldest member is SIGKILLed, and the
  time is taken from the kill until each partition it owned is read by another member
  (JetStream: until every message it held unacknowledged has been delivered to another
  member); then a new member joins and the group settles before the next kill. Median and
  max over the kills.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from nats.js import api as js_api

from bench import apply as apply_bench
from bench import jetstream_servers
from bench.harness import emit, poll_until, reporter, run_loop, value_of
from bench.jetstream_scenarios import FETCH_BATCH, Steady, pipelined_load, steady_publisher
from bench.kafka import Failures, fresh_brokers, kcat_produce, producer_config

PARTITIONS = 4
MEMBERS = 3
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_INTERVAL_MS = 2_000
ACK_WAIT_S = SESSION_TIMEOUT_MS / 1000
STEADY_INTERVAL_S = 0.002
JETSTREAM_CRASH_BATCH = 100
MAX_ACK_PENDING = 50_000
READ_TIMEOUT_S = 180.0
SETTLE_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
DURABLE = "group"


progress = reporter("bench.groups")


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    kafka_fill_records: int
    jetstream_fill_s: float
    kills: int

    @classmethod
    def of(cls, quick: bool) -> Settings:
        if quick:
            return cls(True, 300_000, 2.0, 1)
        return cls(False, 2_000_000, 10.0, 5)


# -- members and what they report ------------------------------------------------------------------


@dataclass(slots=True)
class Member:
    name: str
    process: asyncio.subprocess.Process
    started: float
    assigned: tuple[int, ...] = ()
    assigned_at: float = -1.0
    last_read: float = -1.0
    unacked: set[int] = field(default_factory=set)
    killed: bool = False


@dataclass(slots=True)
class Group:
    """Member processes (read by one pump task each, in the caller's TaskGroup) and what
    they reported: counts, and per partition (kafka) or seq (jetstream) who read it when."""

    argv: list[str]
    tasks: asyncio.TaskGroup
    members: list[Member] = field(default_factory=list)
    records: int = 0
    first_read: float | None = None
    last_read: float = -1.0
    partition_reads: dict[int, list[tuple[float, str]]] = field(default_factory=dict)
    seq_reads: dict[int, list[tuple[float, str]]] = field(default_factory=dict)
    # kafka: past the last offset read, per partition; on a new topic their sum is how many
    # distinct records were read (records read again after a rebalance count once)
    next_offsets: dict[int, int] = field(default_factory=dict)

    def distinct_records(self) -> int:
        return sum(self.next_offsets.values()) if self.next_offsets else self.records

    async def start(self) -> Member:
        process = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, start_new_session=True
        )
        member = Member(f"m{len(self.members) + 1}", process, time.monotonic())
        self.members.append(member)
        self.tasks.create_task(self._pump(member))
        return member

    def live(self) -> list[Member]:
        return [m for m in self.members if not m.killed]

    async def _pump(self, member: Member) -> None:
        assert member.process.stdout is not None
        while line := await member.process.stdout.readline():
            self._report(member, line.decode().split())

    def _report(self, member: Member, words: list[str]) -> None:
        kind, at = words[0], float(words[1])
        if kind == "assign":
            member.assigned = tuple(int(p) for p in words[2].split(",")) if len(words) > 2 else ()
            member.assigned_at = at
        elif kind == "ack":
            member.unacked.difference_update(int(s) for s in words[2].split(","))
        elif kind == "got":
            self._got(member, at, int(words[2]), words[3:])

    def _got(self, member: Member, at: float, count: int, rest: list[str]) -> None:
        self.records += count
        self.first_read = at if self.first_read is None else self.first_read
        self.last_read = max(self.last_read, at)
        member.last_read = at
        for word in rest:
            if ":" in word:  # kafka: partition:last offset
                partition, _, offset = word.partition(":")
                self.partition_reads.setdefault(int(partition), []).append((at, member.name))
                self.next_offsets[int(partition)] = max(
                    self.next_offsets.get(int(partition), 0), int(offset) + 1
                )
            else:  # jetstream: the batch's stream seqs
                batch = {int(s) for s in word.split(",")}
                member.unacked |= batch
                for seq in batch:
                    self.seq_reads.setdefault(seq, []).append((at, member.name))

    async def kill(self, member: Member) -> float:
        """SIGKILL; the kill's time. Its pipe is read to the end (its pump task ends)."""
        member.killed = True
        at = time.monotonic()
        member.process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(member.process.wait(), STOP_TIMEOUT_S)
        return at

    async def stop(self) -> None:
        """Every live member asked to leave (SIGTERM), killed if it has not within a bound."""
        for member in self.live():
            with contextlib.suppress(ProcessLookupError):
                member.process.send_signal(signal.SIGTERM)
        for member in self.live():
            try:
                await asyncio.wait_for(member.process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                member.process.kill()
                await member.process.wait()


@contextlib.asynccontextmanager
async def running_group(argv: list[str]) -> Any:
    async with asyncio.TaskGroup() as tasks:
        group = Group(argv, tasks)
        try:
            yield group
        finally:
            await group.stop()


async def read_all(group: Group, expected: int) -> dict[str, Any]:
    start = time.monotonic()
    for _ in range(MEMBERS):
        await group.start()

    async def all_read() -> bool:
        return group.distinct_records() >= expected

    await poll_until(all_read, f"the group reading {expected} records", READ_TIMEOUT_S)
    assert group.first_read is not None
    seconds = group.last_read - group.first_read
    return {
        "records": expected,
        "read": group.records,  # records read again after a rebalance included
        "members": MEMBERS,
        "start_to_first_record_s": round(group.first_read - start, 3),
        "seconds": round(seconds, 3),
        "records_per_s": round(expected / seconds) if seconds > 0 else None,
    }


def summary(takeovers: list[float], kills: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kills": kills,
        "takeover_median_s": round(statistics.median(takeovers), 3) if takeovers else None,
        "takeover_max_s": round(max(takeovers), 3) if takeovers else None,
    }


# -- raftbroker, librdkafka consumers ------------------------------------------------------------


def kafka_argv(bootstrap: Sequence[str], topic: str) -> list[str]:
    return [
        sys.executable, "-m", "bench.group_member", "kafka",
        "--bootstrap", ",".join(bootstrap), "--topic", topic, "--group", "bench",
        "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
        "--heartbeat-interval-ms", str(HEARTBEAT_INTERVAL_MS),
    ]  # fmt: skip


async def kafka_throughput(settings: Settings, broker: str) -> dict[str, Any]:
    topic = "groups-throughput"
    async with fresh_brokers(broker) as bench:
        await bench.create_topic(topic, PARTITIONS)
        filled, _ = await kcat_produce(
            bench.bootstrap, topic, PARTITIONS, settings.kafka_fill_records
        )
        async with running_group(kafka_argv(bench.bootstrap, topic)) as group:
            return await read_all(group, filled)


def kafka_settled(group: Group) -> bool:
    """Every partition assigned to exactly one live member, each live member given some since
    the newest joined, and every partition read by its owner since it was assigned."""
    live = group.live()
    newest = max(m.started for m in live)
    if any(m.assigned_at < newest or not m.assigned for m in live):
        return False
    if sorted(p for m in live for p in m.assigned) != list(range(PARTITIONS)):
        return False  # a partition unowned, or owned twice (a rebalance half seen)
    owners = {p: m for m in live for p in m.assigned}
    return all(
        any(name == m.name and at > m.assigned_at for at, name in group.partition_reads.get(p, []))
        for p, m in owners.items()
    )


async def kafka_kill_once(group: Group) -> dict[str, Any]:
    victim = group.live()[0]
    owned = victim.assigned
    killed_at = await group.kill(victim)
    takeover = await read_again_s(
        group.partition_reads, owned, victim.name, killed_at, f"partitions {owned}"
    )
    return {"partitions": list(owned), "takeover_s": round(takeover, 3)}


async def read_again_s(
    reads: dict[int, list[tuple[float, str]]],
    keys: Collection[int],
    victim: str,
    killed_at: float,
    what: str,
) -> float:
    """Seconds from the kill until every key (a partition, or a message's seq) was read by a
    member other than `victim` (polled, with a deadline)."""

    def first(key: int) -> float | None:
        after = [at for at, name in reads.get(key, []) if name != victim and at > killed_at]
        return min(after, default=None)

    async def all_read() -> bool:
        return all(first(key) is not None for key in keys)

    await poll_until(all_read, f"{what} read again", SETTLE_TIMEOUT_S)
    return max(t for key in keys if (t := first(key)) is not None) - killed_at


async def crash_cycles(
    settings: Settings,
    group: Group,
    settled: Callable[[Group], bool],
    kill: Callable[[Group], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """Start the members, then kill one and let a new one join, `settings.kills` times."""
    for _ in range(MEMBERS):
        await group.start()
    kills: list[dict[str, Any]] = []

    async def is_settled() -> bool:
        return settled(group)

    while len([k for k in kills if "takeover_s" in k]) < settings.kills:
        await poll_until(is_settled, "the group settled", SETTLE_TIMEOUT_S)
        outcome = await kill(group)
        progress(f"crash: {outcome}")
        kills.append(outcome)
        await group.start()
    return summary([k["takeover_s"] for k in kills if "takeover_s" in k], kills)


async def steady_producer(bootstrap: Sequence[str], topic: str, stop: asyncio.Event) -> int:
    failures = Failures()
    producer = Producer({**producer_config(bootstrap, 0), "on_delivery": failures})
    sent = 0
    while not stop.is_set():
        producer.produce(topic, value_of(sent))
        producer.poll(0)
        sent += 1
        await asyncio.sleep(STEADY_INTERVAL_S)
    if producer.flush(30) or failures.errors:
        raise AssertionError(f"steady producer: {failures.errors[:3]}")
    return sent


async def kafka_crash(settings: Settings, broker: str) -> dict[str, Any]:
    topic = "groups-crash"
    async with fresh_brokers(broker) as bench:
        await bench.create_topic(topic, PARTITIONS)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            producing = tasks.create_task(steady_producer(bench.bootstrap, topic, stop))
            try:
                async with running_group(kafka_argv(bench.bootstrap, topic)) as group:
                    report = await crash_cycles(settings, group, kafka_settled, kafka_kill_once)
            finally:
                stop.set()
        return {**report, "produced": producing.result()}


# -- JetStream, pull subscribers on one durable consumer -------------------------------------------


def jetstream_argv(
    cluster: jetstream_servers.JetStreamCluster, batch: int, seqs: bool
) -> list[str]:
    return [
        sys.executable, "-m", "bench.group_member", "jetstream",
        "--servers", ",".join(cluster.urls), "--stream", jetstream_servers.STREAM,
        "--durable", DURABLE, "--batch", str(batch), *(["--report-seqs"] if seqs else []),
    ]  # fmt: skip


async def add_durable(cluster: jetstream_servers.JetStreamCluster) -> None:
    await cluster.js.add_consumer(
        jetstream_servers.STREAM,
        js_api.ConsumerConfig(
            durable_name=DURABLE,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT_S,
            max_ack_pending=MAX_ACK_PENDING,
            deliver_policy=js_api.DeliverPolicy.ALL,
        ),
    )


async def jetstream_throughput(settings: Settings) -> dict[str, Any]:
    async with jetstream_servers.fresh_cluster() as cluster:
        await pipelined_load(cluster, 0.5, settings.jetstream_fill_s)
        stored = int((await cluster.js.stream_info(jetstream_servers.STREAM)).state.messages)
        await add_durable(cluster)
        argv = jetstream_argv(cluster, FETCH_BATCH, seqs=False)
        async with running_group(argv) as group:
            return await read_all(group, stored)


def jetstream_settled(group: Group) -> bool:
    live = group.live()
    newest = max(m.started for m in live)
    return all(m.last_read > newest for m in live)


async def jetstream_kill_once(group: Group) -> dict[str, Any]:
    victim = group.live()[0]

    async def holds() -> bool:
        return bool(victim.unacked)

    await poll_until(holds, f"{victim.name} holding a batch", SETTLE_TIMEOUT_S)
    killed_at = await group.kill(victim)
    held = set(victim.unacked)  # its pipe read to the end: what it had not acknowledged
    if not held:
        return {"held": 0}

    takeover = await read_again_s(
        group.seq_reads, held, victim.name, killed_at, f"{len(held)} held messages"
    )
    return {"held": len(held), "takeover_s": round(takeover, 3)}


async def jetstream_crash(settings: Settings) -> dict[str, Any]:
    async with jetstream_servers.fresh_cluster() as cluster:
        await add_durable(cluster)
        load, stop = Steady(), asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(steady_publisher(cluster.js, load, stop))
            try:
                argv = jetstream_argv(cluster, JETSTREAM_CRASH_BATCH, seqs=True)
                async with running_group(argv) as group:
                    report = await crash_cycles(
                        settings, group, jetstream_settled, jetstream_kill_once
                    )
            finally:
                stop.set()
        return {**report, "produced": len(load.acked)}


# -- the run --------------------------------------------------------------------------------------

# (report's side, case): its measure; the librdkafka ones name the broker they run against
# (bench.kafka.BROKERS).
CASES: dict[tuple[str, str], Callable[[Settings], Awaitable[dict[str, Any]]]] = {
    ("raftbroker", "throughput"): partial(kafka_throughput, broker="raftbroker"),
    ("raftbroker", "crash"): partial(kafka_crash, broker="raftbroker"),
    ("apache_kafka", "throughput"): partial(kafka_throughput, broker="apache-kafka"),
    ("apache_kafka", "crash"): partial(kafka_crash, broker="apache-kafka"),
    ("jetstream", "throughput"): jetstream_throughput,
    ("jetstream", "crash"): jetstream_crash,
}


async def run(settings: Settings) -> dict[str, Any]:
    started = datetime.now(UTC)
    report: dict[str, Any] = {side: {} for side, _ in CASES}
    errors: dict[str, str] = {}
    for (side, case), measure in CASES.items():
        progress(f"{side}: {case}")
        try:
            report[side][case] = await measure(settings)
        except Exception as exc:  # noqa: BLE001 - reported; the other cases still run
            errors[f"{side}-{case}"] = repr(exc)
            progress(f"{side} {case} failed: {exc!r}")
    return {
        "benchmark": "consumer groups: librdkafka in a raftbroker group and in an Apache "
        "Kafka one, JetStream pull consumers on one durable consumer",
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "machine": apply_bench.machine_info(),
        "config": {
            "quick": settings.quick,
            "partitions": PARTITIONS,
            "members": MEMBERS,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            "jetstream_ack_wait_s": ACK_WAIT_S,
            "steady_interval_s": STEADY_INTERVAL_S,
        },
        **report,
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.groups",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="one kill, small fills")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    return emit(run_loop(run(Settings.of(args.quick))), args.out)


if __name__ == "__main__":
    sys.exit(main())
