"""`raftbroker cluster up|down|status`: a local cluster in one command, and its state.

`up` starts the node processes on 127.0.0.2, .3, ... with a generated secret and waits until
every node is ready; on a cluster of which some nodes already run, it starts only the missing
ones. A node that dies at start (its port taken, say) fails the command in one line naming it
and its reason, never "ready". In the foreground it streams every node's log with a node
prefix and Ctrl-C stops all nodes; with `--detach` it returns and `down` stops them later.
`down` signals only processes that are the cluster's nodes (cluster/local/launcher.py: the
holder of a node's data-directory lock) and says which it stopped and which were not running.
Data survives `down` + `up` on the same directory. `status` asks every broker for its Raft
groups.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.common import (
    LOCAL_CLUSTER_TOML,
    BootstrapOption,
    CliError,
    DataDirOption,
    JsonOption,
    console,
    default_data_dir,
    one_line_errors,
    plural,
    resolve_bootstrap,
    run,
)
from cluster import native as p
from cluster.client import Admin, Client, ClientError
from cluster.local import launcher

app = typer.Typer(help="Run a local cluster and see its state.", no_args_is_help=True)
LOG_COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red")
DEFAULT_NODES = 3
READY_TIMEOUT_S = 60.0


@app.command()
@one_line_errors
def up(
    nodes: int | None = typer.Option(
        None,
        "--nodes",
        min=1,
        max=9,
        help="How many nodes a new cluster has (default 3); an existing one keeps its own.",
    ),
    data_dir: Path | None = DataDirOption,
    detach: bool = typer.Option(False, "--detach", help="Return once the cluster is ready."),
) -> None:
    """Start the local cluster of --data-dir (its missing nodes, if some already run) and wait
    until every node is ready."""
    directory = (data_dir or default_data_dir()).resolve()
    cluster, started = _start(directory, nodes)
    try:
        run(launcher.wait_ready(cluster, READY_TIMEOUT_S))
    except BaseException as exc:
        launcher.down(cluster, only=started)
        if isinstance(exc, launcher.NodeExitedError):
            raise CliError(f"{exc} (stopped what this command started)") from None
        raise
    _say_ready(cluster, started)
    if detach:
        return
    typer.echo("streaming node logs; Ctrl-C stops the cluster")
    # SIGTERM (`timeout`, systemd, a container's stop) as Ctrl-C: the nodes run in sessions of
    # their own, and would outlive this command otherwise.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        _follow_logs(cluster)
    except KeyboardInterrupt:
        pass
    finally:
        launcher.down(cluster)
        typer.echo("cluster stopped")


def _start(directory: Path, nodes: int | None) -> tuple[launcher.LocalCluster, tuple[int, ...]]:
    """A new cluster, the same cluster again, or its missing nodes; and the ids started."""
    previous = launcher.LocalCluster.load(directory)
    if previous is None or not previous.nodes:
        count = nodes or DEFAULT_NODES
        cluster = launcher.up(
            directory, count, LOCAL_CLUSTER_TOML, preferred_ports=launcher.CONVENTIONAL_PORTS
        )
        return cluster, tuple(range(1, count + 1))
    if nodes is not None and nodes != len(previous.nodes):
        raise CliError(
            f"{directory} holds a {len(previous.nodes)}-node cluster: start it without --nodes, "
            "or use another --data-dir"
        )
    if all(launcher.node_pid(previous, n) is None for n in previous.nodes):
        # Nothing runs: written afresh (same ports and secret), as the first `up` did.
        cluster = launcher.up(directory, len(previous.nodes), LOCAL_CLUSTER_TOML)
        return cluster, tuple(n.node_id for n in cluster.nodes)
    return launcher.start_missing(previous)


def _say_ready(cluster: launcher.LocalCluster, started: tuple[int, ...]) -> None:
    directory, count = cluster.data_dir, len(cluster.nodes)
    already = tuple(n.node_id for n in cluster.nodes if n.node_id not in started)
    if already and started:
        typer.echo(f"started {_nodes(started)} ({_nodes(already)} {_was(already)} running already)")
    elif already:
        every = "the node was" if count == 1 else f"all {count} nodes were"
        typer.echo(f"{every} running already")
    typer.echo(f"raftbroker cluster of {plural(count, 'node')} ready in {directory}")
    typer.echo(f"bootstrap: {','.join(cluster.bootstrap)}")
    conventional = launcher.CONVENTIONAL_PORTS
    if cluster.nodes[0].client_port != conventional.client:
        typer.echo(
            f"(port {conventional.client} was taken: pass --bootstrap "
            f"{cluster.bootstrap[0]}, or set RAFTBROKER_BOOTSTRAP, where examples say "
            f"127.0.0.2:{conventional.client})"
        )
    if cluster.kafka_bootstrap:
        typer.echo(f"kafka bootstrap: {','.join(cluster.kafka_bootstrap)}")
        if cluster.nodes[0].kafka_port != conventional.kafka:
            typer.echo(
                f"(port {conventional.kafka} was taken: Kafka clients bootstrap from "
                f"{cluster.kafka_bootstrap[0]} where examples say 127.0.0.2:{conventional.kafka})"
            )


def _follow_logs(cluster: launcher.LocalCluster) -> None:
    out = Console(highlight=False)
    files: list[tuple[int, IO[str]]] = []
    for node in cluster.nodes:
        log = (cluster.data_dir / f"node{node.node_id}.log").open()
        log.seek(0, 2)
        files.append((node.node_id, log))
    try:
        while any(launcher.node_pid(cluster, n) is not None for n in cluster.nodes):
            quiet = True
            for node_id, log_file in files:
                for line in log_file.readlines():
                    quiet = False
                    color = LOG_COLORS[(node_id - 1) % len(LOG_COLORS)]
                    # A log line is text, not markup, and stays one line whatever the width.
                    prefix = (f"node{node_id} | ", color)
                    out.print(Text.assemble(prefix, line.rstrip()), soft_wrap=True)
            if quiet:
                time.sleep(0.2)  # tailing files: there is nothing to wait on but time
    finally:
        for _, log_file in files:
            log_file.close()


@app.command()
@one_line_errors
def down(data_dir: Path | None = DataDirOption) -> None:
    """Stop the local cluster of --data-dir (its data stays). Only processes that are its
    nodes are signalled, whatever pids cluster.json holds."""
    directory = (data_dir or default_data_dir()).resolve()
    cluster = launcher.LocalCluster.load(directory)
    if cluster is None:
        raise CliError(f"no cluster in {directory}")
    for line in stop_summary(launcher.down(cluster), directory):
        typer.echo(line)


def stop_summary(report: launcher.StopReport, directory: Path) -> list[str]:
    """What `down` did, in words: which nodes were stopped and which were not running."""
    if report.stopped:
        line = f"stopped {plural(len(report.stopped), 'node')} of {directory}"
        if report.not_running:
            line += f"; {_nodes(report.not_running)} {_was(report.not_running)} not running"
    else:
        line = f"no node of {directory} was running"
    lines = [line]
    if report.killed:
        lines.append(f"{_nodes(report.killed)} did not stop in time: SIGKILLed")
    lines += [
        f"node {node_id}: pid {pid} in cluster.json is another process now: left alone"
        for node_id, pid in report.strangers
    ]
    return lines


def _nodes(ids: tuple[int, ...]) -> str:
    return f"node {ids[0]}" if len(ids) == 1 else f"nodes {', '.join(map(str, ids))}"


def _was(ids: tuple[int, ...]) -> str:
    return "was" if len(ids) == 1 else "were"


# -- status ------------------------------------------------------------------------------------

OK = "ok"
UNDER_REPLICATED = "under-replicated"
NO_LEADER = "no leader"
UNHEALTHY = "unhealthy"
STATUS_REQUEST_TIMEOUT_S = 3.0
PARTITION_COLUMNS = (
    *("topic", "partition", "leader", "replicas", "in sync", "log start", "high watermark"),
    *("state", "term", "commit index", "detail"),
)
# Wide enough that a table is never squeezed or wrapped when stdout is a file or a pipe.


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: int
    address: str
    reachable: bool
    leader_of: int  # partitions this node leads


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One partition as users reason about it (Kafka's describe), with Raft's view beside."""

    topic: str
    partition: int
    leader: int | None
    replicas: list[int]
    in_sync: list[int]  # Kafka's ISR, as the leader sees it; the leader first
    log_start_offset: int | None
    high_watermark: int | None
    state: str  # OK, UNDER_REPLICATED, NO_LEADER or UNHEALTHY
    detail: str
    term: int | None
    commit_index: int | None  # the Raft log's, not an offset

    @property
    def under_replicated(self) -> bool:
        """As Kafka's --under-replicated-partitions: fewer replicas in sync than assigned
        (a partition without a leader has none known to be)."""
        return self.state in (UNDER_REPLICATED, NO_LEADER)


