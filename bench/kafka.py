"""Kafka-protocol benchmark: librdkafka against raftbroker's Kafka listener, or against Apache
Kafka itself (`--broker apache-kafka`: `bench.apache_kafka`'s 3 KRaft nodes), the same cases.

Role: the measured answer to issue 21's speed goals: the broker's cost per Kafka batch should not
grow with its records. A real 3-node cluster (replication 3) on loopback, started fresh per case
as `bench.cluster` starts it (`bench.nodes`); the clients are librdkafka, configured as a user
would for throughput. Run it as `python -m bench.kafka [--quick] [--out FILE]`; it prints one
JSON object on stdout (progress on stderr) and exits 1 if a case failed; a goal missed is a
result. `--scenarios sequential` runs the sequential case alone (`python -m bench` repeats it in
rounds, alternating with the other sides').

Clients: the pipelined and consume cases run kcat (librdkafka's own command-line client, C),
the sequential case confluent-kafka (librdkafka in Python). Not confluent-kafka throughout,
because its Python call costs about 1.3 us a record (`produce`, measured here with no broker),
so one Python producer tops out near 700,000 records/s on a whole core of a 2-core machine that
must also run three nodes: it would measure the binding, not the broker.

Cases:
- pipelined: an idempotent producer (`enable.idempotence`, `acks=all`), 100-byte values
  (`bench.harness.value_of`: an index and random letters, 4,096 distinct, repeated), librdkafka's
  batching (`linger.ms` 5, `batch.size` 1,000,000), 1 and 16 partitions. kcat reads a fixed
  number of records, one a line, from a file written beforehand (in /dev/shm where there is
  one), about 10 s of them, then flushes and exits: the rate is records / (kcat's start to its
  exit), every record acknowledged (kcat exits 0 and reports no delivery failure on stderr;
  the consume case then reads back exactly as many). Until the twelfth session a Python loop
  in this process fed kcat through a pipe for a timed window: that loop took 12-15% of a core
  of a saturated 2-core machine, a cost of neither broker (bench/HISTORY.md).
- consume: kcat reads every partition of the pipelined topic from the beginning (no group:
  assigned partitions) until it has every record, one byte of output a record, counted here:
  records/s, the median of three reads in a row (each read is in the report).
- sequential: `linger.ms` 0, one record in flight: produce, flush, repeat; p50 and p99.
- e2e: 1,000 records/s, each one's time from the producer to the consumer (`bench.kafka_e2e`).
- failover: a record every 2 ms, the partition leader SIGKILLed, the time to the first ack of
  a record sent after the kill (`bench.kafka_failover`), on a fresh cluster per kill.
- fsync: pipelined on 1 partition and sequential, each on a fresh cluster that fsyncs before
  every acknowledgement (raftbroker `fsync = true`; Kafka `log.flush.interval.messages=1`,
  which fsyncs every append on the leader and on each follower before an `acks=all` answer).
- idle: a topic of 1,000 partitions and nothing sent: CPU and resident memory per node once
  the cluster has settled (`bench.kafka_idle`).
- tools: Kafka's own ProducerPerformance, ConsumerPerformance and EndToEndLatency
  (`bench.kafka_tools`).

The pipelined case also reads each node's resident memory at its end (now and peak).

CPU of every node and of this process is recorded per case, as in `bench.cluster` (kcat's own
is not: it exits before the window's end is sampled).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from bench import apache_kafka, kafka_e2e, kafka_failover, kafka_idle, kafka_tools, nodes
from bench.harness import (
    cpu_report,
    latency_summary_ms,
    memory_mb,
    reporter,
    sample_cpu,
    value_of,
)
from bench.java import classpath
from bench.kafka_failover import one_failover

VALUE_BYTES = 100
BATCH_SIZE_BYTES = 1_000_000
LINGER_MS = 5
QUEUE_RECORDS_MAX = 1_000_000
FLUSH_TIMEOUT_S = 120.0
PRODUCE_TIMEOUT_S = 300.0  # kcat's whole run: 6,000,000 records at 20,000/s at worst
# kcat's report of a record it could not deliver, and librdkafka's fatal errors (log levels 0-2);
# its warnings while a node is still starting ("Failed to acquire idempotence PID ...:
# retrying") are not failures.
KCAT_FAILED = re.compile(r"Delivery failed|^%[0-2]\|", re.IGNORECASE | re.MULTILINE)
CONSUME_TIMEOUT_S = 120.0
CONSUME_READS = 3  # the consume case's reads of the same records; their median is its rate
# librdkafka stops fetching a partition once its queue holds queued.min.messages (100,000 by
# default) and looks again only when its broker thread wakes, up to a second later: a broker
# that answers faster than kcat prints fills it, and a read of 270,000 records takes 0.1 s or
# 1.0 s by chance (bench/HISTORY.md, 2026-11-29, sixth session). Both brokers are read with room
# for every record, so the case measures the broker, not that wait.
CONSUME_SETTINGS = ("-X", "queued.min.messages=1000000")


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    pipelined_records: int
    partitions: tuple[int, ...]
    sequential_records: int
    failover_kills: int
    e2e_s: float
    fsync_records: int
    fsync_sequential_records: int
    idle_partitions: int
    tool_records: int  # ProducerPerformance's, read back by ConsumerPerformance
    tool_e2e_records: int  # EndToEndLatency's round trips
    broker: str = "raftbroker"

    @classmethod
    def of(cls, quick: bool, broker: str = "raftbroker") -> Settings:
        if quick:
            return cls(
                quick=True, pipelined_records=400_000, partitions=(1,), sequential_records=200,
                failover_kills=1, e2e_s=2.0, fsync_records=200_000, fsync_sequential_records=100,
                idle_partitions=100, tool_records=100_000, tool_e2e_records=200, broker=broker,
            )  # fmt: skip
        return cls(
            quick=False, pipelined_records=6_000_000, partitions=(1, 16), sequential_records=3_000,
            failover_kills=3, e2e_s=10.0, fsync_records=2_000_000, fsync_sequential_records=1_000,
            idle_partitions=1_000, tool_records=2_000_000, tool_e2e_records=2_000, broker=broker,
        )  # fmt: skip


SCENARIOS = ("pipelined", "sequential", "e2e", "failover", "fsync", "idle", "tools")
BROKERS = ("raftbroker", "apache-kafka")


@dataclass(frozen=True, slots=True)
class Brokers:
    """A fresh cluster of either broker as the cases see it: Kafka's bootstrap addresses, the
    processes whose CPU counts, and how a topic is created (replication 3, every partition led
    and in sync when it returns)."""

    name: str
    bootstrap: tuple[str, ...]
    pids: Callable[[], dict[str, int]]
    create_topic: Callable[[str, int], Awaitable[None]]

    def process_pids(self) -> dict[str, int]:
        return {**self.pids(), "client": os.getpid()}


@contextlib.asynccontextmanager
async def fresh_brokers(name: str, *, fsync: bool = False) -> AsyncIterator[Brokers]:
    """A new 3-node cluster of `name` (`BROKERS`), stopped by PID after."""
    if name == "raftbroker":
        extra = nodes.FSYNC_TOML if fsync else nodes.NO_FSYNC_TOML
        async with nodes.fresh_cluster(extra) as ours:
            yield Brokers(
                name,
                tuple(ours.local.kafka_bootstrap),
                ours.node_pids,
                lambda topic, partitions: nodes.create_topic(ours, topic, partitions),
            )
        return
    assert name == "apache-kafka", name
    async with apache_kafka.fresh_cluster(fsync=fsync) as kafka:
        yield Brokers(
            name,
            tuple(kafka.bootstrap),
            kafka.pids,
            lambda topic, partitions: apache_kafka.create_topic(kafka, topic, partitions),
        )


def describe_brokers(name: str, *, fsync: bool = False) -> dict[str, Any]:
    """What the report states of the cluster under test: versions and settings."""
    if name == "apache-kafka":
        return apache_kafka.describe(classpath(), fsync=fsync)
    return {
        "raftbroker": version("raftbroker"),
        "nodes": nodes.NODES,
        "replication": nodes.REPLICATION,
        "fsync": fsync,
        "python": sys.version.split()[0],
    }


progress = reporter("bench.kafka")


def producer_config(bootstrap: Sequence[str], linger_ms: float) -> dict[str, Any]:
    return {
        "bootstrap.servers": ",".join(bootstrap),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
        "batch.size": BATCH_SIZE_BYTES,
        "queue.buffering.max.messages": QUEUE_RECORDS_MAX,
        "queue.buffering.max.kbytes": 1_048_576,
        "delivery.report.only.error": True,
        "compression.type": "none",
    }


class Failures:
    """Delivery reports: only errors arrive (`delivery.report.only.error`)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.errors.append(str(error))


