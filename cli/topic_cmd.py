"""`raftbroker topic ...` and `raftbroker producers describe`: administration commands."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.table import Table

from cli.cluster_cmd import gather_status
from cli.common import (
    BootstrapOption,
    CliError,
    DataDirOption,
    JsonOption,
    console,
    one_line_errors,
    plural,
    resolve_bootstrap,
    run,
    topic_partitions,
)
from cluster import native as p
from cluster.client import Admin, Client, RetryPolicy
from statemachine.errors import ErrorCode

topics = typer.Typer(help="Create, list, describe and delete topics.", no_args_is_help=True)
producers = typer.Typer(help="The producer state of partitions.", no_args_is_help=True)
T = TypeVar("T")
TopicArgument = typer.Argument(..., metavar="TOPIC", help="The topic's name.")
DEFAULT_REPLICATION = 3
TimeoutOption = typer.Option(
    30_000,
    "--timeout-ms",
    min=0,
    metavar="MS",
    help="How long to ride out dead nodes and leader changes before failing.",
)


def with_admin(bootstrap: list[str], timeout_ms: int, action: Callable[[Admin], Awaitable[T]]) -> T:
    async def go() -> T:
        client = Client(bootstrap, retry=RetryPolicy(timeout_ms / 1000))
        try:
            return await action(Admin(client))
        finally:
            await client.close()

    return run(go())


@topics.command("create")
@one_line_errors
def create(
    name: str = TopicArgument,
    partitions: int = typer.Option(
        1, "--partitions", min=1, metavar="N", help="How many partitions."
    ),
    replication: int | None = typer.Option(
        None,
        "--replication",
        "-r",
        min=1,
        metavar="N",
        help=f"Replicas per partition. Default: {DEFAULT_REPLICATION}, or every node of a "
        "smaller cluster.",
    ),
    retention_ms: int = typer.Option(
        -1,
        "--retention-ms",
        metavar="MS",
        help="Drop whole segments whose records are older than MS; -1: keep forever.",
    ),
    retention_bytes: int = typer.Option(
        -1,
        "--retention-bytes",
        metavar="BYTES",
        help="Drop the oldest whole segments past BYTES per partition; -1: no size limit.",
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Create a topic and wait until every partition has a leader."""

    async def go(admin: Admin) -> str:
        factor, why = replication, ""
        if factor is None:
            factor, why = await default_replication(admin, name)
        topic_id = await admin.create_topic(
            name,
            partitions,
            factor,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
        )
        return (
            f"created topic {name} (id {topic_id}): {plural(partitions, 'partition')}, "
            f"replication {factor}{why}"
        )

    typer.echo(with_admin(resolve_bootstrap(bootstrap, data_dir), timeout_ms, go))


async def default_replication(admin: Admin, name: str) -> tuple[int, str]:
    """DEFAULT_REPLICATION, or every node of a smaller cluster (Kafka's
    default.replication.factor, which a 1-node cluster could not meet), and why if fewer."""
    nodes = len((await admin.describe_topics([name])).brokers)
    if nodes >= DEFAULT_REPLICATION:
        return DEFAULT_REPLICATION, ""
    held = max(nodes, 1)
    return held, (
        f" (the default is {DEFAULT_REPLICATION}; this cluster has {plural(nodes, 'node')})"
    )


def _metadata(bootstrap: list[str], names: list[str], timeout_ms: int) -> p.MetadataResponse:
    return with_admin(bootstrap, timeout_ms, lambda admin: admin.describe_topics(names))


def _topic_json(t: p.TopicMetadata) -> dict[str, Any]:
    return {
        "name": t.name,
        "topic_id": t.topic_id,
        "partitions": [
            {
                "partition": pm.partition,
                "leader": pm.leader_id,
                "replicas": list(pm.replicas),
                "term": pm.term,
            }
            for pm in t.partitions
        ],
    }