@dataclass(frozen=True, slots=True)
class StatusReport:
    cluster_id: str
    controller: int
    nodes: list[NodeRow]
    partitions: list[PartitionRow]

    @property
    def healthy(self) -> bool:
        return all(n.reachable for n in self.nodes) and all(r.state == OK for r in self.partitions)

    def as_dict(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "controller": self.controller,
            "healthy": self.healthy,
            "nodes": [asdict(n) for n in self.nodes],
            "partitions": [
                {**asdict(r), "under_replicated": r.under_replicated} for r in self.partitions
            ],
        }


async def gather_status(bootstrap: list[str]) -> StatusReport:
    """Every node's and partition's state, from each node's own status (`cluster status`)."""
    client = Client(bootstrap, request_timeout_s=STATUS_REQUEST_TIMEOUT_S)
    try:
        meta = await client.refresh()
        answers = await asyncio.gather(*(_status_of(client, b.address) for b in meta.brokers))
    finally:
        await client.close()
    statuses = {b.node_id: answer for b, answer in zip(meta.brokers, answers, strict=True)}
    partitions = _partition_rows(meta, statuses)
    nodes = [
        NodeRow(
            b.node_id,
            b.address,
            statuses[b.node_id] is not None,
            sum(1 for r in partitions if r.leader == b.node_id),
        )
        for b in meta.brokers
    ]
    return StatusReport(meta.cluster_id, meta.controller_id, nodes, partitions)


