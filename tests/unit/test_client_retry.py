"""A call's attempts on a clock the test drives (cluster/client/retry.py): the deadline is read
from the policy's clock, a request's timeout is cut to what the call has left, and the call
gives up when its clock says the timeout is spent, naming what it waited for and the last
failure, however quickly the attempts failed in real time."""

from __future__ import annotations

import asyncio

import pytest

from cluster.client import CallTimeoutError
from cluster.client.retry import Attempts, Failure, RetryPolicy
from statemachine.errors import ErrorCode


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1_000.0

    def __call__(self) -> float:
        return self.now_s


def test_the_deadline_and_a_requests_share_come_from_the_policys_clock() -> None:
    clock = FakeClock()
    attempts = Attempts("a leader for t-0", 30.0, RetryPolicy(clock=clock))
    assert attempts.left_s() == 30.0
    assert attempts.request_timeout_s(10.0) == 10.0
    clock.now_s += 25.0
    assert attempts.request_timeout_s(10.0) == 5.0  # cut to what the call has left
    clock.now_s += 10.0
    assert attempts.request_timeout_s(10.0) == 0.05  # never nothing: one more try


def test_the_call_gives_up_when_its_clock_says_so() -> None:
    clock = FakeClock()
    attempts = Attempts("a leader for t-0", 30.0, RetryPolicy(backoff_s=0.001, clock=clock))

    async def spend() -> int:
        pauses = 0
        while True:
            attempts.failed(Failure(ErrorCode.NOT_LEADER_OR_FOLLOWER, "127.0.0.2:9092"))
            await attempts.pause()
            pauses += 1
            clock.now_s += 7.0  # each attempt "takes" 7 s

    with pytest.raises(CallTimeoutError) as caught:
        asyncio.run(spend())
    error = caught.value
    assert error.error is ErrorCode.NOT_LEADER_OR_FOLLOWER  # the last failure's code
    assert str(error) == (
        "a leader for t-0 within 30000 ms (last: NOT_LEADER_OR_FOLLOWER from 127.0.0.2:9092)"
    )
    assert clock.now_s == 1_035.0  # gave up at the first pause past the deadline
