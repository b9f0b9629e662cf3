"""`raftbroker groups ...`: list, describe, delete consumer groups and reset their offsets.

As Kafka's `kafka-consumer-groups`: `describe` shows per partition the committed offset, the
log end and the lag, and the member that owns it; `reset` moves an empty group's offsets and,
as Kafka's tool, only says what it would do unless given `--execute`.
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
    plural,
    resolve_bootstrap,
)
from cli.consume_cmd import parse_time
from cli.topic_cmd import TimeoutOption, with_admin
from cluster import native as p
from cluster.client.groups import GroupDescription, Groups, ResetTarget

app = typer.Typer(help="List, describe and delete consumer groups; reset their offsets.",
                  no_args_is_help=True)  # fmt: skip
T = TypeVar("T")
GroupArgument = typer.Argument(..., metavar="GROUP", help="The group's id.")


def with_groups(
    bootstrap: list[str], timeout_ms: int, action: Callable[[Groups], Awaitable[T]]
) -> T:
    return with_admin(bootstrap, timeout_ms, lambda admin: action(Groups(admin.cluster)))


@app.command("list")
@one_line_errors
def list_groups(
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Every consumer group with its state."""
    listed = with_groups(resolve_bootstrap(bootstrap, data_dir), timeout_ms, lambda g: g.list())
    if as_json:
        rows = [{"group": g.group, "state": g.state, "protocol_type": g.protocol_type}
                for g in listed]  # fmt: skip
        typer.echo(json.dumps(rows, indent=2))
        return
    for g in listed:
        typer.echo(f"{g.group}\t{g.state}")


@app.command("describe")
@one_line_errors
def describe(
    group: str = GroupArgument,
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """A group's state and members, and per partition its committed offset, log end and lag."""
    described = with_groups(
        resolve_bootstrap(bootstrap, data_dir), timeout_ms, lambda g: g.describe(group)
    )
    if as_json:
        typer.echo(json.dumps(_description_json(described), indent=2))
        return
    members = plural(len(described.members), "member")
    title = f"group {group}: {described.state}, {members}"
    if described.protocol:
        title += f" ({described.protocol_type} protocol {described.protocol})"
    table = Table(title=title)
    for column in ("topic", "partition", "committed", "log end", "lag", "member", "client"):
        table.add_column(column)
    clients = {m.member_id: m.client_id for m in described.members}
    _print_members(described)
    for row in described.partitions:
        table.add_row(
            row.topic,
            str(row.partition),
            _or_dash(row.committed),
            _or_dash(row.log_end),
            "-" if row.lag is None else str(row.lag),
            row.member_id or "-",
            clients.get(row.member_id, "-"),
        )
    console().print(table)


def _print_members(described: GroupDescription) -> None:
    if not described.members:
        return
    table = Table(title=f"members of {described.group}")
    for column in ("member", "instance", "client", "host", "partitions"):
        table.add_column(column)
    for m in described.members:
        owned = ", ".join(f"{t}-{i}" for t, i in m.partitions) or "-"
        table.add_row(m.member_id, m.instance_id or "-", m.client_id, m.host or "-", owned)
    console().print(table)


def _or_dash(offset: int) -> str:
    return "-" if offset < 0 else str(offset)


def _description_json(d: GroupDescription) -> dict[str, object]:
    return {
        "group": d.group,
        "state": d.state,
        "protocol_type": d.protocol_type,
        "protocol": d.protocol,
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id or None,
                "client_id": m.client_id,
                "host": m.host,
                "partitions": [{"topic": t, "partition": i} for t, i in m.partitions],
            }
            for m in d.members
        ],
        "partitions": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "committed": None if r.committed < 0 else r.committed,
                "log_end": None if r.log_end < 0 else r.log_end,
                "lag": r.lag,
                "member_id": r.member_id or None,
            }
            for r in d.partitions
        ],
    }


@app.command("delete")
@one_line_errors
def delete(
    group: str = GroupArgument,
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Delete an empty group and its committed offsets."""
    with_groups(resolve_bootstrap(bootstrap, data_dir), timeout_ms, lambda g: g.delete(group))
    typer.echo(f"deleted group {group}")


@app.command("reset")
@one_line_errors
def reset(
    group: str = GroupArgument,
    topic: str = typer.Option(..., "--topic", metavar="TOPIC", help="The topic to reset."),
    partition: list[int] | None = typer.Option(
        None, "--partition", min=0, metavar="N", help="Partition N only (repeatable)."
    ),
    to_earliest: bool = typer.Option(False, "--to-earliest", help="Each partition's first."),
    to_latest: bool = typer.Option(False, "--to-latest", help="Each partition's log end."),
    to_offset: int | None = typer.Option(
        None, "--to-offset", min=0, metavar="OFFSET", help="This offset (kept within the log)."
    ),
    to_time: str | None = typer.Option(
        None,
        "--to-time",
        metavar="TIME",
        help="The first record appended at TIME or later: ms since the epoch or ISO 8601.",
    ),
    execute: bool = typer.Option(
        False, "--execute", help="Commit the new offsets. Without it: only show them."
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    timeout_ms: int = TimeoutOption,
) -> None:
    """Move an empty group's committed offsets of a topic (as kafka-consumer-groups
    --reset-offsets: a dry run unless --execute)."""
    target = _target(to_earliest, to_latest, to_offset, to_time)
    offsets = with_groups(
        resolve_bootstrap(bootstrap, data_dir),
        timeout_ms,
        lambda g: g.reset_offsets(group, topic, target, partition, execute=execute),
    )
    typer.echo("TOPIC\tPARTITION\tNEW-OFFSET")  # kafka-consumer-groups --reset-offsets' head
    for i, offset in sorted(offsets.items()):
        typer.echo(f"{topic}\t{i}\t{offset}")
    if execute:
        typer.echo(f"group {group}: {plural(len(offsets), 'partition')} of {topic} reset")
    else:
        typer.echo(f"group {group}: dry run, nothing committed (add --execute to commit)")


def _target(earliest: bool, latest: bool, offset: int | None, time: str | None) -> ResetTarget:
    chosen = [earliest, latest, offset is not None, time is not None]
    if sum(chosen) != 1:
        raise CliError("use exactly one of --to-earliest, --to-latest, --to-offset, --to-time")
    if earliest:
        return ResetTarget(p.EARLIEST)
    if latest:
        return ResetTarget(p.LATEST)
    if offset is not None:
        return ResetTarget.to_offset(offset)
    assert time is not None
    return ResetTarget(parse_time(time, "--to-time"))