async def _status_of(client: Client, address: str) -> p.ClusterStatusResponse | None:
    """The broker's own view, or None when it does not answer (one attempt: it is its own)."""
    try:
        return await Admin(client).cluster_status(address)
    except ClientError:
        return None


def _partition_rows(
    meta: p.MetadataResponse, statuses: dict[int, p.ClusterStatusResponse | None]
) -> list[PartitionRow]:
    """Every partition, from its leader's own status: the replica that says it leads, in the
    highest term any reachable node reports, not a leader hint that may be stale."""
    seen: dict[str, list[tuple[int, p.RaftGroupReport]]] = {}
    for node_id, status in statuses.items():
        for group in status.groups if status is not None else ():
            seen.setdefault(group.group, []).append((node_id, group))
    unreachable = frozenset(n for n, status in statuses.items() if status is None)
    return [
        _partition_row(topic.name, pm, seen.get(f"{topic.name}-{pm.partition}", []), unreachable)
        for topic in meta.topics
        for pm in topic.partitions
    ]


def _partition_row(
    topic: str,
    pm: p.PartitionMetadata,
    replicas: list[tuple[int, p.RaftGroupReport]],
    unreachable: frozenset[int],
) -> PartitionRow:
    problems = [f"node {node_id}: {g.detail}" for node_id, g in replicas if not g.healthy]
    leaders = [(node_id, g) for node_id, g in replicas if g.is_leader]
    if not leaders:
        away = tuple(n for n in pm.replicas if n in unreachable)
        if away:
            problems.insert(0, f"replicas on unreachable {_nodes(away)}")
        return PartitionRow(
            topic,
            pm.partition,
            leader=None,
            replicas=list(pm.replicas),
            in_sync=[],
            log_start_offset=None,
            high_watermark=None,
            state=NO_LEADER,
            detail="; ".join(problems),
            term=None,
            commit_index=None,
        )
    leader, group = max(leaders, key=lambda found: found[1].term)
    behind = tuple(n for n in pm.replicas if n not in group.in_sync)
    if behind:
        problems.insert(0, f"{_nodes(behind)} not in sync")
    state = UNDER_REPLICATED if behind else OK if not problems else UNHEALTHY
    return PartitionRow(
        topic,
        pm.partition,
        leader,
        list(pm.replicas),
        list(group.in_sync),
        group.log_start_offset,
        group.high_watermark,
        state,
        "; ".join(problems),
        group.term,
        group.commit_index,
    )


