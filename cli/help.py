"""Help text a person reads: no type placeholders (`<bool>`, `<list[str]>`, `{topic}`).

Typer (0.2x) shows every parameter's Python type in --help and wraps required arguments in
braces in the usage line. `PlainHelpGroup`, the root command's class, rewrites the display of
the whole command tree once typer has built it (every subcommand and group, whichever module
declared it):

- an option shows its metavar (`HOST:PORT`, `N`, `text|json`); a flag, --help too, nothing;
- an argument shows its name in capitals (`TOPIC`, `[NAME]` when optional) and no type;
- a usage error is one line on stderr, as every other error of the command (status 2).

Rules: only how parameters are displayed changes, never how they parse. A declared metavar
wins; otherwise one is made from the type (`N` for numbers, `PATH`, `TEXT`, the choices). On
a typer without these internals the names it lacks are skipped and its own display stays.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


class PlainArgument(TyperArgument):
    """An argument shown by its name alone: `TOPIC` in the usage line and in the help."""

    def display_type_rich(self, ctx: Any) -> str | None:  # noqa: ARG002 - typer passes it
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return f"{name}..." if self.nargs != 1 else name


class PlainHelpGroup(TyperGroup):
    """The root group: plain display for every parameter of the tree below it, and a usage
    error (a bad flag, a value out of range, a missing argument) in one line, as every other
    error of the command: `raftbroker: Invalid value for '--partitions': ... (see `raftbroker
    topic create --help`)`, status 2, where typer drew a framed panel."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain_help(self)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        call = (args, prog_name, complete_var)
        if not standalone_mode:
            return super().main(*call, False, windows_expand_args, **extra)
        try:
            code = super().main(*call, False, windows_expand_args, **extra)
        except typer.TyperException as exc:
            sys.exit(_said_in_one_line(exc))
        except typer.Abort:
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _said_in_one_line(exc: typer.TyperException) -> int:
    """Print a command-line error in one line; its exit status. Running with no arguments at
    all is not one: it shows the help, as typer does."""
    show, message = getattr(exc, "show", None), getattr(exc, "format_message", None)
    if type(exc).__name__ == "NoArgsIsHelpError" or message is None:
        if show is not None:
            show()
        return int(getattr(exc, "exit_code", 2))
    ctx = getattr(exc, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    text = " ".join(str(message()).split())
    typer.echo(f"raftbroker: {text}{where}", err=True)
    return int(getattr(exc, "exit_code", 2))


def plain_help(command: TyperCommand | TyperGroup) -> None:
    """Give every parameter of `command` and of its subcommands a plain display."""
    help_option = command.get_help_option(typer.Context(command))
    for param in [*command.params, *([help_option] if help_option else [])]:
        if isinstance(param, TyperOption):
            param.metavar = option_metavar(param)
        elif isinstance(param, TyperArgument):
            # The same object re-classed: its parsing state stays as typer built it.
            param.__class__ = PlainArgument
            param.metavar = param.metavar or (param.name or "value").upper()
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            assert isinstance(sub, TyperCommand | TyperGroup), sub
            plain_help(sub)


def option_metavar(option: TyperOption) -> str:
    """The option's declared metavar; else nothing for a flag, the choices, or its type's."""
    if option.metavar is not None:
        return option.metavar
    if option.is_flag:
        return ""
    kind = getattr(option, "type_descriptor", None)
    if kind is None:
        return "VALUE"
    if kind.is_choice:
        return "|".join(str(getattr(c, "value", c)) for c in kind.choices or ())
    if kind.is_path:
        return "PATH"
    return "N" if kind.annotation in (int, float) else "TEXT"
