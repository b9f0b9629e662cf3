"""`raftbroker consume`: records to lines.

Starts at the end (as Kafka's console consumer), the beginning, an offset of one partition, or
N records before each partition's end (`--offset -N`); reads until `--max-messages`,
`--until-end` (the end of each partition as it was at the start), or `--timeout-ms` without a
record; then "Processed N records" on stderr (after Ctrl-C or SIGTERM too). A partition whose
leader is dead or moving is asked again meanwhile (as Kafka's console consumer refreshes
metadata until a leader answers); if one still has no leader answering when the time is up,
consume fails with one line naming it, rather than end as if it had been read to its end. How a
record prints (text fields, JSON) is cli/record_lines.py's.

`--from-time` starts each partition at its first record appended at that time or later (the
leader's log append time: ListOffsets by time), as kcat's `-o s@TIME`.

`--group G` reads as a member of consumer group G (cluster/client/group_consumer.py): the group
shares the partitions among its members, each partition starts at the group's committed
offset, and `--from-beginning` applies only where the group has none (as Kafka's console
consumer). Offsets are committed after the records are printed, so a crash delivers them again
rather than skips them; Ctrl-C or SIGTERM commits what was printed and leaves the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import typer

from cli.common import (
    BootstrapOption,
    CliError,
    DataDirOption,
    finish_on_interrupt,
    one_line_errors,
    plural,
    resolve_bootstrap,
    run,
    topic_partitions,
)
from cli.record_lines import TextFields, as_json
from cluster.client import (
    Admin,
    Client,
    CommitFailedError,
    ConsumedRecord,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    RetryPolicy,
)

SHORT_POLL_MS = 200


class Format(StrEnum):
    text = "text"
    json = "json"


class Isolation(StrEnum):
    """Kafka's isolation.level: read_committed (librdkafka's default) leaves out the records of
    aborted transactions and stops at the first of an open one (the last stable offset)."""

    read_committed = "read_committed"
    read_uncommitted = "read_uncommitted"


@dataclass(frozen=True, slots=True)
class Start:
    """Where each partition read starts: `offset` (EARLIEST, LATEST or an offset); when
    `back` is set, that many records before the partition's end (never before its start);
    when `time_ms` is set, the first record appended at that time or later."""

    offset: int = Consumer.LATEST
    back: int = 0
    time_ms: int | None = None


def parse_time(text: str, option: str = "--from-time") -> int:
    """A time option: ms since the epoch, or an ISO 8601 time (UTC when it names no zone)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(
            f"{option} {text!r} is neither ms since the epoch nor an ISO 8601 time "
            "(e.g. 2026-11-25T14:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0, round(moment.timestamp() * 1000))


# Kafka's words and kcat's for where to start, and kcat's `-o stored` (a group's commits).
NAMED_STARTS = {
    "earliest": Consumer.EARLIEST,
    "beginning": Consumer.EARLIEST,
    "latest": Consumer.LATEST,
    "end": Consumer.LATEST,
}
STORED = "stored"
OFFSET_WORDS = "N, -N, earliest/beginning, latest/end, stored (with --group) or s@TIME"


def parse_start(from_beginning: bool, offset: str | None, from_time: str | None = None) -> Start:
    """--from-beginning / --offset / --from-time as a Start; a CliError for what cannot mean
    one. An offset N applies to each partition read (kcat's `-o N`), -N counts back from each
    partition's end, s@TIME is --from-time TIME (kcat's), `stored` the group's commits (the
    start of a group member anyway: the default)."""
    if offset is not None and offset.startswith("s@"):
        if from_time is not None:
            raise CliError("use --offset s@TIME or --from-time, not both")
        from_time, offset = offset.removeprefix("s@"), None
    if from_time is not None:
        if from_beginning or offset is not None:
            raise CliError("use one of --from-beginning, --offset and --from-time")
        return Start(time_ms=parse_time(from_time))
    if offset is None or offset.lower() == STORED:
        return Start(Consumer.EARLIEST if from_beginning else Consumer.LATEST)
    if from_beginning:
        raise CliError("use --from-beginning or --offset, not both")
    if offset.lower() in NAMED_STARTS:
        return Start(NAMED_STARTS[offset.lower()])
    try:
        number = int(offset)
    except ValueError:
        raise CliError(f"--offset {offset!r} is not {OFFSET_WORDS}") from None
    if number < 0:
        return Start(back=-number)
    return Start(number)


def _check_group_options(
    group: str | None,
    offset: str | None,
    partition: int | None,
    from_time: str | None,
    until_end: bool,
) -> None:
    """With --group, where to start is the group's (its committed offsets; where it has none,
    the first or the last record): any other start is refused, and `stored` needs a group."""
    word = None if offset is None else offset.lower()
    if group is None:
        if word == STORED:
            raise CliError("--offset stored starts at a group's committed offsets: use --group")
        return
    if (
        partition is not None
        or from_time is not None
        or until_end
        or (word is not None and word != STORED and word not in NAMED_STARTS)
    ):
        raise CliError(
            "--group reads from the group's committed offsets and the partitions it assigns: "
            "not with --offset N, -N or s@TIME, --partition, --from-time or --until-end "
            "(raftbroker groups reset moves a group's offsets)"
        )


GROUP_DEFAULTS = GroupConfig()  # Kafka's member defaults, where a flag leaves one unset


@dataclass(frozen=True, slots=True)
class ConsumeOptions:
    topic: str
    group: str | None
    partitions: list[int] | None
    start: Start
    max_messages: int | None
    timeout_ms: int
    follow: bool
    until_end: bool
    render: Callable[[ConsumedRecord], str]
    session_timeout_ms: int = GROUP_DEFAULTS.session_timeout_ms
    read_committed: bool = True


@dataclass(slots=True)
class Tally:
    """Records printed so far: what the closing line reports, even after Ctrl-C."""

    printed: int = 0


async def _assign(
    client: Client, options: ConsumeOptions
) -> tuple[Consumer, dict[int, int] | None]:
    """A consumer at each partition's start; with --until-end, the end of each partition not
    already read to it (those at their end are not assigned: a fetch would wait on them)."""
    only = options.partitions[0] if options.partitions else None
    infos = await topic_partitions(client, options.topic, only)
    committed = options.read_committed
    admin, topic = Admin(client), options.topic
    consumer = Consumer(client, ConsumerConfig(read_committed=committed))
    ends: dict[int, int] | None = {} if options.until_end else None
    for partition in options.partitions or [i.partition for i in infos]:
        start = await _start_offset(
            admin,
            topic,
            partition,
            options.start,
            named=options.partitions is not None,
            read_committed=committed,
        )
        if ends is not None:
            end = await admin.list_offsets(
                topic, partition, Consumer.LATEST, read_committed=committed
            )
            if start >= end:
                continue
            ends[partition] = end
        await consumer.seek(topic, partition, start)
    return consumer, ends


async def _start_offset(
    admin: Admin, topic: str, partition: int, start: Start, *, named: bool, read_committed: bool
) -> int:
    """Where `partition` is read from. An offset N outside the partition's offsets fails
    naming them when the partition was `named` (--partition); applied to every partition
    (kcat's -o N), it starts a partition that lacks it at its nearer end. The end is the
    last stable offset for a read_committed reader (an open transaction's records are yet
    to come)."""
    if start.time_ms is not None:
        return await admin.list_offsets(topic, partition, start.time_ms)
    if not start.back and start.offset < 0:
        return await admin.list_offsets(
            topic, partition, start.offset, read_committed=read_committed
        )
    end = await admin.list_offsets(topic, partition, Consumer.LATEST, read_committed=read_committed)
    first = await admin.list_offsets(topic, partition, Consumer.EARLIEST)
    if start.back:
        return max(first, end - start.back)
    if not named:
        return min(max(first, start.offset), end)
    if not first <= start.offset <= end:
        raise CliError(
            f"--offset {start.offset} is out of range for {topic} partition {partition}: "
            f"it holds offsets {first} to {end - 1}, and {end} is its end"
            if end > first
            else f"--offset {start.offset} is out of range for {topic} partition {partition}: "
            f"it is empty, its end at offset {end}"
        )
    return start.offset


def _at_ends(consumer: Consumer, topic: str, ends: dict[int, int]) -> bool:
    return all(consumer.positions[(topic, p)].offset >= end for p, end in ends.items())


async def _consume(bootstrap: list[str], options: ConsumeOptions, tally: Tally) -> None:
    client = Client(bootstrap, retry=RetryPolicy(options.timeout_ms / 1000))
    if options.group is not None:
        await _consume_in_group(client, options.group, options, tally)
        return
    try:
        consumer, ends = await _assign(client, options)
        idle_since = time.monotonic()
        while options.max_messages is None or tally.printed < options.max_messages:
            if ends is not None and _at_ends(consumer, options.topic, ends):
                break
            idle_ms = round((time.monotonic() - idle_since) * 1000)
            # Short polls where the loop must look up often: a partition read to its end
            # would hold a long poll of its leader, and with it the others' records.
            short = options.follow or ends is not None
            records = await consumer.poll(
                SHORT_POLL_MS if short else max(0, options.timeout_ms - idle_ms)
            )
            if records:
                idle_since = time.monotonic()
            elif not options.follow and time.monotonic() - idle_since >= options.timeout_ms / 1000:
                stalled = consumer.stall_error()
                if stalled is not None:  # not read to its end: its leader never answered
                    raise stalled
                break
            if ends is not None:  # what was there when it started, no more
                records = [r for r in records if r.offset < ends[r.partition]]
            _print(records, options, tally)
    finally:
        await client.close()


async def _consume_in_group(
    client: Client, group: str, options: ConsumeOptions, tally: Tally
) -> None:
    """As a member of `group`: commit what was printed, after printing it; leave at the end.
    The idle timeout counts from the first assignment (joining a new group waits for the
    coordinator's initial rebalance delay)."""
    await topic_partitions(client, options.topic, None)
    reset = Consumer.EARLIEST if options.start.offset == Consumer.EARLIEST else Consumer.LATEST
    session_ms = options.session_timeout_ms
    config = GroupConfig(
        session_timeout_ms=session_ms,
        # Kafka's advice, a third of the session at most; its default, 3 s, at most.
        heartbeat_interval_ms=max(1, min(GROUP_DEFAULTS.heartbeat_interval_ms, session_ms // 3)),
        client_id="raftbroker-consume",
        auto_offset_reset=reset,
    )
    member = GroupConsumer(
        client,
        group,
        [options.topic],
        config,
        ConsumerConfig(read_committed=options.read_committed),
    )
    uncommitted: dict[tuple[str, int], int] = {}
    try:
        idle_since = time.monotonic()
        while options.max_messages is None or tally.printed < options.max_messages:
            records = await member.poll(SHORT_POLL_MS)
            if records or not member.rebalances:
                idle_since = time.monotonic()
            elif not options.follow and time.monotonic() - idle_since >= options.timeout_ms / 1000:
                break
            uncommitted = _next_offsets(_print(records, options, tally))
            await _commit(member, uncommitted)
            uncommitted = {}
    except asyncio.CancelledError:  # Ctrl-C or SIGTERM: commit what was printed, then leave
        finish_on_interrupt()
        await _commit(member, uncommitted)
    finally:
        await member.close()
        await client.close()


async def _commit(member: GroupConsumer, offsets: dict[tuple[str, int], int]) -> None:
    if offsets:
        with contextlib.suppress(CommitFailedError):  # delivered again: at least once
            await member.commit(offsets)


def _next_offsets(records: list[ConsumedRecord]) -> dict[tuple[str, int], int]:
    """What to commit after `records`: per partition, the offset after its last one."""
    offsets: dict[tuple[str, int], int] = {}
    for r in records:
        offsets[(r.topic, r.partition)] = max(offsets.get((r.topic, r.partition), 0), r.offset + 1)
    return offsets


def _print(
    records: list[ConsumedRecord], options: ConsumeOptions, tally: Tally
) -> list[ConsumedRecord]:
    """Print records (up to --max-messages); those printed."""
    printed = []
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        if options.max_messages is not None and tally.printed >= options.max_messages:
            break
        sys.stdout.write(options.render(record) + "\n")
        tally.printed += 1
        printed.append(record)
    sys.stdout.flush()
    return printed


def consume(
    topic: str = typer.Argument(..., metavar="TOPIC", help="The topic to read."),
    from_beginning: bool = typer.Option(
        False, "--from-beginning", help="Start at each partition's first record."
    ),
    offset: str | None = typer.Option(
        None,
        "--offset",
        "-o",
        metavar="N|-N|beginning|end|stored|s@TIME",
        help="Where to start: offset N of each partition read, -N: N records before each "
        "partition's end, earliest (or beginning), latest (or end), s@TIME as --from-time, "
        "stored: a group's committed offsets. Default: latest, as Kafka's console consumer; "
        "with --group, stored.",
    ),
    from_time: str | None = typer.Option(
        None,
        "--from-time",
        metavar="TIME",
        help="Start at each partition's first record appended at TIME or later: ms since the "
        "epoch, or ISO 8601 (2026-11-25T14:00:00Z; UTC when no zone is given).",
    ),
    partition: int | None = typer.Option(
        None, "--partition", "-p", min=0, metavar="N", help="Read partition N only. Default: all."
    ),
    max_messages: int | None = typer.Option(
        None, "--max-messages", min=1, metavar="N", help="Stop after N records."
    ),
    until_end: bool = typer.Option(
        False,
        "--until-end",
        "-e",
        help="Stop at the end of each partition as it was at the start (kcat's -e).",
    ),
    timeout_ms: int = typer.Option(
        2_000,
        "--timeout-ms",
        min=0,
        metavar="MS",
        help="Stop after this long without a record (with --until-end: fail if a partition "
        "has no leader answering this long).",
    ),
    follow: bool = typer.Option(False, "--follow", help="Keep waiting for new records."),
    group: str | None = typer.Option(
        None,
        "--group",
        "-g",
        metavar="GROUP",
        help="Read as a member of consumer group GROUP: from its committed offsets (with "
        "--from-beginning, the first record where it has none), sharing the partitions with "
        "its other members; commits after printing.",
    ),
    session_timeout_ms: int | None = typer.Option(
        None,
        "--session-timeout-ms",
        min=2,  # a heartbeat, a millisecond at least, must fit inside it
        metavar="MS",
        help="With --group: how long the group waits for this member, if it stops without "
        "leaving, before its partitions go to others (Kafka's session.timeout.ms; default "
        "45000; the coordinator allows 6000 to 1800000 unless configured otherwise).",
    ),
    isolation_level: Isolation = typer.Option(
        Isolation.read_committed,
        "--isolation-level",
        help="read_committed: no records of aborted transactions, none past an open one; "
        "read_uncommitted: every record.",
    ),
    output: Format = typer.Option(
        Format.text,
        "--format",
        help="text: the value, after the --print-* fields, tab-separated. json: one object per "
        "record with topic, partition, offset, timestamp (ms), key, value, headers, producer_id, "
        "sequence; a key or value that is not UTF-8 comes as key_base64 / value_base64.",
    ),
    print_key: bool = typer.Option(
        False, "--print-key", help="text: the key (a null key prints as the null literal)."
    ),
    print_timestamp: bool = typer.Option(
        False, "--print-timestamp", help="text: CreateTime:<ISO 8601 UTC>."
    ),
    print_partition: bool = typer.Option(False, "--print-partition", help="text: Partition:N."),
    print_offset: bool = typer.Option(False, "--print-offset", help="text: Offset:N."),
    print_headers: bool = typer.Option(
        False, "--print-headers", help="text: NAME=VALUE,... (NO_HEADERS if none)."
    ),
    null_literal: str = typer.Option(
        "null", "--null-literal", metavar="STR", help="text: how a null key or value prints."
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
) -> None:
    """Print records of a topic (from the end by default, as Kafka's console consumer).

    At the end, "Processed N records" on stderr."""
    if follow and until_end:
        raise CliError("use --follow or --until-end, not both")
    _check_group_options(group, offset, partition, from_time, until_end)
    if session_timeout_ms is not None and group is None:
        raise CliError("--session-timeout-ms is a group member's setting: use it with --group")
    fields = TextFields(
        print_timestamp, print_partition, print_offset, print_headers, print_key, null_literal
    )
    options = ConsumeOptions(
        topic,
        group,
        None if partition is None else [partition],
        parse_start(from_beginning, offset, from_time),
        max_messages,
        timeout_ms,
        follow,
        until_end,
        as_json if output is Format.json else fields.render,
        session_timeout_ms or GROUP_DEFAULTS.session_timeout_ms,
        isolation_level is Isolation.read_committed,
    )
    tally = Tally()
    with contextlib.suppress(KeyboardInterrupt):
        run(_consume(resolve_bootstrap(bootstrap, data_dir), options, tally))
    typer.echo(f"Processed {plural(tally.printed, 'record')}", err=True)


consume = one_line_errors(consume)
