"""raftbroker's throughput, consume and fsync scenarios (`bench.cluster`'s `Raftbroker.pipelined`
and `Raftbroker.fsync`).

Role: acknowledged records/s from one idempotent Producer with its own batching, sending as
fast as acks return, its acks and the CPU of every process counted over a timed window only;
each topic then read back from offset 0 by one Consumer (consume); and the compared case with
`fsync = true` against `fsync = false` in alternation. `read_back` also serves the failover
scenario's check for lost and duplicated records.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import storage as storage_bench
from bench.cluster_latency import latency_case
from bench.harness import (
    VALUE_BYTES,
    CpuSample,
    cpu_per_record,
    cpu_report,
    sample_cpu,
    value_of,
    value_zlib_ratio,
)
from bench.nodes import (
    FSYNC_TOML,
    NO_FSYNC_TOML,
    BenchCluster,
    Settings,
    create_topic,
    fresh_cluster,
    leaders_by_node,
    progress,
)
from cluster.client import (
    Admin,
    ConsumedRecord,
    Consumer,
    ConsumerConfig,
    Producer,
    ProducerConfig,
    RecordMetadata,
)

# the send loop yields to the event loop every this many sends
YIELD_EVERY = 256
WARMUP_RECORDS = 2_000
CONSUMER_MAX_WAIT_MS = 100


@dataclass(slots=True)
class SendLoop:
    """Sends as fast as the producer takes records; its buffer bounds what is outstanding.

    `send` waits for space once `buffer_records_max` records are unacknowledged, so after a
    short ramp the loop sends as fast as acks return (the cluster's rate), unless this process
    cannot make records that fast (then the buffer never fills).
    """

    producer: Producer
    topic: str
    first: int
    sent: int = 0
    popped: int = 0
    outstanding: deque[asyncio.Future[RecordMetadata]] = field(default_factory=deque)

    async def run_until(self, deadline: float) -> None:
        outstanding = self.outstanding
        while time.monotonic() < deadline:
            for _ in range(YIELD_EVERY):
                outstanding.append(await self.producer.send(self.topic, self.next_value()))
            await asyncio.sleep(0)  # let the partition senders and the connection run
            while outstanding and outstanding[0].done():
                outstanding.popleft().result()  # raises if the record failed
                self.popped += 1

    def next_value(self) -> bytes:
        self.sent += 1
        return value_of(self.first + self.sent - 1)

    def acked(self) -> int:
        """Records acknowledged so far (acks keep order only within a partition)."""
        return self.popped + sum(1 for f in self.outstanding if f.done())

    async def drain(self) -> float:
        """Await every send still outstanding (each must succeed); seconds it took."""
        start = time.monotonic()
        for future in self.outstanding:
            await future
        return time.monotonic() - start


@dataclass(frozen=True, slots=True)
class Window:
    """The timed part of a SendLoop: its length, acks and CPU samples at both ends."""

    seconds: float
    acked: int
    cpu_before: CpuSample
    cpu_after: CpuSample


async def timed_window(
    sender: SendLoop, pids: Mapping[str, int], ramp_s: float, seconds: float
) -> Window:
    """Ramp up (fill the producer's buffer), then count acks and CPU over `seconds`."""
    await sender.run_until(time.monotonic() + ramp_s)
    before, acked_before = sample_cpu(pids), sender.acked()
    await sender.run_until(before.wall_s + seconds)
    after, acked_after = sample_cpu(pids), sender.acked()
    return Window(after.wall_s - before.wall_s, acked_after - acked_before, before, after)


async def read_back(
    bench: BenchCluster,
    topic: str,
    on_records: Callable[[list[ConsumedRecord]], None],
    timeout_s: float = 300.0,
) -> tuple[int, float]:
    """Read every partition of `topic` from offset 0 to its end; (records, seconds)."""
    admin = Admin(bench.client)
    partitions = await bench.client.partitions(topic)
    ends = {i.partition: await admin.list_offsets(topic, i.partition, -1) for i in partitions}
    consumer = Consumer(bench.client, ConsumerConfig(max_wait_ms=CONSUMER_MAX_WAIT_MS))
    await consumer.assign(topic, start=0)
    start, count = time.monotonic(), 0
    while any(consumer.positions[(topic, n)].offset < end for n, end in ends.items()):
        records = await consumer.poll()
        count += len(records)
        on_records(records)
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{topic}: read {count} records in {timeout_s} s, not all")
    return count, time.monotonic() - start


def ignore_records(_records: list[ConsumedRecord]) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ThroughputCase:
    partitions: int
    batch_size_bytes: int
    linger_ms: float

    @property
    def topic(self) -> str:
        return f"tput-p{self.partitions}-b{self.batch_size_bytes}"


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """A throughput case's load: the timed window, and what was left when it closed."""

    window: Window
    sent: int
    outstanding: int
    drain_s: float
    producer_stats: dict[str, int]


async def throughput_load(
    bench: BenchCluster, case: ThroughputCase, ramp_s: float, seconds: float
) -> LoadOutcome:
    """Warm up, ramp, time a window of full-speed sends, then await every outstanding ack."""
    config = ProducerConfig(batch_size_bytes=case.batch_size_bytes, linger_ms=case.linger_ms)
    async with Producer(bench.client, config) as producer:
        await asyncio.gather(  # warm-up: senders, connections, serving leaders
            *[await producer.send(case.topic, value_of(i)) for i in range(WARMUP_RECORDS)]
        )
        sender = SendLoop(producer, case.topic, WARMUP_RECORDS)
        window = await timed_window(sender, bench.process_pids(), ramp_s, seconds)
        outstanding = len(sender.outstanding)
        drain_s = await sender.drain()
        return LoadOutcome(window, sender.sent, outstanding, drain_s, dict(producer.stats))


def throughput_report(
    case: ThroughputCase, load: LoadOutcome, leaders: dict[str, int]
) -> dict[str, Any]:
    window = load.window
    records_per_s = window.acked / window.seconds
    return {
        "partitions": case.partitions,
        "batch_size_bytes": case.batch_size_bytes,
        "linger_ms": case.linger_ms,
        "seconds": round(window.seconds, 3),
        "acked_in_window": window.acked,
        "records_per_s": round(records_per_s),
        "mb_per_s": round(records_per_s * VALUE_BYTES / 1e6, 2),
        "sent_in_total": load.sent,
        "outstanding_at_end": {"records": load.outstanding, "drained_in_s": round(load.drain_s, 3)},
        "producer_stats": load.producer_stats,
        "leaders_by_node": leaders,
        "cpu": cpu_report(window.cpu_before, window.cpu_after),
        "cpu_us_per_record": cpu_per_record(window.cpu_before, window.cpu_after, window.acked),
    }


async def consume_case(bench: BenchCluster, case: ThroughputCase, expected: int) -> dict[str, Any]:
    """Read a throughput case's topic back from offset 0, with the CPU it cost."""
    before = sample_cpu(bench.process_pids())
    count, seconds = await read_back(bench, case.topic, ignore_records)
    after = sample_cpu(bench.process_pids())
    if count != expected:
        raise AssertionError(f"{case.topic}: read {count} records, {expected} were acknowledged")
    return {
        "partitions": case.partitions,
        "batch_size_bytes": case.batch_size_bytes,
        "records": count,
        "seconds": round(seconds, 3),
        "records_per_s": round(count / seconds),
        "mb_per_s": round(count * VALUE_BYTES / seconds / 1e6, 2),
        "cpu": cpu_report(before, after),
    }


async def throughput_case(
    case: ThroughputCase, ramp_s: float, seconds: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One throughput case on a fresh cluster, then reading it back: (throughput, consume)."""
    async with fresh_cluster() as bench:
        await create_topic(bench, case.topic, case.partitions)
        load = await throughput_load(bench, case, ramp_s, seconds)
        leaders = await leaders_by_node(bench, case.topic)
        consume = await consume_case(bench, case, load.sent + WARMUP_RECORDS)
    return throughput_report(case, load, leaders), consume


def throughput_params(settings: Settings) -> dict[str, Any]:
    return {
        "value_bytes": VALUE_BYTES,
        "value_content": "12-digit index + 88 random uppercase letters",
        "value_zlib_ratio": value_zlib_ratio(),
        "acks": "all (every send future awaited)",
        "seconds": settings.throughput_s,
        "warmup_records": WARMUP_RECORDS,
        "ramp_s": settings.throughput_ramp_s,
        "window": "after warm-up and ramp: acks and CPU counted only inside the window",
        "producers": 1,
        "idempotent": True,
        "outstanding_records_max": ProducerConfig().buffer_records_max,
        "max_in_flight_batches_per_partition": ProducerConfig().max_in_flight,
        "cluster": "fresh per case",
    }


async def throughput_scenario(settings: Settings) -> dict[str, Any]:
    cases = [
        ThroughputCase(partitions, batch, linger)
        for batch, linger in settings.batches
        for partitions in settings.partitions
    ]
    produced, consumed = [], []
    for case in cases:
        progress(f"throughput: {case}")
        throughput, consume = await throughput_case(
            case, settings.throughput_ramp_s, settings.throughput_s
        )
        produced.append(throughput)
        consumed.append(consume)
    params = throughput_params(settings)
    best = max(produced, key=lambda c: c["records_per_s"])
    consume_params = {
        "consumer": "one Consumer, every partition, from offset 0 to the end offsets",
        "max_wait_ms": CONSUMER_MAX_WAIT_MS,
        "topic": "each throughput case's topic, right after its load",
    }
    return {
        "throughput": {
            "params": params,
            "cases": produced,
            "best": {k: best[k] for k in ("partitions", "batch_size_bytes", "records_per_s")},
        },
        "consume": {"params": consume_params, "cases": consumed},
    }


# -- fsync ----------------------------------------------------------------------------------------


async def fsync_run(
    settings: Settings, case: ThroughputCase, name: str, toml: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One alternation's half on a fresh cluster: (the throughput case, sequential latency)."""
    async with fresh_cluster(toml) as bench:
        await create_topic(bench, case.topic, case.partitions)
        load = await throughput_load(bench, case, settings.throughput_ramp_s, settings.throughput_s)
        latency = await latency_case(bench, "sequential", 0.0, settings.latency_s, mesh=name)
    return throughput_report(case, load, {}), latency


async def fsync_scenario(settings: Settings) -> dict[str, Any]:
    """The compared throughput case (1 partition, 16 KiB batches, linger 2 ms) and the
    sequential latency, both twice in alternation: nodes with `fsync = true` (every journal
    fsynced before an acknowledgement, docs/design.md "Storage": the default), and with
    `fsync = false`, so the ratio compares neighbours in time on a noisy machine."""
    case = ThroughputCase(1, *settings.batches[0])
    runs: dict[str, list[dict[str, Any]]] = {"fsync": [], "no_fsync": []}
    latencies: dict[str, list[dict[str, Any]]] = {"fsync": [], "no_fsync": []}
    for _ in range(1 if settings.quick else 2):
        for name, toml in (("fsync", FSYNC_TOML), ("no_fsync", NO_FSYNC_TOML)):
            throughput, latency = await fsync_run(settings, case, name, toml)
            runs[name].append(throughput)
            latencies[name].append(latency)
            progress(f"fsync: {name}: {runs[name][-1]['records_per_s']} acked records/s")
    median = {name: statistics.median(r["records_per_s"] for r in rs) for name, rs in runs.items()}
    p50 = {name: statistics.median(c["p50_ms"] for c in cs) for name, cs in latencies.items()}
    return {
        "fsync": {
            "params": {
                "case": "1 partition, 16 KiB batches, linger 2 ms (the compared throughput case)",
                "alternation": "fsync, no fsync, fsync, no fsync: fresh cluster each",
                "raw_fsync_per_s": raw_fsync_rate(settings.quick),
            },
            "throughput": runs,
            "sequential": latencies,
            "records_per_s_median": median,
            "sequential_p50_ms_median": p50,
            "throughput_ratio": round(median["fsync"] / median["no_fsync"], 3),
        }
    }


def raw_fsync_rate(quick: bool) -> int:
    """This machine's disk, as `bench.storage` measures it: one-record batches appended to a
    segment store with `fsync=True`, each append fsynced (calls per second)."""
    with tempfile.TemporaryDirectory(prefix="raftbroker-bench-fsync-") as tmp:
        one = storage_bench.encode_batch(0, 1)
        measured = storage_bench.fsync_appends(Path(tmp), one, 1, quick)
    return int(measured["calls_per_s"])
