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
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console

from cluster.addresses import parse_address
from cluster.client import CallTimeoutError, Client, ClientError, PartitionInfo
from cluster.config import ConfigError
from cluster.local import launcher
from statemachine.errors import ErrorCode

P = ParamSpec("P")
T = TypeVar("T")

BootstrapOption = typer.Option(
    None,
    "--bootstrap",
    "-b",
    metavar="HOST:PORT",
    help="A broker's address (repeatable). "
    "Default: $RAFTBROKER_BOOTSTRAP (comma-separated), else the local cluster of --data-dir.",
)
DataDirOption = typer.Option(
    None,
    "--data-dir",
    metavar="DIR",
    help="The local cluster's directory. "
    "Default: $RAFTBROKER_DATA_DIR, else ~/.local/share/raftbroker.",
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")
# A local cluster's nodes (`cluster up`, the demo) create a topic a Kafka client names first,
# as Kafka's own default: a newcomer's `kcat -P -t new-topic` works. Off elsewhere (Redpanda's).
# And a new consumer group forms at once, as with the server.properties Kafka ships for
# development (group.initial.rebalance.delay.ms=0; the least ours takes is 1 ms): the 3 s wait
# for more members is a production setting, and made a first `consume --group` wait for it.
LOCAL_GROUP_INITIAL_REBALANCE_DELAY_MS = 1
LOCAL_CLUSTER_TOML = (
    "[topics]\nauto_create = true\n"
    f"[timing]\ngroup_initial_rebalance_delay_ms = {LOCAL_GROUP_INITIAL_REBALANCE_DELAY_MS}\n"
)
# Before a command talks to a cluster, one of its bootstrap addresses must take a connection:
# each is tried within CONNECT_TIMEOUT_S, all of them again every RETRY_S, for BOOTSTRAP_WAIT_S.
BOOTSTRAP_WAIT_S = 5.0
CONNECT_TIMEOUT_S = 1.0
RETRY_S = 0.5
PROGRESS_INTERVAL_S = 2.0


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
    """The addresses to bootstrap from, once one of them takes a connection (`_reachable`).
    From the local cluster, one of whose nodes must run: else it says so at once."""
    addresses = list(bootstrap or [])
    if not addresses and os.environ.get("RAFTBROKER_BOOTSTRAP"):
        addresses = [a.strip() for a in os.environ["RAFTBROKER_BOOTSTRAP"].split(",") if a]
    if not addresses:
        directory = data_dir or default_data_dir()
        cluster = launcher.LocalCluster.load(directory)
        if cluster is None:
            raise CliError(
                "no cluster to talk to: pass --bootstrap HOST:PORT, set RAFTBROKER_BOOTSTRAP, "
                "or start one with `raftbroker cluster up`"
            )
        if all(launcher.node_pid(cluster, node) is None for node in cluster.nodes):
            raise CliError(
                f"the local cluster in {directory} is not running: start it with "
                f"`raftbroker cluster up{'' if data_dir is None else f' --data-dir {directory}'}`"
            )
        addresses = cluster.bootstrap
    for address in addresses:
        try:
            parse_address(address)
        except ValueError:
            raise CliError(f"{address!r} is not HOST:PORT") from None
    _reachable(addresses)
    return addresses


def _reachable(addresses: list[str]) -> None:
    """Return once some address takes a TCP connection. While none does, say so on stderr
    every `PROGRESS_INTERVAL_S`; after `BOOTSTRAP_WAIT_S`, fail naming each address and why.
    (A command rides out dead nodes, but not a cluster that is not there at all.)"""
    deadline = time.monotonic() + BOOTSTRAP_WAIT_S
    said_at = 0.0
    while True:
        problems = [p for p in map(_connect_problem, addresses) if p is not None]
        if len(problems) < len(addresses):
            return
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise CliError(f"cannot reach the cluster at {', '.join(problems)}")
        if time.monotonic() - said_at >= PROGRESS_INTERVAL_S:
            said_at = time.monotonic()
            typer.echo(
                f"raftbroker: no broker answers ({'; '.join(problems)}): "
                f"trying again for {left_s:.0f} s",
                err=True,
            )
        time.sleep(min(RETRY_S, max(left_s, 0)))


def _connect_problem(address: str) -> str | None:
    """None when `address` takes a TCP connection; else "address (why)"."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{address} ({(exc.strerror or str(exc) or type(exc).__name__).lower()})"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a new loop: uvloop's where it is installed, else
    asyncio's. The one runner of the project (nodes, commands, benchmarks): uvloop is used
    nowhere else. SIGTERM (what `timeout`, systemd and `docker stop` send) ends it as SIGINT
    does (`_terminated_as_interrupted`)."""
    try:
        import uvloop  # noqa: PLC0415 - optional: absent on Windows
    except ImportError:
        return asyncio.run(_terminated_as_interrupted(coro))
    return uvloop.run(_terminated_as_interrupted(coro))


async def _terminated_as_interrupted(coro: Coroutine[Any, Any, T]) -> T:
    """`coro`, which SIGTERM cancels as the runner cancels it on SIGINT (Ctrl-C): a command
    that catches the cancellation finishes its work (a consumer commits what it printed and
    leaves its group, a producer has what it sent acknowledged) and returns as usual; one that
    does not ends with KeyboardInterrupt, as after Ctrl-C."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None, "run on a task"
    terminated = asyncio.Event()

    def terminate() -> None:
        terminated.set()
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await coro
    except asyncio.CancelledError:
        if terminated.is_set() and task.uncancel() == 0:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def finish_on_interrupt() -> None:
    """In a command that caught the cancellation of Ctrl-C or SIGTERM (see `run`) to finish
    its work: the cancellation is taken, so the work's own awaits go on."""
    task = asyncio.current_task()
    assert task is not None, "run on a task"
    task.uncancel()


UNWRAPPED_WIDTH = 1000  # columns of output that is not a terminal: a pipe or a file


def console(*, stderr: bool = False) -> Console:
    """A Console for tables and text: a terminal's own width; for a pipe or a file, lines as
    long as their content (rich would otherwise wrap them at 80 columns)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)


def plural(count: int, noun: str) -> str:
    """`1 record`, `3 records`, `1,000 records`."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


async def topic_partitions(
    client: Client, topic: str, partition: int | None = None
) -> tuple[PartitionInfo, ...]:
    """The partitions of `topic`; a CliError at once if it does not exist or has no
    `partition` (rather than waiting for a leader that cannot be)."""
    try:
        infos = await client.partitions(topic)
    except ClientError as exc:
        if exc.error != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        raise CliError(
            f"topic {topic!r} does not exist (create it with `raftbroker topic create {topic}`)"
        ) from None
    if partition is not None and not 0 <= partition < len(infos):
        raise CliError(
            f"topic {topic} has {plural(len(infos), 'partition')} ({partition_range(len(infos))}),"
            f" not {partition}"
        )
    return infos


def partition_range(count: int) -> str:
    return "0" if count == 1 else f"0-{count - 1}"


def one_line_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn the errors a user can cause or meet into one line and exit status 1; one inside an
    exception group (a task group's) too. Anything else is a bug: its traceback is shown."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except (BaseExceptionGroup, *USER_FACING) as exc:
            if _reader_went_away(exc):
                _quiet_exit_on_closed_pipe()
            message = error_line(exc)
            if message is None:
                raise
            fail(message)

    return wrapper


USER_FACING = (CliError, ConfigError, ClientError, TimeoutError, OSError)
SIGPIPE_EXIT_STATUS = 128 + 13  # what a shell reports for a writer killed by SIGPIPE


def _reader_went_away(exc: BaseException) -> bool:
    """Whether stdout's reader closed the pipe (`raftbroker consume t | head`)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(lambda e: isinstance(e, BrokenPipeError)) is not None
    return isinstance(exc, BrokenPipeError)


def _quiet_exit_on_closed_pipe() -> NoReturn:
    """Stop as `yes | head` does: no message, status 141. Stdout goes to /dev/null first, so
    the interpreter's last flush of it does not fail again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    raise SystemExit(SIGPIPE_EXIT_STATUS)


def error_line(exc: BaseException) -> str | None:
    """The one line for an error a user can cause or meet; None for anything else. Of an
    exception group: the line of its first such error (the others followed from it)."""
    if isinstance(exc, BaseExceptionGroup):
        found = exc.subgroup(lambda e: isinstance(e, USER_FACING))
        return None if found is None else error_line(_first_leaf(found))
    if isinstance(exc, ClientError):
        return _client_message(exc)
    if isinstance(exc, TimeoutError):
        return f"timed out: {exc}" if str(exc) else "timed out"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": ")
    if isinstance(exc, CliError | ConfigError):
        return str(exc)
    return None


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _client_message(exc: ClientError) -> str:
    """A call that timed out says what it waited for (and, if no broker ever answered, that
    the cluster is out of reach); a single failed request says what it was refused, its code
    last when its message is a sentence of its own (`topic 'x' already exists (CODE)`)."""
    if isinstance(exc, CallTimeoutError):
        return f"cannot reach the cluster: {exc}" if exc.unreachable else str(exc)
    if exc.error.name == "NETWORK_EXCEPTION":
        return f"cannot reach the cluster ({exc})"
    if " " in exc.message:
        return f"{exc.message} ({exc.error.name})"
    return str(exc)
