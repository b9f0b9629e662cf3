"""How a call rides out failures: its timeout, a bounded backoff, and the message when it gives up.

Role: the one retry discipline of the client. A dead node, a refused or broken connection, a
request timeout and a leader change are retriable (their codes are, cluster/errors.py); a call
retries them, backing off (doubling, with a bound), until its own timeout is spent, and then
fails with a `CallTimeoutError` naming what it waited for and the last failure it met:

    no leader for orders-1 answered within 30000 ms (last: NETWORK_EXCEPTION from
    127.0.0.3:9092: ConnectionRefusedError(111, 'Connection refused'))

Rules: a non-retriable error ends the call at once. UNKNOWN_TOPIC_OR_PARTITION is retriable in
Kafka's list (metadata may lag), but once metadata says the topic does not exist it is final:
`final` decides. Every call makes at least one attempt, however small its timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cluster.client.errors import ClientError
from cluster.errors import RaftbrokerError
from statemachine.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A call's patience (Kafka's default.api.timeout.ms) and the backoff between attempts."""

    timeout_s: float = 60.0
    backoff_s: float = 0.05
    backoff_max_s: float = 1.0
    # Seconds on a monotonic clock, the client's: every deadline it judges (a call's, a
    # batch's delivery timeout, how long a partition has stalled) is read from it, so a test
    # can drive them. Waits (a long poll, a heartbeat's schedule) stay on the loop's time.
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.timeout_s < 0:
            raise ValueError("a call's timeout_s is not negative")
        if not 0 < self.backoff_s <= self.backoff_max_s:
            raise ValueError("backoff_s must be positive and at most backoff_max_s")


class Failure(NamedTuple):
    """One failed attempt, as the give-up message quotes it."""

    error: ErrorCode
    address: str = ""
    detail: str = ""

    @classmethod
    def of(cls, exc: RaftbrokerError, address: str = "") -> Failure:
        address = address or getattr(exc, "address", "")
        detail = exc.message.removeprefix(f"{address}: ") if address else exc.message
        if detail in (exc.error.name, address):
            detail = ""
        return cls(exc.error, address, detail)

    def __str__(self) -> str:
        text = self.error.name + (f" from {self.address}" if self.address else "")
        return f"{text}: {self.detail}" if self.detail else text


class CallTimeoutError(ClientError):
    """A call spent its timeout on retriable failures. `.error` is the last failure's code;
    `str()` is one line: what it waited for, how long, and the last failure. `unreachable`:
    the call could use any broker and none could be reached at all (refused, broken)."""

    def __init__(
        self,
        waited_for: str,
        timeout_s: float,
        last: Failure | None,
        *,
        unreachable: bool = False,
    ) -> None:
        self.waited_for = waited_for
        self.timeout_ms = round(timeout_s * 1000)
        self.last = last
        self.unreachable = unreachable
        text = f"{waited_for} within {self.timeout_ms} ms"
        super().__init__(
            last.error if last else ErrorCode.REQUEST_TIMED_OUT,
            f"{text} (last: {last})" if last else text,
        )

    def __str__(self) -> str:
        return self.message


def final(error: ErrorCode) -> bool:
    """True where retrying cannot help: a non-retriable code, or a topic metadata says is gone."""
    return not error.retriable or error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class Attempts:
    """One call's attempts: `timeout_s` from now, the backoff between them, the last failure.
    `any_broker`: a call any broker could serve (its timeout says whether one was reached)."""

    def __init__(
        self, waited_for: str, timeout_s: float, policy: RetryPolicy, *, any_broker: bool = False
    ) -> None:
        self.waited_for = waited_for
        self.timeout_s = timeout_s
        self._clock = policy.clock
        self.deadline = self._clock() + timeout_s
        self.last: Failure | None = None
        self.any_broker = any_broker
        self.reached = False  # some broker took a request, if only to fail it or time out
        self._backoff_s = policy.backoff_s
        self._backoff_max_s = policy.backoff_max_s

    def left_s(self) -> float:
        return self.deadline - self._clock()

    def request_timeout_s(self, request_timeout_s: float) -> float:
        """A request's timeout: its own, cut to what is left of the call (never nothing)."""
        return min(request_timeout_s, max(self.left_s(), 0.05))

    def failed(self, failure: Failure) -> None:
        self.last = failure

    def timed_out(self) -> CallTimeoutError:
        unreachable = self.any_broker and not self.reached
        return CallTimeoutError(self.waited_for, self.timeout_s, self.last, unreachable=unreachable)

    async def pause(self) -> None:
        """Back off before the next attempt; CallTimeoutError if the timeout is spent."""
        left_s = self.left_s()
        if left_s <= 0:
            raise self.timed_out()
        await asyncio.sleep(min(self._backoff_s, left_s))
        self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)


async def retrying(
    attempt: Callable[..., Awaitable[Any]],
    deadline_s: float,
    backoff_s: float = 0.1,
    *,
    waited_for: str = "no attempt succeeded",
) -> Any:
    """`attempt()`'s result, retrying retriable ClientErrors until `deadline_s` is spent; then
    a CallTimeoutError (with the last error's code). Recovery between attempts (another
    address, fresh metadata) is the attempt's own business."""
    attempts = Attempts(waited_for, deadline_s, RetryPolicy(deadline_s, backoff_s, 1.0))
    while True:
        try:
            return await attempt()
        except ClientError as exc:
            if not exc.retriable:
                raise
            attempts.failed(Failure.of(exc))
        await attempts.pause()