@topics.command("list")
@one_line_errors
def list_topics(
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Every topic with its partition count."""
    meta = _metadata(resolve_bootstrap(bootstrap, data_dir), [], timeout_ms)
    if as_json:
        typer.echo(json.dumps([_topic_json(t) for t in meta.topics], indent=2))
        return
    for t in meta.topics:
        typer.echo(f"{t.name}\t{plural(len(t.partitions), 'partition')}")


@topics.command("describe")
@one_line_errors
def describe(
    name: str = TopicArgument,
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """A topic's partitions: leader, replicas, the replicas in sync (Kafka's ISR), term."""
    addresses = resolve_bootstrap(bootstrap, data_dir)
    meta = _metadata(addresses, [name], timeout_ms)
    topic = meta.topics[0]
    if topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        raise CliError(f"topic {name!r} does not exist")
    if topic.error != ErrorCode.NONE:
        raise CliError(f"topic {name!r}: {ErrorCode(topic.error).name}")
    # In sync as each partition's leader reports it, as `cluster status` shows it.
    in_sync = {
        r.partition: r.in_sync for r in run(gather_status(addresses)).partitions if r.topic == name
    }
    if as_json:
        described = _topic_json(topic)
        for row in described["partitions"]:
            row["in_sync"] = in_sync.get(row["partition"], [])
        typer.echo(json.dumps(described, indent=2))
        return
    table = Table(title=f"topic {name} (id {topic.topic_id})")
    for column in ("partition", "leader", "replicas", "in sync", "term"):
        table.add_column(column)
    for pm in topic.partitions:
        table.add_row(
            str(pm.partition),
            str(pm.leader_id),
            ",".join(map(str, pm.replicas)),
            ",".join(map(str, in_sync.get(pm.partition, []))),
            str(pm.term),
        )
    console().print(table)


@topics.command("delete")
@one_line_errors
def delete(
    name: str = TopicArgument,
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Delete a topic and its data on every replica."""
    with_admin(
        resolve_bootstrap(bootstrap, data_dir), timeout_ms, lambda admin: admin.delete_topic(name)
    )
    typer.echo(f"deleted topic {name}")


@producers.command("describe")
@one_line_errors
def describe_producers(
    topic: str = TopicArgument,
    partition: int | None = typer.Option(
        None, "--partition", min=0, metavar="N", help="Partition N only. Default: all."
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Producer state per partition, as Kafka's DescribeProducers shows it."""
    wanted = None if partition is None else [partition]

    async def go(admin: Admin) -> list[p.PartitionProducers]:
        await topic_partitions(admin.cluster, topic, partition)
        return await admin.describe_producers(topic, wanted)

    results = with_admin(resolve_bootstrap(bootstrap, data_dir), timeout_ms, go)
    rows = [_producer_json(r.partition, d) for r in results for d in r.producers]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"producers of {topic}")
    for column in (
        "partition",
        "producer id",
        "epoch",
        "last seq",
        "last timestamp",
        "coordinator epoch",
        "txn start offset",
        "window (seq -> offsets)",
    ):
        table.add_column(column)
    for row in rows:
        window = "  ".join(
            f"{w['first_seq']}-{w['last_seq']}->{w['base_offset']}-{w['last_offset']}"
            for w in row["window"]  # type: ignore[attr-defined]
        )
        table.add_row(
            str(row["partition"]),
            str(row["producer_id"]),
            str(row["epoch"]),
            str(row["last_sequence"]),
            str(row["last_timestamp_ms"]),
            str(row["coordinator_epoch"]),
            str(row["txn_start_offset"]),
            window,
        )
    console().print(table)


def _producer_json(partition: int, d: p.ProducerDescription) -> dict[str, object]:
    return {
        "partition": partition,
        "producer_id": d.producer_id,
        "epoch": d.epoch,
        "last_sequence": d.last_sequence,
        "last_timestamp_ms": d.last_timestamp_ms,
        # Kafka's CoordinatorEpoch and CurrentTransactionStartOffset (-1: none).
        "coordinator_epoch": d.coordinator_epoch,
        "txn_start_offset": d.txn_start_offset,
        "window": [
            {
                "first_seq": w.first_seq,
                "last_seq": w.last_seq,
                "base_offset": w.base_offset,
                "last_offset": w.last_offset,
                "timestamp_ms": w.timestamp_ms,
            }
            for w in d.window
        ],
    }
