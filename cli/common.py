"""What every CLI command shares: where the cluster is, running async code, one-line errors.

Bootstrap addresses come from `--bootstrap HOST:PORT` (repeatable), else the
`RAFTBROKER_BOOTSTRAP` environment variable (comma-separated), else the local cluster recorded
in `--data-dir` (default: `$RAFTBROKER_DATA_DIR`, else `~/.local/share/raftbroker`). Errors are
one line on stderr (`raftbroker: ...`) and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer

from cluster.addresses import parse_address
from cluster.client import CallTimeoutError, ClientError
from cluster.config import ConfigError
from cluster.local import launcher

P = ParamSpec("P")
T = TypeVar("T")

BootstrapOption = typer.Option(
    None,
    "--bootstrap",
    "-b",
    help="A broker's HOST:PORT (repeatable). "
    "Default: $RAFTBROKER_BOOTSTRAP, else the local cluster of --data-dir.",
)
DataDirOption = typer.Option(
    None, "--data-dir", help="The local cluster's directory (default: ~/.local/share/raftbroker)."
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")


class CliError(Exception):
    """A user-facing failure: printed as one line."""


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"raftbroker: {message}", err=True)
    raise typer.Exit(code)


def default_data_dir() -> Path:
    configured = os.environ.get("RAFTBROKER_DATA_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "raftbroker"


def resolve_bootstrap(bootstrap: list[str] | None, data_dir: Path | None) -> list[str]:
    addresses = list(bootstrap or [])
    if not addresses and os.environ.get("RAFTBROKER_BOOTSTRAP"):
        addresses = [a.strip() for a in os.environ["RAFTBROKER_BOOTSTRAP"].split(",") if a]
    if not addresses:
        cluster = launcher.LocalCluster.load(data_dir or default_data_dir())
        if cluster is None:
            raise CliError(
                "no cluster to talk to: pass --bootstrap HOST:PORT, set RAFTBROKER_BOOTSTRAP, "
                "or start one with `raftbroker cluster up`"
            )
        addresses = cluster.bootstrap
    for address in addresses:
        try:
            parse_address(address)
        except ValueError:
            raise CliError(f"{address!r} is not HOST:PORT") from None
    return addresses


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a new loop: uvloop's where it is installed, else
    asyncio's. The one runner of the project (nodes, commands, benchmarks): uvloop is used
    nowhere else."""
    try:
        import uvloop  # noqa: PLC0415 - optional: absent on Windows
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def one_line_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn the errors a user can cause or meet into one line and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except (CliError, ConfigError) as exc:
            fail(str(exc))
        except ClientError as exc:
            fail(_client_message(exc))
        except TimeoutError as exc:
            fail(f"timed out: {exc}" if str(exc) else "timed out")
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": "))

    return wrapper


def _client_message(exc: ClientError) -> str:
    """A call that timed out says what it waited for (and, if no broker ever answered, that
    the cluster is out of reach); a single failed request names its error."""
    if isinstance(exc, CallTimeoutError):
        return f"cannot reach the cluster: {exc}" if exc.unreachable else str(exc)
    if exc.error.name == "NETWORK_EXCEPTION":
        return f"cannot reach the cluster ({exc})"
    return str(exc)
