"""The `raftbroker` command. Only `cli/` configures logging, reads files and installs uvloop.

Every command prints for people by default and offers `--json` for scripts; an error is one
line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from importlib.metadata import version as package_version
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from cli import (
    chaos_cmd,
    cluster_cmd,
    consume_cmd,
    groups_cmd,
    pipeline_cmd,
    produce_cmd,
    runtime,
    topic_cmd,
    transactions_cmd,
)
from cli import walkthrough as walkthrough_scenes
from cli.common import console, fail
from cli.demo import DemoReport, demo_in_temporary_directory
from cli.help import PlainHelpGroup
from cluster.config import ConfigError

app = typer.Typer(
    name="raftbroker",
    help="A Raft-replicated message broker with Kafka's exactly-once producer guarantees.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainHelpGroup,
)


app.add_typer(cluster_cmd.app, name="cluster")
app.add_typer(topic_cmd.topics, name="topic")
app.add_typer(topic_cmd.producers, name="producers")
app.add_typer(groups_cmd.app, name="groups")
app.add_typer(transactions_cmd.app, name="transactions")
app.add_typer(chaos_cmd.app, name="chaos")
app.add_typer(pipeline_cmd.app, name="pipeline")
app.command()(produce_cmd.produce)
app.command()(consume_cmd.consume)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"raftbroker {package_version('raftbroker')}")
        raise typer.Exit


@app.callback()
def main(
    _version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
) -> None:
    """raftbroker: run and use a Raft-replicated, idempotent message broker."""


@app.command()
def node(
    config: Path = typer.Option(
        ..., "--config", metavar="FILE", help="The node's TOML configuration file."
    ),
) -> None:
    """Run one broker node (what a container runs)."""
    try:
        node_config = runtime.load_node_config(config)
    except ConfigError as exc:
        fail(str(exc), 2)
    if node_config.unsafe_record_syncs:
        # Test-only: the chaos suite's power cuts need every fsync on record (before any file
        # is opened, so none is missed). Imported here: a node loads the chaos tools only then.
        from cluster.chaos.power import SyncRecorder, ledger_of  # noqa: PLC0415

        SyncRecorder(ledger_of(node_config.data_dir)).install()
    runtime.run_node_process(node_config)


@app.command()
def demo(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    records: int = typer.Option(
        4_000, "--records", min=100, metavar="N", help="Payments to produce."
    ),
) -> None:
    """Run the main job: leader kills under an idempotent producer on a local 3-node cluster."""
    out = console(stderr=as_json)
    out.print(
        "starting a 3-node cluster on 127.0.0.2-4; the partition leader will be "
        "SIGKILLed twice while a producer writes ..."
    )
    report = demo_in_temporary_directory(records)
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        render_demo(report, out)
    if not report.passed:
        raise typer.Exit(1)


def render_demo(report: DemoReport, out: Console) -> None:
    verdict = Table(title="exactly-once under leader kills", show_header=False)
    for name, value in (
        ("records acknowledged", report.acknowledged),
        ("records in the log", report.in_log),
        ("duplicates", report.duplicates),
        ("lost (acknowledged but absent)", report.lost),
        ("sends that failed", report.failed_sends),
    ):
        verdict.add_row(name, str(value))
    out.print(verdict)
    failovers = Table(title="failovers (SIGKILL of the partition leader)")
    for column in ("partition", "killed node", "new leader", "next acknowledged write after"):
        failovers.add_column(column)
    for f in report.failovers:
        failovers.add_row(
            str(f.partition),
            str(f.killed_node),
            str(f.new_leader),
            f"{f.resumed_after_s * 1000:.0f} ms",
        )
    out.print(failovers)
    retry, fencing = report.retry_scene, report.fencing_scene
    first, again, epochs = retry["first"], retry["retry"], fencing["epochs"]
    out.print(
        f"lost-ACK retry: the batch appended at offset {first['offset']}; sent again, it is "
        f"answered {'a duplicate' if again['duplicate'] else 'as new'} at offset "
        f"{again['offset']}: {'PASS' if retry['passed'] else 'FAIL'}"
    )
    out.print(
        f"zombie fencing: the zombie at epoch {epochs['zombie']}, its successor at epoch "
        f"{epochs['successor']}; the zombie's next write was {fencing['zombie_write']}: "
        f"{'PASS' if fencing['passed'] else 'FAIL'}"
    )
    mark = "[green]PASS[/green]" if report.passed else "[red]FAIL[/red]"
    out.print(
        f"{mark}: nothing lost, nothing duplicated ({report.seconds} s)"
        if report.passed
        else f"{mark}: see above ({report.seconds} s)"
    )


@app.command()
def walkthrough(
    as_json: bool = typer.Option(False, "--json", help="Print the scenes as JSON."),
) -> None:
    """Replay the idempotent-producer stories on three in-process replicas of a partition."""
    scenes = walkthrough_scenes.run()
    if as_json:
        typer.echo(json.dumps([asdict(s) for s in scenes], indent=2))
    else:
        render(scenes, console())
    if not all(s.passed for s in scenes):
        raise typer.Exit(1)


def render(scenes: list[walkthrough_scenes.Scene], out: Console) -> None:
    for scene in scenes:
        # Across a terminal; as wide as its content elsewhere (a file has no width to fill).
        table = Table(show_header=True, header_style="bold", expand=out.is_terminal)
        table.add_column("step", ratio=2)
        table.add_column("what the replicated state machine answered", ratio=3)
        for step in scene.steps:
            table.add_row(step.action, step.outcome)
        mark = "[green]PASS[/green]" if scene.passed else "[red]FAIL[/red]"
        out.print(Panel.fit(scene.story, title=f"[bold]{scene.title}[/bold]"))
        out.print(table)
        out.print(f"{mark}  {scene.verdict}\n")
    passed = sum(s.passed for s in scenes)
    verdict = f"{passed}/{len(scenes)} scenes behaved as docs/semantics.md promises"
    out.print(f"[bold]{verdict}[/bold]")
