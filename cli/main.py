"""The `raftbroker` command. Only `cli/` configures logging, reads files and installs uvloop.

Every command prints for people by default and offers `--json` for scripts; an error is one
line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from cli import runtime
from cli import walkthrough as walkthrough_scenes
from cluster.config import ConfigError

app = typer.Typer(
    name="raftbroker",
    help="A Raft-replicated message broker with Kafka's exactly-once producer guarantees.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """raftbroker: run and use a Raft-replicated, idempotent message broker."""


def fail(message: str, code: int = 1) -> NoReturn:
    """One clear line on stderr and a non-zero exit: never a traceback."""
    typer.echo(f"raftbroker: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def node(
    config: Path = typer.Option(..., "--config", help="The node's TOML configuration file."),
) -> None:
    """Run one broker node (what a container runs)."""
    try:
        node_config = runtime.load_node_config(config)
    except ConfigError as exc:
        fail(str(exc), 2)
    runtime.run_node_process(node_config)


@app.command()
def walkthrough(
    as_json: bool = typer.Option(False, "--json", help="Print the scenes as JSON."),
) -> None:
    """Replay the idempotent-producer stories on three in-process replicas of a partition."""
    scenes = walkthrough_scenes.run()
    if as_json:
        typer.echo(json.dumps([asdict(s) for s in scenes], indent=2))
    else:
        render(scenes, Console())
    if not all(s.passed for s in scenes):
        raise typer.Exit(1)


def render(scenes: list[walkthrough_scenes.Scene], console: Console) -> None:
    for scene in scenes:
        table = Table(show_header=True, header_style="bold", expand=True)
        table.add_column("step", ratio=2)
        table.add_column("what the replicated state machine answered", ratio=3)
        for step in scene.steps:
            table.add_row(step.action, step.outcome)
        mark = "[green]PASS[/green]" if scene.passed else "[red]FAIL[/red]"
        console.print(Panel.fit(scene.story, title=f"[bold]{scene.title}[/bold]"))
        console.print(table)
        console.print(f"{mark}  {scene.verdict}\n")
    passed = sum(s.passed for s in scenes)
    console.print(f"[bold]{passed}/{len(scenes)} scenes behaved as SEMANTICS.md promises[/bold]")
