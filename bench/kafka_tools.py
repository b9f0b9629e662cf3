"""Kafka's own load tools against either broker: `ProducerPerformance`, `ConsumerPerformance`
and `EndToEndLatency` (kafka-producer-perf-test, kafka-consumer-perf-test and
kafka-e2e-latency, from `kafka-tools`).

Role: the comparison as anyone can reproduce it with the tools they already know, called by
`bench.kafka`'s tools case on one fresh cluster of either broker. Each tool is its own JVM on
`bench.java`'s classpath (Kafka's Java client, the version `bench.java` pins), with the
settings of the librdkafka cases: `acks=all`, idempotence on, `linger.ms` 5, `batch.size`
1,000,000, 100-byte records, replication 3:
- ProducerPerformance: `records` records as fast as acknowledged (`--throughput -1`) to a
  1-partition topic; its own summary line (records/s, latency percentiles).
- ConsumerPerformance: the same records read back by a consumer group of one; records/s of
  the fetch time (Kafka's `fetch.nMsg.sec`: without the group's join) and of the whole run.
- EndToEndLatency: one record at a time, produced (acks=all) and consumed before the next;
  its average and percentiles (whole milliseconds: the tool's own resolution).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bench.java import Jars, classpath

TOOL_TIMEOUT_S = 300.0
TOOL_HEAP_MB = 512
RECORD_BYTES = 100
PRODUCER_PROPS = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "batch.size": "1000000",
    "compression.type": "none",
}
PRODUCED = re.compile(
    r"(?P<records>\d+) records sent, (?P<records_per_s>[\d.]+) records/sec .*?, "
    r"(?P<avg_ms>[\d.]+) ms avg latency, (?P<max_ms>[\d.]+) ms max latency, "
    r"(?P<p50_ms>[\d.]+) ms 50th, (?P<p95_ms>[\d.]+) ms 95th, (?P<p99_ms>[\d.]+) ms 99th"
)
E2E_AVERAGE = re.compile(r"Avg latency: (?P<avg_ms>[\d.]+) ms")
E2E_PERCENTILES = re.compile(
    r"Percentiles: 50th = (?P<p50_ms>\d+), 99th = (?P<p99_ms>\d+), 99\.9th = (?P<p999_ms>\d+)"
)


async def run_tool(jars: Jars, main_class: str, *args: str) -> str:
    """The tool's stdout; an AssertionError with its output if it failed or timed out."""
    process = await asyncio.create_subprocess_exec(
        *jars.java(main_class, *args, heap_mb=TOOL_HEAP_MB),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), TOOL_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    text = out.decode(errors="replace")
    if process.returncode != 0:
        raise AssertionError(f"{main_class} exited {process.returncode}: {text[-2000:]}")
    return text


def numbers(match: re.Match[str] | None, text: str) -> dict[str, float]:
    if match is None:
        raise AssertionError(f"no summary in the tool's output: {text[-2000:]}")
    return {name: float(value) for name, value in match.groupdict().items()}


async def producer_performance(
    jars: Jars, bootstrap: Sequence[str], topic: str, records: int
) -> dict[str, Any]:
    props = [f"{k}={v}" for k, v in PRODUCER_PROPS.items()]
    text = await run_tool(
        jars, "org.apache.kafka.tools.ProducerPerformance",
        "--bootstrap-server", ",".join(bootstrap), "--topic", topic,
        "--num-records", str(records), "--record-size", str(RECORD_BYTES),
        "--throughput", "-1", "--command-property", *props,
    )  # fmt: skip
    # only the last line, the whole run's, has percentiles (the progress lines do not)
    return numbers(PRODUCED.search(text), text)


async def consumer_performance(
    jars: Jars, bootstrap: Sequence[str], topic: str, records: int
) -> dict[str, Any]:
    text = await run_tool(
        jars, "org.apache.kafka.tools.ConsumerPerformance",
        "--bootstrap-server", ",".join(bootstrap), "--topic", topic,
        "--num-records", str(records), "--group", "bench-consumer-performance",
    )  # fmt: skip
    lines = [line for line in text.splitlines() if line.count(",") >= 9]
    header = next((line for line in lines if line.startswith("start.time")), None)
    if header is None or lines[-1] == header:
        raise AssertionError(f"no summary in ConsumerPerformance's output: {text[-2000:]}")
    row = dict(zip((h.strip() for h in header.split(",")), lines[-1].split(","), strict=True))
    return {
        "records": int(row["data.consumed.in.nMsg"]),
        "records_per_s": float(row["nMsg.sec"]),
        "fetch_records_per_s": float(row["fetch.nMsg.sec"]),
        "rebalance_ms": float(row["rebalance.time.ms"]),
    }


async def end_to_end_latency(
    jars: Jars, bootstrap: Sequence[str], topic: str, records: int
) -> dict[str, Any]:
    text = await run_tool(
        jars, "org.apache.kafka.tools.EndToEndLatency",
        ",".join(bootstrap), topic, str(records), "all", str(RECORD_BYTES),
    )  # fmt: skip
    return {
        "records": records,
        **numbers(E2E_AVERAGE.search(text), text),
        **numbers(E2E_PERCENTILES.search(text), text),
    }


async def run_tools(
    bootstrap: Sequence[str],
    create_topic: Callable[[str, int], Awaitable[None]],
    records: int,
    e2e_records: int,
) -> dict[str, Any]:
    """The three tools one after the other on one cluster: `records` produced and read back,
    `e2e_records` round trips; their summaries."""
    jars = await asyncio.to_thread(classpath)
    await create_topic("tools-perf", 1)
    await create_topic("tools-e2e", 1)
    produced = await producer_performance(jars, bootstrap, "tools-perf", records)
    consumed = await consumer_performance(jars, bootstrap, "tools-perf", records)
    return {
        "kafka_tools": jars.kafka_version,
        "producer_performance": produced,
        "consumer_performance": consumed,
        "end_to_end_latency": await end_to_end_latency(jars, bootstrap, "tools-e2e", e2e_records),
        "settings": {**PRODUCER_PROPS, "record_bytes": RECORD_BYTES, "replication": 3},
    }
