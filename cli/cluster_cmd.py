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

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.common import (
    BootstrapOption,
    CliError,
    DataDirOption,
    JsonOption,
    default_data_dir,
    one_line_errors,
    resolve_bootstrap,
    run,
)
from cluster import protocol as p
from cluster.client import Admin, ClientError, Cluster
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
        cluster = launcher.up(directory, count, preferred_ports=launcher.CONVENTIONAL_PORTS)
        return cluster, tuple(range(1, count + 1))
    if nodes is not None and nodes != len(previous.nodes):
        raise CliError(
            f"{directory} holds a {len(previous.nodes)}-node cluster: start it without --nodes, "
            "or use another --data-dir"
        )
    if all(launcher.node_pid(previous, n) is None for n in previous.nodes):
        # Nothing runs: written afresh (same ports and secret), as the first `up` did.
        cluster = launcher.up(directory, len(previous.nodes))
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
    typer.echo(f"raftbroker cluster of {_count(count, 'node')} ready in {directory}")
    typer.echo(f"bootstrap: {','.join(cluster.bootstrap)}")
    if cluster.nodes[0].client_port != launcher.CONVENTIONAL_PORTS[0]:
        typer.echo(
            f"(port {launcher.CONVENTIONAL_PORTS[0]} was taken: pass --bootstrap "
            f"{cluster.bootstrap[0]}, or set RAFTBROKER_BOOTSTRAP, where examples say "
            f"127.0.0.2:{launcher.CONVENTIONAL_PORTS[0]})"
        )


def _follow_logs(cluster: launcher.LocalCluster) -> None:
    console = Console(highlight=False)
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
                    console.print(Text.assemble(prefix, line.rstrip()), soft_wrap=True)
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
        line = f"stopped {_count(len(report.stopped), 'node')} of {directory}"
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


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _nodes(ids: tuple[int, ...]) -> str:
    return f"node {ids[0]}" if len(ids) == 1 else f"nodes {', '.join(map(str, ids))}"


def _was(ids: tuple[int, ...]) -> str:
    return "was" if len(ids) == 1 else "were"


@dataclass(frozen=True, slots=True)
class PartitionRow:
    topic: str
    partition: int
    leader: int
    term: int
    replicas: list[int]
    commit_index: int
    healthy: bool
    detail: str


async def _gather_status(bootstrap: list[str]) -> dict[str, object]:
    client = Cluster(bootstrap, request_timeout_s=3.0)
    try:
        meta = await client.refresh()
        statuses: dict[int, p.ClusterStatusResponse | None] = {}
        for broker in meta.brokers:
            try:
                statuses[broker.node_id] = await Admin(client).cluster_status(broker.address)
            except ClientError:
                statuses[broker.node_id] = None
    finally:
        await client.close()
    nodes = [
        {"node_id": b.node_id, "address": b.address, "reachable": statuses[b.node_id] is not None}
        for b in meta.brokers
    ]
    partitions = [asdict(row) for row in _partition_rows(meta, statuses)]
    return {
        "cluster_id": meta.cluster_id,
        "controller": meta.controller_id,
        "nodes": nodes,
        "partitions": partitions,
    }


def _partition_rows(
    meta: p.MetadataResponse, statuses: dict[int, p.ClusterStatusResponse | None]
) -> list[PartitionRow]:
    rows = []
    for topic in meta.topics:
        for pm in topic.partitions:
            leader_status = statuses.get(pm.leader_id)
            group = (
                next(
                    (g for g in leader_status.groups if g.group == f"{topic.name}-{pm.partition}"),
                    None,
                )
                if leader_status
                else None
            )
            rows.append(
                PartitionRow(
                    topic.name,
                    pm.partition,
                    pm.leader_id,
                    pm.term,
                    list(pm.replicas),
                    group.commit_index if group else -1,
                    bool(group and group.healthy),
                    group.detail if group else "leader unknown",
                )
            )
    return rows


@app.command()
@one_line_errors
def status(
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
) -> None:
    """Nodes and their health; every partition's leader, term, replicas and commit index."""
    state = run(_gather_status(resolve_bootstrap(bootstrap, data_dir)))
    if as_json:
        typer.echo(json.dumps(state, indent=2))
        return
    _render_status(state, Console())


def _render_status(state: dict[str, object], console: Console) -> None:
    nodes = Table(title=f"cluster {state['cluster_id']} (controller: node {state['controller']})")
    for column in ("node", "address", "reachable"):
        nodes.add_column(column)
    for n in state["nodes"]:  # type: ignore[attr-defined]
        nodes.add_row(str(n["node_id"]), n["address"], "yes" if n["reachable"] else "[red]no[/red]")
    console.print(nodes)
    parts = Table(title="partitions")
    for column in ("topic", "partition", "leader", "term", "replicas", "commit index", "health"):
        parts.add_column(column)
    for r in state["partitions"]:  # type: ignore[attr-defined]
        health = "ok" if r["healthy"] else f"[red]{r['detail'] or 'unhealthy'}[/red]"
        parts.add_row(
            r["topic"],
            str(r["partition"]),
            str(r["leader"]),
            str(r["term"]),
            ",".join(map(str, r["replicas"])),
            str(r["commit_index"]),
            health,
        )
    console.print(parts)
