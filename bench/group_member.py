"""One member of a consumer group, in a process of its own, for `bench.groups`.

Role: a consumer that `bench.groups` starts, stops (SIGTERM: it leaves its group) and crashes
(SIGKILL), and that reports what it reads as lines on stdout, stamped with CLOCK_MONOTONIC
(system-wide on Linux, so the parent compares them with its own clock). Two kinds:

- `kafka`: a confluent-kafka (librdkafka) consumer in a group, subscribed to one topic, with
  the client's default auto-commit (every 5 s, of what earlier polls returned).
- `jetstream`: a nats-py pull subscriber bound to one durable consumer with explicit acks; it
  acknowledges a batch when it has fetched the next one, as auto-commit commits at the next
  poll, so a crash leaves its last batch unacknowledged, to be redelivered after `ack_wait`.

Lines (space-separated):
- `assign T P,P,...` (kafka): the partitions it was just given (`assign T` for none);
- `got T N P:O ...` (kafka): N records read at T, the last offset read of each partition;
- `got T N [S,S,...]` (jetstream): N messages read at T and, with `--report-seqs`, their stream
  sequence numbers;
- `ack T S,S,...` (jetstream, with `--report-seqs`): written just before those are acknowledged,
  so a seq that is reported acknowledged may not be; never the other way round.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import nats
import nats.errors
from confluent_kafka import Consumer, TopicPartition

KAFKA_BATCH = 10_000
POLL_TIMEOUT_S = 0.1


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def now() -> str:
    return f"{time.monotonic():.6f}"


class Stop:
    """Set by SIGTERM: the member leaves its group and exits."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._set)

    def _set(self, _signum: int, _frame: Any) -> None:
        self.requested = True


def kafka_member(args: argparse.Namespace) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": args.heartbeat_interval_ms,
            "auto.offset.reset": "earliest",
            **({"debug": args.debug} if args.debug else {}),
        }
    )

    def on_assign(_consumer: Any, partitions: list[TopicPartition]) -> None:
        emit(f"assign {now()} {','.join(str(p.partition) for p in partitions)}".rstrip())

    consumer.subscribe([args.topic], on_assign=on_assign)
    stop = Stop()
    try:
        while not stop.requested:
            read(consumer.consume(num_messages=KAFKA_BATCH, timeout=POLL_TIMEOUT_S))
    finally:
        consumer.close()


def read(messages: list[Any]) -> None:
    if not messages:
        return
    at = now()
    last: dict[int, int] = {}
    count = 0
    for message in messages:
        if message.error() is None:  # not one of librdkafka's events
            last[message.partition()] = message.offset()
            count += 1
    emit(f"got {at} {count} " + " ".join(f"{p}:{o}" for p, o in sorted(last.items())))


async def jetstream_member(args: argparse.Namespace) -> None:
    nc = await nats.connect(servers=args.servers.split(","), connect_timeout=2)
    sub = await nc.jetstream(timeout=5).pull_subscribe_bind(args.durable, stream=args.stream)
    stop, held = Stop(), list[Any]()
    try:
        while not stop.requested:
            try:
                msgs = await sub.fetch(args.batch, timeout=1.0)
            except nats.errors.TimeoutError:
                msgs = []
            if held:
                if args.report_seqs:
                    emit(f"ack {now()} {seqs(held)}")
                for msg in held:
                    await msg.ack()
            if msgs:
                emit(f"got {now()} {len(msgs)} {seqs(msgs) if args.report_seqs else ''}".rstrip())
            held = msgs
    finally:
        await asyncio.wait_for(nc.close(), 5)


def seqs(msgs: list[Any]) -> str:
    return ",".join(str(m.metadata.sequence.stream) for m in msgs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.group_member", description=__doc__)
    kinds = parser.add_subparsers(dest="kind", required=True)
    kafka = kinds.add_parser("kafka")
    kafka.add_argument("--bootstrap", required=True)
    kafka.add_argument("--topic", required=True)
    kafka.add_argument("--group", required=True)
    kafka.add_argument("--session-timeout-ms", type=int, required=True)
    kafka.add_argument("--heartbeat-interval-ms", type=int, required=True)
    kafka.add_argument("--debug", default="", help="librdkafka's debug contexts (cgrp: the group)")
    jetstream = kinds.add_parser("jetstream")
    jetstream.add_argument("--servers", required=True)
    jetstream.add_argument("--stream", required=True)
    jetstream.add_argument("--durable", required=True)
    jetstream.add_argument("--batch", type=int, required=True)
    jetstream.add_argument("--report-seqs", action="store_true")
    args = parser.parse_args(argv)
    if args.kind == "kafka":
        kafka_member(args)
    else:
        asyncio.run(jetstream_member(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
