"""Transactions: librdkafka's transactional producer and read_committed consumer against
raftbroker's Kafka listener and against Apache Kafka itself, the same cases, in one run.

Role: the measured answer to issue 37's speed section. Run it as `python -m bench.kafka_txns
[--quick] [--out FILE] [--brokers raftbroker,apache-kafka]`; one JSON object on stdout
(progress on stderr), exit 1 if a case failed (a goal missed is a result). Each broker gets a
fresh 3-node cluster (replication 3, `bench.kafka.fresh_brokers`) for all its cases, one
broker after the other.

Cases (100-byte values, `bench.harness.value_of`; confluent-kafka, librdkafka in Python, for
every producing case, so that the ratios compare one client with itself):
- plain: the non-transactional baseline, an idempotent producer (`acks=all`, `linger.ms` 5)
  pipelining 300,000 records over the same 4 partitions: records/s.
- txn_100: sequential transactions of 100 records (begin, produce, commit): commit latency
  (the `commit_transaction` call, which flushes the records and ends the transaction) p50
  and p99, and records/s over the whole run; the same with 10,000 records a transaction
  (`txn_10000`).
- sequential: one idempotent record at a time (`linger.ms` 0, produce, flush): p50, the unit
  a commit's latency is stated in.
- consume: kcat reads a transactional topic (300 transactions of 1,000 records, every tenth
  aborted, its data in the log before its abort) from the beginning, read_committed then
  read_uncommitted, the median of three reads each: records/s of what each level returns
  (`queued.min.messages` 1,000,000 on both brokers: bench.kafka's CONSUME_SETTINGS says why).
- ctp: consume-transform-produce exactly once (a read_committed consumer in a group, each
  record transformed to one output, offsets sent to the transaction, a commit every
  100 ms): input records/s.

Goals (issue 37): 100-record transactions reach >= 50% of `plain`'s records/s; a commit's p50
within 3 Raft round trips of a sequential produce's (stated here as commit p50 <= 3 x the
sequential p50: a sequential produce is one round trip and its client's costs); read_committed
>= 90% of read_uncommitted on the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.harness import (
    emit,
    latency_summary_ms,
    load_average,
    reporter,
    run_header,
    run_loop,
    value_of,
)
from bench.kafka import (
    BROKERS,
    Brokers,
    Failures,
    consume_case,
    describe_brokers,
    fresh_brokers,
    producer_config,
    sequential_latencies,
)

TXN_TIMEOUT_MS = 60_000
CALL_TIMEOUT_S = 60.0
ABORT_EVERY = 10  # the consume case's data: every tenth transaction aborted
CONSUME_TXN_RECORDS = 1_000  # ... of this many records each
CTP_COMMIT_INTERVAL_S = 0.1
CTP_TIMEOUT_S = 300.0

progress = reporter("bench.kafka_txns")


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    plain: int  # records of the non-transactional baseline
    txn_100: int  # transactions of 100 records
    txn_10000: int  # transactions of 10,000 records
    sequential: int
    ctp_records: int
    consume_transactions: int  # of CONSUME_TXN_RECORDS records each

    @classmethod
    def of(cls, quick: bool) -> Settings:
        if quick:
            return cls(True, 50_000, 30, 2, 100, ctp_records=5_000, consume_transactions=30)
        return cls(False, 300_000, 300, 10, 1_000, ctp_records=50_000, consume_transactions=300)


def transactional(bench: Brokers, txn_id: str) -> Producer:
    producer = Producer(
        {
            **producer_config(bench.bootstrap, 5),
            "transactional.id": txn_id,
            "transaction.timeout.ms": TXN_TIMEOUT_MS,
            "on_delivery": Failures(),
        }
    )
    producer.init_transactions(CALL_TIMEOUT_S)
    return producer


def transactions(
    producer: Producer, topic: str, count: int, size: int, *, abort_every: int = 0
) -> dict[str, Any]:
    """`count` sequential transactions of `size` records: commit latencies and records/s."""
    commits: list[float] = []
    start = time.perf_counter()
    for n in range(count):
        producer.begin_transaction()
        for i in range(size):
            producer.produce(topic, value_of(n * size + i), partition=(n + i) % 4)
        at = time.perf_counter()
        if abort_every and n % abort_every == abort_every - 1:
            producer.flush(CALL_TIMEOUT_S)  # its records in the log, then aborted (not purged)
            producer.abort_transaction(CALL_TIMEOUT_S)
            continue
        producer.commit_transaction(CALL_TIMEOUT_S)
        commits.append(time.perf_counter() - at)
    seconds = time.perf_counter() - start
    return {
        "transactions": count,
        "records_per_transaction": size,
        "seconds": round(seconds, 3),
        "records_per_s": round(count * size / seconds),
        "commit": latency_summary_ms(commits),
    }


def plain(bench: Brokers, topic: str, records: int) -> dict[str, Any]:
    failures = Failures()
    producer = Producer({**producer_config(bench.bootstrap, 5), "on_delivery": failures})
    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value_of(i), partition=i % 4)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(CALL_TIMEOUT_S)
    seconds = time.perf_counter() - start
    if left or failures.errors:
        raise AssertionError(f"{left} unacknowledged, errors {failures.errors[:3]}")
    return {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
    }


def ctp(bench: Brokers, source: str, sink: str, records: int) -> dict[str, Any]:
    """Read `records` committed records of `source` in a group and write one output each to
    `sink`, offsets in the transaction, committing every CTP_COMMIT_INTERVAL_S."""
    consumer = Consumer(
        {
            "bootstrap.servers": ",".join(bench.bootstrap),
            "group.id": "bench-ctp",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([source])
    producer = transactional(bench, "bench-ctp")
    done, transactions_done = 0, 0
    deadline = time.monotonic() + CTP_TIMEOUT_S
    start: float | None = None
    try:
        while done < records:
            assert time.monotonic() < deadline, f"ctp: {done} of {records} in time"
            producer.begin_transaction()
            ends = time.monotonic() + CTP_COMMIT_INTERVAL_S
            batch = 0
            while time.monotonic() < ends and done + batch < records:
                for message in consumer.consume(500, 0.05):
                    if message.error() is None:
                        start = start or time.perf_counter()
                        producer.produce(sink, b"t" + bytes(message.value() or b""))
                        batch += 1
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(
                positions, consumer.consumer_group_metadata(), CALL_TIMEOUT_S
            )
            producer.commit_transaction(CALL_TIMEOUT_S)
            done += batch
            transactions_done += 1
    finally:
        consumer.close()
    seconds = time.perf_counter() - (start or time.perf_counter())
    return {
        "records": done,
        "transactions": transactions_done,
        "commit_interval_ms": round(CTP_COMMIT_INTERVAL_S * 1000),
        "records_per_s": round(done / seconds) if seconds > 0 else 0,
    }


def end_offsets(bench: Brokers, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": ",".join(bench.bootstrap), "group.id": "bench-ends"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), CALL_TIMEOUT_S)[1]
            for p in range(4)
        )
    finally:
        consumer.close()


async def run_broker(name: str, settings: Settings) -> dict[str, Any]:
    report: dict[str, Any] = {"cluster": describe_brokers(name)}
    async with fresh_brokers(name) as bench:
        for topic in ("txn-plain", "txn-100", "txn-10000", "txn-data", "txn-out", "txn-seq"):
            await bench.create_topic(topic, 1 if topic == "txn-seq" else 4)
        progress(f"{name}: plain, {settings.plain} records")
        report["plain"] = await asyncio.to_thread(plain, bench, "txn-plain", settings.plain)
        producer = await asyncio.to_thread(transactional, bench, "bench-txn")
        progress(f"{name}: {settings.txn_100} transactions of 100 records")
        report["txn_100"] = await asyncio.to_thread(
            transactions, producer, "txn-100", settings.txn_100, 100
        )
        progress(f"{name}: {settings.txn_10000} transactions of 10,000 records")
        report["txn_10000"] = await asyncio.to_thread(
            transactions, producer, "txn-10000", settings.txn_10000, 10_000
        )
        progress(f"{name}: sequential")
        sequential_producer = Producer(producer_config(bench.bootstrap, 0))
        latencies = await asyncio.to_thread(
            sequential_latencies, sequential_producer, "txn-seq", settings.sequential
        )
        report["sequential"] = {"records": len(latencies), **latency_summary_ms(latencies)}
        progress(f"{name}: consume data, every {ABORT_EVERY}th transaction aborted")
        count, size = settings.consume_transactions, CONSUME_TXN_RECORDS
        await asyncio.to_thread(
            transactions, producer, "txn-data", count, size, abort_every=ABORT_EVERY
        )
        committed = (count - count // ABORT_EVERY) * size
        report["consume"] = {}
        for isolation, records in (
            ("read_committed", committed),
            ("read_uncommitted", count * size),
        ):
            read = await consume_case(bench, "txn-data", 4, records, isolation=isolation)
            report["consume"][isolation] = {"isolation": isolation, **read}
        progress(f"{name}: consume-transform-produce, {settings.ctp_records} records")
        source_records = settings.txn_100 * 100 + settings.txn_10000 * 10_000
        report["ctp"] = await asyncio.to_thread(
            ctp, bench, "txn-10000", "txn-out", min(settings.ctp_records, source_records)
        )
    report["goals"] = goals(report)
    return report


def goals(report: dict[str, Any]) -> dict[str, Any]:
    txn_rate, plain_rate = report["txn_100"]["records_per_s"], report["plain"]["records_per_s"]
    commit_p50 = report["txn_100"]["commit"]["p50_ms"]
    sequential_p50 = report["sequential"]["p50_ms"]
    committed = report["consume"]["read_committed"]["records_per_s"]
    uncommitted = report["consume"]["read_uncommitted"]["records_per_s"]
    return {
        "txn_100_vs_plain": round(txn_rate / plain_rate, 3),
        "txn_100_vs_plain_met": txn_rate >= 0.5 * plain_rate,
        "commit_p50_vs_sequential_p50": round(commit_p50 / sequential_p50, 2),
        "commit_p50_met": commit_p50 <= 3 * sequential_p50,
        "read_committed_vs_uncommitted": round(committed / uncommitted, 3),
        "read_committed_met": committed >= 0.9 * uncommitted,
    }


async def run(settings: Settings, brokers: tuple[str, ...]) -> dict[str, Any]:
    started, load = datetime.now(UTC), load_average()
    report: dict[str, Any] = {"quick": settings.quick, "errors": {}}
    for name in brokers:
        try:
            report[name.replace("-", "_")] = await run_broker(name, settings)
        except Exception as exc:  # noqa: BLE001 - reported; the other broker still runs
            report["errors"][name] = repr(exc)
    return {**run_header(started, load), **report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_txns", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--brokers", default=",".join(BROKERS))
    args = parser.parse_args(argv)
    brokers = tuple(b for b in args.brokers.split(",") if b)
    if set(brokers) - set(BROKERS):
        parser.error(f"--brokers: of {', '.join(BROKERS)}")
    report = run_loop(run(Settings.of(args.quick), brokers))
    return emit(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
