"""Help text a person reads: no type placeholders (`<bool>`, `<list[str]>`, `{topic}`).

Typer (0.2x) shows every parameter's Python type in --help and wraps required arguments in
braces in the usage line. `PlainHelpGroup`, the root command's class, rewrites the display of
the whole command tree once typer has built it (every subcommand and group, whichever module
declared it):

- an option shows its metavar (`HOST:PORT`, `N`, `text|json`); a flag, --help too, nothing;
- an argument shows its name in capitals (`TOPIC`, `[NAME]` when optional) and no type.

Rules: only how parameters are displayed changes, never how they parse. A declared metavar
wins; otherwise one is made from the type (`N` for numbers, `PATH`, `TEXT`, the choices). On
a typer without these internals the names it lacks are skipped and its own display stays.
"""

from __future__ import annotations

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
    """The root group: plain display for every parameter of the tree below it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain_help(self)


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
