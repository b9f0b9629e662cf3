"""`raftbroker chaos run`: faults on a seeded schedule against a fresh local cluster, checked.

The run starts its own 3-node cluster under `--out`, drives idempotent and transactional-id
producers and a consumer while the nemesis kills, pauses and (given a network namespace) cuts
off nodes, heals, drains every partition, and checks the history. It prints the checker's
summary (or `--json`) and exits 1 when the checker found an anomaly. The same seed replays the
same fault schedule.

`--client kafka` runs the producers, the fenced zombie, the resender and the consumer through
every node's Kafka listener (confluent-kafka, and requests of our own Kafka codec where
librdkafka cannot send them) instead of raftbroker's own client, against the same checker;
librdkafka's fatal errors and idempotence complaints count as anomalies. It needs
confluent-kafka (the `dev` extra).

Network faults need a namespace of the run's own: when the machine allows one (root, iproute2),
the command creates it, runs itself inside (nodes and clients both), and deletes it after.
`--no-network` skips that; either way the report lists the fault kinds it could not inject.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from enum import StrEnum
from pathlib import Path

import typer

from cli.common import CliError, one_line_errors, run
from cluster.chaos import links
from cluster.chaos.runner import ChaosOptions, run_chaos, skipped_faults

app = typer.Typer(help="Fault injection with a history checker.", no_args_is_help=True)


class ClientKind(StrEnum):
    native = "native"
    kafka = "kafka"


@app.command("run")
@one_line_errors
def run_command(
    duration: float = typer.Option(
        60.0, "--duration", min=3, metavar="S", help="Seconds of faults."
    ),
    seed: int = typer.Option(1, "--seed", help="Seeds the fault schedule (same seed, same run)."),
    out: Path = typer.Option(Path("chaos-run"), "--out", help="Directory for history and logs."),
    partitions: int = typer.Option(
        4, "--partitions", min=1, max=64, help="Partitions of the topic under test."
    ),
    fault_interval: float = typer.Option(
        6.0, "--fault-interval", min=2.0, metavar="S", help="Mean seconds between faults."
    ),
    no_network: bool = typer.Option(
        False, "--no-network", help="No network namespace: process faults only."
    ),
    client: ClientKind = typer.Option(
        ClientKind.native,
        "--client",
        help="Whose clients drive the workload: raftbroker's own, or Kafka's (confluent-kafka "
        "through the Kafka listener).",
    ),
    fsync: bool = typer.Option(
        True,
        "--fsync/--no-fsync",
        help="The nodes' fsync setting (the default, true: see the README's guarantees); "
        "--no-fsync with --power-loss is the power cuts' negative control.",
    ),
    power_loss: bool = typer.Option(
        False,
        "--power-loss",
        help="Add power cuts to the faults: a node (its partition's leader, any one, or every "
        "node at once) killed and left with only what it had fsynced, then restarted.",
    ),
    transactions: bool = typer.Option(
        True,
        "--transactions/--no-transactions",
        help="Run the transactions' workload too: a transactional writer over several "
        "partitions, an exactly-once consume-transform-produce processor, a watcher of the "
        "last stable offsets (and the coordinator's node among the faults).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    unsafe_disable_deduplication: bool = typer.Option(
        False,
        "--unsafe-disable-deduplication",
        hidden=True,
        help="Negative control: nodes append retried batches again; the checker must say so.",
    ),
    unsafe_ignore_isolation: bool = typer.Option(
        False,
        "--unsafe-ignore-isolation",
        hidden=True,
        help="Negative control of transactions: nodes serve read_committed "
        "readers as read_uncommitted ones; the checker must say so.",
    ),
) -> None:
    """Run the workload under faults, then check that nothing was lost or duplicated."""
    if client is ClientKind.kafka and importlib.util.find_spec("confluent_kafka") is None:
        raise CliError("--client kafka needs confluent-kafka: pip install -e '.[dev]'")
    inside = os.environ.get(links.NAMESPACE_ENV)
    reason = "--no-network" if no_network else None
    if not inside and reason is None:
        reason = links.netns_unavailable_reason()
        if reason is None:
            raise typer.Exit(_rerun_in_namespace())
    options = ChaosOptions(
        duration_s=duration,
        seed=seed,
        out_dir=out,
        partitions=partitions,
        fault_interval_s=fault_interval,
        client=client.value,
        unsafe_disable_deduplication=unsafe_disable_deduplication,
        unsafe_ignore_isolation=unsafe_ignore_isolation,
        fsync=fsync,
        power_loss=power_loss,
        transactions=transactions,
        no_network_reason=None if inside else reason,
    )
    say = (lambda _: None) if as_json else (lambda line: typer.echo(f"chaos: {line}", err=True))
    report = run(run_chaos(options, say))
    if as_json:
        typer.echo((out / "report.json").read_text())
    else:
        typer.echo(report.summary())
        for kind, why in skipped_faults(options).items():
            typer.echo(f"skipped fault kind {kind}: {why}")
        typer.echo(f"history, report and node logs: {out.resolve()}")
    if not report.ok:
        raise typer.Exit(1)


def _rerun_in_namespace() -> int:
    """This same command, inside a network namespace created for it; its exit status."""
    name = f"raftbroker-chaos-{os.getpid()}"
    links.create_namespace(name)
    try:
        argv = [sys.executable, "-m", "cli", *sys.argv[1:]]
        env = {**os.environ, links.NAMESPACE_ENV: name}
        return subprocess.run(
            links.in_namespace_command(name, argv), env=env, check=False
        ).returncode
    finally:
        links.delete_namespace(name)
