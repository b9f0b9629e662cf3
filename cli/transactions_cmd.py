"""`raftbroker transactions ...`: list, describe, find hanging transactions and abort them.

As Kafka's `kafka-transactions.sh`: `list` asks every node for the transactional ids it
coordinates, `describe` one id's transaction at its coordinator, `find-hanging` the
transactions a topic's partitions hold open that their coordinator does not (past the largest
transaction timeout), and `abort` writes an abort marker for one, named by its first offset
(`--start-offset`, what find-hanging prints) or by its producer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import typer
from rich.table import Table

from cli.common import (
    BootstrapOption,
    CliError,
    DataDirOption,
    JsonOption,
    console,
    one_line_errors,
    resolve_bootstrap,
)
from cli.topic_cmd import TimeoutOption, TopicArgument, with_admin
from cluster.client.txn_admin import MAX_TRANSACTION_TIMEOUT_MS, Transactions

app = typer.Typer(help="List and describe transactions; find hanging ones and abort them.",
                  no_args_is_help=True)  # fmt: skip
T = TypeVar("T")


def with_txns(
    bootstrap: list[str], timeout_ms: int, action: Callable[[Transactions], Awaitable[T]]
) -> T:
    return with_admin(bootstrap, timeout_ms, lambda admin: action(Transactions(admin.cluster)))


@app.command("list")
@one_line_errors
def list_transactions(
    state: list[str] | None = typer.Option(
        None, "--state", metavar="STATE", help="Only in STATE (Ongoing, PrepareCommit, ...)."
    ),
    producer_id: list[int] | None = typer.Option(
        None, "--producer-id", min=0, metavar="PID", help="Only of producer PID."
    ),
    running_ms: int = typer.Option(
        -1, "--running-longer-than-ms", min=-1, metavar="MS", help="Only open for over MS."
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Every transactional id with its producer id and state."""
    listed = with_txns(
        resolve_bootstrap(bootstrap, data_dir),
        timeout_ms,
        lambda t: t.list(state or (), producer_id or (), running_ms),
    )
    if as_json:
        typer.echo(json.dumps([t._asdict() for t in listed], indent=2))
        return
    for t in listed:
        typer.echo(f"{t.transactional_id}\t{t.producer_id}\t{t.state}")


@app.command("describe")
@one_line_errors
def describe(
    transactional_id: str = typer.Argument(..., metavar="ID", help="The transactional id."),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """An id's producer and transaction: its state, timeout, start and partitions."""
    d = with_txns(
        resolve_bootstrap(bootstrap, data_dir), timeout_ms, lambda t: t.describe(transactional_id)
    )
    row = {
        "transactional_id": d.transactional_id,
        "producer_id": d.producer_id,
        "producer_epoch": d.producer_epoch,
        "state": d.state,
        "timeout_ms": d.timeout_ms,
        "start_ms": d.start_ms,
        "partitions": [f"{x.topic}-{x.partition}" for x in d.partitions],
    }
    if as_json:
        typer.echo(json.dumps(row, indent=2))
        return
    for name, value in row.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        typer.echo(f"{name}\t{shown}")


@app.command("find-hanging")
@one_line_errors
def find_hanging(
    topic: str = TopicArgument,
    partition: int | None = typer.Option(
        None, "--partition", min=0, metavar="N", help="Partition N only. Default: all."
    ),
    max_timeout_ms: int = typer.Option(
        MAX_TRANSACTION_TIMEOUT_MS,
        "--max-transaction-timeout-ms",
        min=0,
        metavar="MS",
        help="The largest transaction timeout: a transaction open for longer may hang.",
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Transactions a partition holds open that their coordinator does not hold open there."""
    wanted = None if partition is None else [partition]
    hanging = with_txns(
        resolve_bootstrap(bootstrap, data_dir),
        timeout_ms,
        lambda t: t.find_hanging(topic, wanted, max_timeout_ms=max_timeout_ms),
    )
    rows = [{**h.open._asdict(), "transactional_id": h.transactional_id, "why": h.why}
            for h in hanging]  # fmt: skip
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no hanging transaction on {topic}")
        return
    table = Table(title=f"hanging transactions of {topic}")
    columns = ("partition", "producer_id", "producer_epoch", "coordinator_epoch", "start_offset",
               "transactional_id", "why")  # fmt: skip
    for column in columns:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    console().print(table)


@app.command("abort")
@one_line_errors
def abort(
    topic: str = TopicArgument,
    partition: int = typer.Option(..., "--partition", min=0, metavar="N", help="Its partition."),
    start_offset: int | None = typer.Option(
        None, "--start-offset", min=0, metavar="OFFSET", help="The transaction's first offset."
    ),
    producer_id: int | None = typer.Option(
        None, "--producer-id", min=0, metavar="PID", help="Its producer's id."
    ),
    producer_epoch: int | None = typer.Option(
        None, "--producer-epoch", min=0, metavar="EPOCH", help="Its producer's epoch."
    ),
    coordinator_epoch: int | None = typer.Option(
        None,
        "--coordinator-epoch",
        min=0,
        metavar="EPOCH",
        help="The coordinator epoch the partition knows (producers describe shows it).",
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Abort a hanging transaction on one partition: by --start-offset, or by --producer-id,
    --producer-epoch and --coordinator-epoch. Its coordinator, if it knows the transaction,
    still ends it as it decides on its other partitions."""
    by_producer = (producer_id, producer_epoch, coordinator_epoch)
    if (start_offset is None) == all(x is None for x in by_producer):
        raise CliError("name the transaction by --start-offset or by its producer, one of them")
    producer = None
    if start_offset is None:
        if any(x is None for x in by_producer):
            raise CliError("--producer-id, --producer-epoch and --coordinator-epoch go together")
        producer = (producer_id or 0, producer_epoch or 0, coordinator_epoch or 0)
    with_txns(
        resolve_bootstrap(bootstrap, data_dir),
        timeout_ms,
        lambda t: t.abort(topic, partition, start_offset=start_offset, producer=producer),
    )
    typer.echo(f"aborted the transaction on {topic}-{partition}")
