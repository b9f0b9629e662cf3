"""Waiting in tests: poll a condition until it holds or a deadline passes, never sleep blindly.

`poll_until` (threads, plain tests) and `apoll_until` (coroutines) call `condition` until it
returns something truthy and return that value; past `timeout_s` they fail with a message that
says what was awaited. Every wait of the suite goes through one of them.

A condition says "not yet" with any falsy value, None included, so one that returns
`X | None` gives back an X. A value that may legitimately be falsy (offset 0, an empty detail
string) must be wrapped, in a tuple for instance, to count as reached.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")
POLL_INTERVAL_S = 0.02


def poll_until(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_INTERVAL_S,
) -> T:
    """`condition()`'s first truthy value; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


@overload
async def apoll_until(
    condition: Callable[[], Awaitable[T | None]],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_INTERVAL_S,
) -> T: ...


@overload
async def apoll_until(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_INTERVAL_S,
) -> T: ...


async def apoll_until(
    condition: Callable[[], object],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_INTERVAL_S,
) -> object:
    """`poll_until` for coroutines: `condition` may be sync or async."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