def kcat_settings(bootstrap: Sequence[str], linger_ms: float) -> list[str]:
    """librdkafka's settings for kcat: the producer's, as `-X` options."""
    settings = {**producer_config(bootstrap, linger_ms)}
    settings.pop("delivery.report.only.error")
    args = []
    for key, value in settings.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        args += ["-X", f"{key}={text}"]
    return args


WARM_UP_RECORDS = 300_000
LINES_DIR = Path("/dev/shm")  # the records' file in memory where it can be


def lines_chunk() -> bytes:
    """4,096 distinct 100-byte values, a line each: what kcat reads as records."""
    return b"".join(value_of(i) + b"\n" for i in range(4_096))


@contextlib.contextmanager
def lines_file(records: int) -> Iterator[Path]:
    """A file of `records` lines (the 4,096 values over and over), removed after."""
    chunk = lines_chunk()
    whole, rest = divmod(records, 4_096)
    size = records * len(chunk) // 4_096
    in_memory = LINES_DIR.is_dir() and shutil.disk_usage(LINES_DIR).free > 2 * size
    where = LINES_DIR if in_memory else None  # else the temporary directory, on disk
    with tempfile.NamedTemporaryFile(prefix="raftbroker-bench-", dir=where) as handle:
        for _ in range(whole):
            handle.write(chunk)
        handle.write(b"".join(chunk.splitlines(keepends=True)[:rest]))
        handle.flush()
        yield Path(handle.name)


