"""Every command's --help, rendered: no type placeholders (`<bool>`, `<list[str]>`, `{topic}`),
every option and argument described, and the environment variables named where they apply
(`RAFTBROKER_BOOTSTRAP` beside --bootstrap, `RAFTBROKER_DATA_DIR` beside --data-dir).

The checker is tried once on a plain typer app, which has every fault it looks for.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.metadata import version

import typer
import typer.main
from rich.console import Console
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.testing import CliRunner

from cli.demo import DemoReport, Failover
from cli.main import app, render_demo

PLACEHOLDER = re.compile(r"<[a-z][a-z_ \[\]|,]*>|\{[A-Za-z_]+\}")
ENVIRONMENT = {"--bootstrap": "RAFTBROKER_BOOTSTRAP", "--data-dir": "RAFTBROKER_DATA_DIR"}

Command = TyperCommand | TyperGroup


def commands(
    command: Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Command]]:
    """Every command and group of the tree, with the words that reach it."""
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            assert isinstance(sub, TyperCommand | TyperGroup)
            yield from commands(sub, (*path, name))


def help_problems(root: typer.Typer) -> list[str]:
    """What is wrong with the --help of every command of `root`, one line per fault."""
    built = typer.main.get_command(root)
    assert isinstance(built, TyperCommand | TyperGroup)
    problems = []
    for path, command in commands(built):
        where = " ".join(path) or "(root)"
        result = CliRunner().invoke(root, [*path, "--help"])
        assert result.exit_code == 0, (where, result.output)
        text = " ".join(result.output.replace("│", " ").split())
        problems += [f"{where}: placeholder {m}" for m in PLACEHOLDER.findall(result.output)]
        for param in command.params:
            hidden = isinstance(param, TyperOption) and param.hidden
            if isinstance(param, TyperOption | TyperArgument) and not hidden and not param.help:
                problems.append(f"{where}: {param.name} is not described")
            for opt, variable in ENVIRONMENT.items():
                if opt in param.opts and variable not in text:
                    problems.append(f"{where}: {opt} without {variable}")
    return problems


def test_every_command_has_plain_described_help() -> None:
    assert help_problems(app) == []


def test_the_checker_finds_each_fault_in_a_plain_typer_app() -> None:
    bare = typer.Typer()

    @bare.command()
    def produce(
        topic: str,
        bootstrap: list[str] | None = typer.Option(None, "--bootstrap"),
        flag: bool = typer.Option(False, "--flag"),
    ) -> None:
        """Produce."""

    @bare.command()
    def other() -> None:
        """Another command, so that `produce` is a subcommand."""

    found = "\n".join(help_problems(bare))
    for fault in (
        "placeholder {topic}",
        "placeholder <list[str]>",
        "placeholder <bool>",
        "topic is not described",
        "flag is not described",
        "--bootstrap without RAFTBROKER_BOOTSTRAP",
    ):
        assert fault in found


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"raftbroker {version('raftbroker')}\n"


def test_the_demo_reads_as_sentences() -> None:
    """Issue 41: the demo printed Python dicts ({'offset': 1334, 'duplicate': False})."""
    report = DemoReport(
        acknowledged=4_000,
        in_log=4_000,
        failovers=[Failover(0, 2, 3, 0.61), Failover(0, 3, 1, 0.58)],
        retry_scene={
            "first": {"offset": 1334, "duplicate": False},
            "retry": {"offset": 1334, "duplicate": True},
            "passed": True,
        },
        fencing_scene={
            "zombie_write": "INVALID_PRODUCER_EPOCH",
            "epochs": {"zombie": 0, "successor": 1},
            "passed": True,
        },
        seconds=14.2,
    )
    out = Console(record=True, width=200)
    render_demo(report, out)
    text = out.export_text()
    assert "{" not in text and "': " not in text, text  # no dict's repr
    assert (
        "lost-ACK retry: the batch appended at offset 1334; sent again, it is answered a "
        "duplicate at offset 1334: PASS" in text
    )
    assert (
        "zombie fencing: the zombie at epoch 0, its successor at epoch 1; the zombie's next "
        "write was INVALID_PRODUCER_EPOCH: PASS" in text
    )
