"""`raftbroker produce`: one record per input line.

One record per input line (stdin by default, or `--file`), idempotent by default, or the whole
input as one transaction with `--transactional-id`; how a line
becomes a record (key separator, null marker, headers) is cli/record_lines.py's. Each line goes
out as soon as it is whole (from a pipe that stays open too: `tail -f log | raftbroker produce
T`). It ends with a summary and exits non-zero if any record was not acknowledged; a line that
cannot be sent (no key separator, too large) stops the run, and the one error line says so and
what came of the records before it. A record may wait up to `--timeout-ms` for its
acknowledgement, riding out dead nodes and leader changes meanwhile. Ctrl-C or SIGTERM stops
the reading; what was sent is still acknowledged, and the summary says it was interrupted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import typer
from rich.progress import Progress

from cli.common import (
    BootstrapOption,
    CliError,
    DataDirOption,
    fail,
    finish_on_interrupt,
    one_line_errors,
    plural,
    resolve_bootstrap,
    run,
    topic_partitions,
)
from cli.record_lines import LineFormat, parse_headers
from cluster.client import (
    Client,
    ClientError,
    Producer,
    ProducerConfig,
    RecordMetadata,
    RetryPolicy,
    TransactionalProducer,
    TxnAbortableError,
)
from statemachine.errors import ErrorCode

READ_HINT_BYTES = 1 << 20
READ_AHEAD_CHUNKS = 4  # chunks read ahead of the producer: a few MiB at most


@dataclass(slots=True)
class ProduceSummary:
    acked: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    sent: int = 0
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: str = ""  # why the run stopped before the end of its input
    interrupted: bool = False  # Ctrl-C or SIGTERM: the input was read no further
    transaction: str = ""  # with --transactional-id: "committed", or why it was aborted

    def record(self, future: asyncio.Future[RecordMetadata]) -> None:
        self._count(future)
        if self.acked + self.failed == self.sent:
            self.settled.set()

    def _count(self, future: asyncio.Future[RecordMetadata]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
            name = type(future.exception()).__name__ if not future.cancelled() else "cancelled"
            error = future.exception()
            key = str(error) if isinstance(error, ClientError) else name
            self.errors[key] = self.errors.get(key, 0) + 1
            return
        meta = future.result()
        self.acked += 1
        first, last = self.offsets.get(meta.partition, (meta.offset, meta.offset))
        self.offsets[meta.partition] = (min(first, meta.offset), max(last, meta.offset))


async def _lines(stream: IO[bytes]) -> AsyncIterator[bytes]:
    """Lines from a file or stdin, each as soon as it is whole, without blocking the event
    loop: a daemon thread reads (`_read_lines`). A read that waits for ever (`tail -f log |
    raftbroker produce`, a terminal) must not keep the process from ending on Ctrl-C or
    SIGTERM, as a thread of the loop's executor would (the loop waits for those at its close)."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[list[bytes] | OSError] = asyncio.Queue(READ_AHEAD_CHUNKS)
    reader = threading.Thread(target=_read_lines, args=(stream.fileno(), loop, chunks), daemon=True)
    reader.start()
    while True:
        chunk = await chunks.get()
        if isinstance(chunk, OSError):
            raise chunk
        if not chunk:
            return
        for line in chunk:
            yield line.rstrip(b"\r")


def _read_lines(
    fd: int, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[list[bytes] | OSError]
) -> None:
    """The reading thread: the whole lines of each read into `chunks` (a read returns what is
    there, up to READ_HINT_BYTES: lines from a pipe go on at once), the last line without its
    newline at the end, then an empty list; a failure as it is. It reads the descriptor, not
    a buffered file: a daemon thread waiting in a file's read holds its lock, and the
    interpreter aborts at exit on that lock."""
    pending = b""
    while True:
        try:
            data = os.read(fd, READ_HINT_BYTES)
        except OSError as exc:
            _hand_over(loop, chunks, exc)
            return
        if not data:
            if pending:
                _hand_over(loop, chunks, [pending])
            _hand_over(loop, chunks, [])
            return
        *lines, pending = (pending + data).split(b"\n")
        if lines and not _hand_over(loop, chunks, lines):
            return