async def kcat_produce(
    bootstrap: Sequence[str], topic: str, partitions: int, records: int
) -> tuple[int, float]:
    """kcat produces `records` records read from a file; (records, seconds from kcat's start
    until every record was acknowledged and kcat exited)."""
    partition = "0" if partitions == 1 else "-1"  # -1: kcat's random partitioner
    with lines_file(records) as path, path.open("rb") as lines:
        start = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            "kcat", "-P", "-t", topic, "-p", partition, *kcat_settings(bootstrap, LINGER_MS),
            stdin=lines,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            _, errors = await asyncio.wait_for(process.communicate(), PRODUCE_TIMEOUT_S)
        except TimeoutError:
            process.kill()  # not left retrying against a cluster about to be stopped
            await process.wait()
            raise
        elapsed = time.monotonic() - start
    if process.returncode != 0 or KCAT_FAILED.search(errors.decode()):
        raise AssertionError(f"kcat exited {process.returncode}: {errors.decode()[-2000:]}")
    return records, elapsed


async def pipelined_load(
    bench: Brokers, topic: str, partitions: int, records: int
) -> tuple[dict[str, Any], int]:
    """kcat's warm-up, then `records` measured; the report and how many records the topic
    holds."""
    await bench.create_topic(topic, partitions)
    warm, _ = await kcat_produce(bench.bootstrap, topic, partitions, WARM_UP_RECORDS)
    before = sample_cpu(bench.process_pids())
    sent, seconds = await kcat_produce(bench.bootstrap, topic, partitions, records)
    after = sample_cpu(bench.process_pids())
    report = {
        "partitions": partitions,
        "records": sent,
        "seconds": round(seconds, 3),
        "records_per_s": round(sent / seconds),
        "mb_per_s": round(sent * VALUE_BYTES / seconds / 1e6, 2),
        "cpu": cpu_report(before, after),
    }
    return report, warm + sent