@app.command()
@one_line_errors
def status(
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
    under_replicated: bool = typer.Option(
        False,
        "--under-replicated-partitions",
        help="Show only partitions with fewer replicas in sync than assigned (or no leader).",
    ),
    check: bool = typer.Option(
        False,
        "--check",
        help="Exit with status 1 when a node is unreachable or a partition is not ok.",
    ),
) -> None:
    """Nodes and every partition: leader, replicas in sync, log start and high watermark,
    Raft term and commit index. With --check, exit status 1 when a node is unreachable or a
    partition is not ok (under-replicated, without a leader, or unhealthy); without it, the
    report is the answer (a container's healthcheck asks whether its node answers, and must
    not fail because another node is down)."""
    report = run(gather_status(resolve_bootstrap(bootstrap, data_dir)))
    if under_replicated:
        report = replace(report, partitions=[r for r in report.partitions if r.under_replicated])
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _render_status(report, console())
    if check and not report.healthy:
        raise typer.Exit(1)


def _render_status(report: StatusReport, console: Console) -> None:
    nodes = Table(title=f"cluster {report.cluster_id} (controller: node {report.controller})")
    for column in ("node", "address", "reachable", "leader of"):
        nodes.add_column(column)
    for n in report.nodes:
        reachable = "yes" if n.reachable else "[red]no[/red]"
        nodes.add_row(str(n.node_id), n.address, reachable, plural(n.leader_of, "partition"))
    console.print(nodes)
    parts = Table(title="partitions")
    for column in PARTITION_COLUMNS:
        parts.add_column(column)
    for r in report.partitions:
        state = r.state if r.state == OK else f"[red]{r.state}[/red]"
        parts.add_row(
            Text(r.topic),
            str(r.partition),
            _or_dash(r.leader),
            ",".join(map(str, r.replicas)),
            ",".join(map(str, r.in_sync)) or "-",
            _or_dash(r.log_start_offset),
            _or_dash(r.high_watermark),
            state,
            _or_dash(r.term),
            _or_dash(r.commit_index),
            Text(r.detail),
        )
    console.print(parts)
    console.print(_summary(report), highlight=False)


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _summary(report: StatusReport) -> str:
    unreachable = [n.node_id for n in report.nodes if not n.reachable]
    counts = [
        f"{sum(1 for r in report.partitions if r.state == state)} {state}"
        for state in (OK, UNDER_REPLICATED, NO_LEADER, UNHEALTHY)
    ]
    line = f"{plural(len(report.partitions), 'partition')}: {', '.join(counts)}"
    if unreachable:
        line += f"; {_nodes(tuple(unreachable))} unreachable"
    return line