def _hand_over(
    loop: asyncio.AbstractEventLoop,
    chunks: asyncio.Queue[list[bytes] | OSError],
    chunk: list[bytes] | OSError,
) -> bool:
    """Put `chunk` in the loop's queue, waiting while it is full; False once the loop is gone."""
    try:
        asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop).result()
    except (RuntimeError, concurrent.futures.CancelledError):  # the command has ended
        return False
    return True


@dataclass(frozen=True, slots=True)
class ProduceOptions:
    topic: str
    lines: LineFormat
    headers: tuple[tuple[str, bytes], ...]
    partition: int | None
    source: str  # "stdin", or the file's name: where a bad line is


async def _produce(
    bootstrap: list[str],
    options: ProduceOptions,
    stream: IO[bytes],
    config: ProducerConfig,
    progress: Callable[[int], None],
) -> ProduceSummary:
    """Send each line; at a line that cannot be sent, stop reading (what was sent before it
    is still delivered) and note why in the summary."""
    summary = ProduceSummary()
    client = Client(bootstrap, retry=RetryPolicy(config.delivery_timeout_ms / 1000))
    try:
        await topic_partitions(client, options.topic, options.partition)
        if config.transactional_id:
            await _produce_transaction(client, options, stream, config, progress, summary)
        else:
            async with Producer(client, config) as producer:
                try:
                    await _send_lines(producer, options, stream, progress, summary)
                except asyncio.CancelledError:  # Ctrl-C or SIGTERM: what was sent is delivered
                    finish_on_interrupt()
                    summary.interrupted = True
        if summary.sent:
            await summary.settled.wait()  # every future is done: only its callback is pending
    finally:
        await client.close()
    return summary


async def _produce_transaction(
    client: Client,
    options: ProduceOptions,
    stream: IO[bytes],
    config: ProducerConfig,
    progress: Callable[[int], None],
    summary: ProduceSummary,
) -> None:
    """The whole input as one transaction (as kcat's -X transactional.id): committed at its
    end, aborted if a line stops the run, a record fails or the run is interrupted, so a
    read_committed reader sees all of it or none."""
    async with TransactionalProducer(client, config.transactional_id, config) as producer:
        producer.begin()
        try:
            await _send_lines(producer, options, stream, progress, summary)
        except asyncio.CancelledError:  # Ctrl-C or SIGTERM: none of it is committed
            finish_on_interrupt()
            summary.interrupted = True
        if summary.stopped or summary.interrupted:
            summary.transaction = "aborted: the input was not read to its end"
        else:
            try:
                await producer.commit()
                summary.transaction = "committed"
            except TxnAbortableError as exc:
                summary.transaction = f"aborted: {exc.message}"
        if producer.in_transaction:
            await producer.abort()


async def _send_lines(
    producer: Producer | TransactionalProducer,
    options: ProduceOptions,
    stream: IO[bytes],
    progress: Callable[[int], None],
    summary: ProduceSummary,
) -> None:
    number = 0
    async for line in _lines(stream):
        number += 1
        progress(len(line) + 1)
        where = f"line {number} of {options.source}"
        try:
            future = await _send(producer, options, line, where)
        except CliError as exc:
            summary.stopped = str(exc)
            return
        summary.sent += 1
        future.add_done_callback(summary.record)


async def _send(
    producer: Producer | TransactionalProducer, options: ProduceOptions, line: bytes, where: str
) -> asyncio.Future[RecordMetadata]:
    key, value = options.lines.split(line, where)
    try:
        return await producer.send(
            options.topic, value, key, headers=options.headers, partition=options.partition
        )
    except ClientError as exc:
        if exc.error != ErrorCode.MESSAGE_TOO_LARGE:
            raise
        raise CliError(f"{where}: {exc.message}, see docs/semantics.md, Limits") from None