async def pipelined_case(
    settings: Settings, partitions: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pipelined, then consume the topic; the nodes' memory after both (peak: the load's)."""
    async with fresh_brokers(settings.broker) as bench:
        topic = f"kafka-pipelined-{partitions}"
        report, stored = await pipelined_load(bench, topic, partitions, settings.pipelined_records)
        consume = await consume_case(bench, topic, partitions, stored)
        report["memory"] = memory_mb(bench.pids())
    return report, consume


async def kcat_consume(
    bench: Brokers,
    topic: str,
    expected: int,
    *,
    isolation: str = "read_committed",
    settings: Sequence[str] = (),
) -> float:
    """Seconds for kcat to read `expected` records from the beginning of every partition (no
    group: it assigns them); it prints one byte a record, counted here. `-c`: kcat exits once
    it has read that many (and so flushes its buffered output); not `-e`, which stops at each
    partition's end as its leader reports it then, which may lag the commit briefly after an
    election. Fewer records than expected: the read times out. `isolation`: librdkafka's
    isolation.level (read_committed, its default, or read_uncommitted); `settings`: more
    `-X` options."""
    process = await asyncio.create_subprocess_exec(
        "kcat", "-C", "-q", "-o", "beginning", "-c", str(expected), "-t", topic, "-f", "x",
        "-b", ",".join(bench.bootstrap), "-X", f"isolation.level={isolation}", *settings,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    start, count = time.monotonic(), 0
    try:
        while data := await asyncio.wait_for(process.stdout.read(1 << 20), CONSUME_TIMEOUT_S):
            count += len(data)
        elapsed = time.monotonic() - start
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it may have exited meanwhile
                process.kill()
        _, errors = await asyncio.wait_for(process.communicate(), CONSUME_TIMEOUT_S)
    if count != expected:
        raise AssertionError(f"kcat read {count} of {expected} records: {errors.decode()[-2000:]}")
    return elapsed


async def consume_case(
    bench: Brokers,
    topic: str,
    partitions: int,
    expected: int,
    *,
    isolation: str = "read_committed",
    settings: Sequence[str] = CONSUME_SETTINGS,
) -> dict[str, Any]:
    """`CONSUME_READS` reads of the whole topic, one after the other; the rate is their
    median. One read moves by 2x from try to try on either broker (kcat, the busy process,
    nearly fills the machine: bench/HISTORY.md), more than the gap its goal is about.
    `isolation` and `settings` as `kcat_consume`'s."""
    reads = []
    for _ in range(CONSUME_READS):
        before = sample_cpu(bench.process_pids())
        seconds = await kcat_consume(bench, topic, expected, isolation=isolation, settings=settings)
        after = sample_cpu(bench.process_pids())
        reads.append((seconds, cpu_report(before, after)))
    seconds, cpu = sorted(reads, key=lambda read: read[0])[len(reads) // 2]
    return {
        "partitions": partitions,
        "records": expected,
        "seconds": round(seconds, 3),
        "records_per_s": round(expected / seconds),
        "reads_records_per_s": [round(expected / s) for s, _ in reads],
        "cpu": cpu,
    }


def flushed(producer: Producer) -> None:
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left:
        raise AssertionError(f"{left} records not acknowledged within {FLUSH_TIMEOUT_S} s")


def sequential_latencies(producer: Producer, topic: str, count: int) -> list[float]:
    latencies = []
    for i in range(count):
        start = time.perf_counter()
        producer.produce(topic, value_of(i), partition=0)
        flushed(producer)
        latencies.append(time.perf_counter() - start)
    return latencies


async def sequential_case(
    settings: Settings, *, fsync: bool = False, records: int | None = None
) -> dict[str, Any]:
    topic = "kafka-sequential"
    async with fresh_brokers(settings.broker, fsync=fsync) as bench:
        await bench.create_topic(topic, 1)
        failures = Failures()
        producer = Producer({**producer_config(bench.bootstrap, 0), "on_delivery": failures})
        await asyncio.to_thread(sequential_latencies, producer, topic, 100)  # warm-up
        latencies = await asyncio.to_thread(
            sequential_latencies, producer, topic, records or settings.sequential_records
        )
        if failures.errors:
            raise AssertionError(f"delivery errors: {failures.errors[:5]}")
    return {"records": len(latencies), "linger_ms": 0, **latency_summary_ms(latencies)}


async def fsync_case(settings: Settings) -> dict[str, Any]:
    """Pipelined on 1 partition, then sequential, each on a fresh cluster that fsyncs before
    every acknowledgement (raftbroker `fsync = true`; Kafka `log.flush.interval.messages=1`)."""
    async with fresh_brokers(settings.broker, fsync=True) as bench:
        pipelined, _ = await pipelined_load(bench, "kafka-fsync", 1, settings.fsync_records)
    sequential = await sequential_case(
        settings, fsync=True, records=settings.fsync_sequential_records
    )
    return {"pipelined": pipelined, "sequential": sequential}


async def idle_case(settings: Settings) -> dict[str, Any]:
    """`bench.kafka_idle`: CPU and memory of an idle cluster holding `idle_partitions`."""
    async with fresh_brokers(settings.broker) as bench:
        return await kafka_idle.idle(bench.create_topic, bench.pids, settings.idle_partitions)


async def tools_case(settings: Settings) -> dict[str, Any]:
    """`bench.kafka_tools`: Kafka's own load tools, on one fresh cluster."""
    async with fresh_brokers(settings.broker) as bench:
        return await kafka_tools.run_tools(
            bench.bootstrap, bench.create_topic, settings.tool_records, settings.tool_e2e_records
        )


async def run(settings: Settings, names: tuple[str, ...] = SCENARIOS) -> dict[str, Any]:
    report: dict[str, Any] = {"quick": settings.quick, "broker": settings.broker, "errors": {}}
    report["cluster"] = await asyncio.to_thread(describe_brokers, settings.broker)
    if "pipelined" in names:
        await pipelined_cases(settings, report)
    cases: dict[str, Callable[[Settings], Awaitable[dict[str, Any]]]] = {
        "sequential": sequential_case,
        "e2e": e2e_case,
        "failover": failover_case,
        "fsync": fsync_case,
        "idle": idle_case,
        "tools": tools_case,
    }
    for name, case in cases.items():
        if name not in names:
            continue
        progress(name)
        try:
            report[name] = await case(settings)
        except Exception as exc:  # noqa: BLE001 - reported, the other cases still run
            report["errors"][name] = repr(exc)
    return report


async def e2e_case(settings: Settings) -> dict[str, Any]:
    """`bench.kafka_e2e`: records at a fixed rate, each one's produce -> consumer receipt."""
    async with fresh_brokers(settings.broker) as bench:
        await bench.create_topic(kafka_e2e.TOPIC, 1)
        return await asyncio.to_thread(kafka_e2e.e2e_latencies, bench.bootstrap, settings.e2e_s)


async def failover_case(settings: Settings) -> dict[str, Any]:
    """`bench.kafka_failover`: one leader's SIGKILL per fresh cluster, `failover_kills` of them."""
    runs = []
    for kill in range(settings.failover_kills):
        progress(f"failover, kill {kill + 1} of {settings.failover_kills}")
        async with fresh_brokers(settings.broker) as bench:
            await bench.create_topic(kafka_failover.TOPIC, 1)
            runs.append(await asyncio.to_thread(one_failover, bench.bootstrap, bench.pids))
    return kafka_failover.summary(runs)


async def pipelined_cases(settings: Settings, report: dict[str, Any]) -> None:
    """The pipelined and consume cases, into `report` (a failed case in its errors)."""
    pipelined, consumed = [], []
    for partitions in settings.partitions:
        progress(f"pipelined, {partitions} partition(s)")
        try:
            produced, consume = await pipelined_case(settings, partitions)
        except Exception as exc:  # noqa: BLE001 - reported, the other cases still run
            report["errors"][f"pipelined-{partitions}"] = repr(exc)
            continue
        pipelined.append(produced)
        consumed.append(consume)
    report["pipelined"] = {
        "params": {
            "client": "confluent-kafka (librdkafka), one producer",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "batch.size": BATCH_SIZE_BYTES,
            "value_bytes": VALUE_BYTES,
            "records": settings.pipelined_records,
            "rate": "records acknowledged / (kcat's start to its exit, every record acked)",
        },
        "cases": pipelined,
    }
    report["consume"] = {"cases": consumed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="raftbroker",
        help="the cluster under test: raftbroker's Kafka listener, or Apache Kafka itself "
        "(three KRaft nodes from Maven Central's jars: Java 17+ and Maven)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all; pipelined "
        "includes consume)",
    )
    args = parser.parse_args(argv)
    names = tuple(n for n in args.scenarios.split(",") if n)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    report = asyncio.run(run(Settings.of(args.quick, args.broker), names))
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
