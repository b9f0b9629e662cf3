"""A node's process setup, done only here: TOML, logging, the allocator, signals, and the
fatal exit.

A node runs under `run_node_process`, on `cli.common.run`'s loop (uvloop where installed):
SIGTERM and SIGINT cancel it cleanly (Raft driver stopped, stores closed); a fatal storage error
logs and exits at once with status 70, since going on would leave a replica's state ahead of
its data. Before anything else the process takes its data directory's lock
(`layout.lock_data_dir`), held until it exits: a second node on the same directory stops at
once (status 71) naming the first, and `raftbroker cluster down` knows which process is the
node.
"""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import tomllib
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn

from cli.common import run
from cluster.broker import layout
from cluster.config import ConfigError, NodeConfig

EXIT_FATAL = 70
EXIT_CANNOT_RUN = 71
SHUTDOWN_TIMEOUT_S = 8.0
log = logging.getLogger("raftbroker")


def load_node_config(path: Path) -> NodeConfig:
    """Parse and validate a node's TOML file; ConfigError with the setting's name.

    `cluster_secret_file = "/run/secrets/..."` instead of `cluster_secret` reads the secret
    from that file (a Docker secret, say), so that it need not sit in a committed config.
    """
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if "cluster_secret_file" in raw:
        raw["cluster_secret"] = _read_secret_file(raw)
    return NodeConfig.from_mapping(raw)


def _read_secret_file(raw: dict[str, Any]) -> str:
    secret_path = raw.pop("cluster_secret_file")
    if "cluster_secret" in raw:
        raise ConfigError("set cluster_secret or cluster_secret_file, not both")
    if not isinstance(secret_path, str):
        raise ConfigError("cluster_secret_file must be a path")
    try:
        text = Path(secret_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cluster_secret_file: cannot read {secret_path}: {exc}") from exc
    return text.strip()  # a file written by `echo` or an editor ends with a newline


def configure_logging(prefix: str, level: int = logging.INFO) -> None:
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {prefix} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)


def fatal_exit(reason: str) -> NoReturn:
    log.critical("fatal: %s", reason)
    logging.shutdown()
    os._exit(EXIT_FATAL)


async def _cancel_on_signals(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop, task)
    try:
        await coro
    except asyncio.CancelledError:
        log.info("stopped")


def _stop(task: asyncio.Task[Any]) -> None:
    task.cancel()
    # A clean stop takes well under a second. Should one hang, the tracebacks of every thread
    # go to the log and the process exits anyway: storage recovers from that as from a crash.
    faulthandler.dump_traceback_later(SHUTDOWN_TIMEOUT_S, exit=True)


# glibc's malloc, as a node uses it: a produced batch of up to a frame's size is copied a few
# times on its way (read, framed, decoded, packed for the followers), each copy freed before
# the next batch comes. By default glibc serves a block this large with a fresh mmap, or gives
# the heap's freed top back to the kernel, so that every batch pays a page fault and a zeroed
# page per 4 KiB of each copy: several times the copy itself (bench/HISTORY.md). Kept in the
# heap instead, up to these bounds: what the node holds is bounded by its limits anyway.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024


def keep_large_blocks_in_the_heap() -> bool:
    """Set glibc's thresholds for the node's large buffers (above); False where the C library
    is not glibc (its allocator is left as it is)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def run_node_process(config: NodeConfig) -> None:
    """Run a node until a signal; a port it cannot bind, or a data directory another node
    holds, ends it at once with a clear error."""
    # Imported here, not with the module: the broker (and the Kafka codec under it) is a
    # node's alone, and every other command starts in about half the time without it. Before
    # the lock is taken: a node is found (and signalled) by its lock, and a SIGTERM that came
    # during this import, before the handlers are in, would kill it uncleanly.
    from cluster.service import run_node  # noqa: PLC0415

    configure_logging(f"node{config.node_id}")
    if not keep_large_blocks_in_the_heap():
        log.info("glibc's allocator thresholds not set (another C library, or refused)")
    config.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = layout.lock_data_dir(config.data_dir)
    except OSError as exc:
        _cannot_run([exc])
    try:
        layout.check_data_format(config.data_dir)
    except OSError as exc:
        _cannot_run([exc])
    try:
        run(_cancel_on_signals(run_node(config, fatal_exit)))
    except* OSError as group:
        _cannot_run(group.exceptions)
    finally:
        os.close(lock)  # the process is ending: the kernel would drop the lock anyway


def _cannot_run(errors: Sequence[BaseException]) -> NoReturn:
    for exc in errors:
        log.critical("cannot run: %s", exc)
    logging.shutdown()
    sys.exit(EXIT_CANNOT_RUN)