def produce(
    topic: str = typer.Argument(..., metavar="TOPIC", help="The topic to write to."),
    file: Path | None = typer.Option(
        None, "--file", "-f", metavar="FILE", help="Read lines from FILE instead of stdin."
    ),
    key_separator: str | None = typer.Option(
        None,
        "--key-separator",
        "-K",
        metavar="SEP",
        help="Each line is KEY<SEP>VALUE, split at the first SEP; a line without SEP is an "
        "error. \\t, \\\\ and \\xHH in SEP mean their character. Default: no keys.",
    ),
    header: list[str] | None = typer.Option(
        None,
        "--header",
        "-H",
        metavar="NAME=VALUE",
        help="A header on every record (repeatable).",
    ),
    null_marker: str | None = typer.Option(
        None,
        "--null-marker",
        metavar="STR",
        help="A key or value equal to STR is produced as null (a null value: a tombstone).",
    ),
    transactional_id: str | None = typer.Option(
        None,
        "--transactional-id",
        metavar="ID",
        help="Write the whole input as one transaction of this transactional id (as kcat's "
        "-X transactional.id): committed at its end, aborted if any line or record fails, so a "
        "read_committed consumer reads all of it or none. A newer producer with the same id "
        "fences this one.",
    ),
    partition: int | None = typer.Option(
        None,
        "--partition",
        min=0,
        metavar="N",
        help="Write every record to partition N. Default: by key hash, round robin without keys.",
    ),
    timeout_ms: int = typer.Option(
        120_000,
        "--timeout-ms",
        min=1,
        metavar="MS",
        help="How long a record may wait for its acknowledgement (riding out failovers).",
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
) -> None:
    """Produce one record per line of stdin (or --file); idempotent."""
    options = ProduceOptions(
        topic,
        LineFormat.of(key_separator, null_marker),
        parse_headers(header or []),
        partition,
        "stdin" if file is None else str(file),
    )
    addresses = resolve_bootstrap(bootstrap, data_dir)
    config = ProducerConfig(transactional_id=transactional_id or "", delivery_timeout_ms=timeout_ms)
    if file is None:
        summary = run(_produce(addresses, options, sys.stdin.buffer, config, lambda _n: None))
    else:
        with file.open("rb") as stream, Progress(transient=True) as bar:
            task = bar.add_task(f"producing {file.name}", total=file.stat().st_size)
            summary = run(
                _produce(addresses, options, stream, config, lambda n: bar.advance(task, n))
            )
    _report(topic, summary)


def _report(topic: str, summary: ProduceSummary) -> None:
    """The summary line; or, if a line stopped the run, one error line saying what came of
    the records before it."""
    spans = ", ".join(f"{p}: {a}..{b}" for p, (a, b) in sorted(summary.offsets.items()))
    if summary.transaction.startswith("aborted"):
        stopped = f"{summary.stopped}; " if summary.stopped else ""
        fail(
            f"{stopped}the transaction was {summary.transaction}; none of its "
            f"{plural(summary.sent, 'record')} will be read by a read_committed consumer"
        )
    if summary.stopped:
        before = f"{plural(summary.acked, 'record')} before it acknowledged"
        failed = f", {summary.failed} not" if summary.failed else ""
        fail(f"{summary.stopped}; {before}{failed}")
    interrupted = "; interrupted: the rest of the input was not read" if summary.interrupted else ""
    if summary.transaction:
        interrupted += "; in one transaction, committed"
    typer.echo(
        f"{plural(summary.acked, 'record')} acknowledged to {topic} "
        f"({plural(len(summary.offsets), 'partition')}{'; offsets ' + spans if spans else ''})"
        f"{interrupted}",
        err=True,
    )
    if summary.failed:
        reasons = ", ".join(f"{k} x{v}" for k, v in summary.errors.items())
        were = "was" if summary.failed == 1 else "were"
        fail(f"{plural(summary.failed, 'record')} {were} not acknowledged: {reasons}")


produce = one_line_errors(produce)
