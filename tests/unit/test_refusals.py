"""RefusalLog: the first refusal of a kind is logged at once, later ones fold into one line per
interval with their count, and kinds are limited apart."""

from __future__ import annotations

import logging

import pytest

from cluster.refusals import RefusalLog


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_kind_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    refusals = RefusalLog(logging.getLogger("t.refusals"), 10.0, clock)
    with caplog.at_level(logging.WARNING, "t.refusals"):
        for i in range(1_000):
            refusals.warn("too many connections", f"from 127.0.0.{i % 7}")
        assert len(caplog.records) == 1, "a flood of refusals logs one line"
        clock.now += 10.0
        refusals.warn("too many connections", "from 127.0.0.9")
    assert refusals.refused == 1_001
    assert len(caplog.records) == 2
    second = caplog.records[1].getMessage()
    assert "999 more like it" in second and "127.0.0.9" in second
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_kinds_are_limited_apart(caplog: pytest.LogCaptureFixture) -> None:
    refusals = RefusalLog(logging.getLogger("t.refusals"), 10.0, FakeClock())
    with caplog.at_level(logging.WARNING, "t.refusals"):
        refusals.warn("stranger", "a")
        refusals.warn("wrong secret", "b")
        refusals.warn("stranger", "c")
    assert [r.getMessage() for r in caplog.records] == ["stranger: a", "wrong secret: b"]


def test_flush_reports_what_was_folded(caplog: pytest.LogCaptureFixture) -> None:
    refusals = RefusalLog(logging.getLogger("t.refusals"), 10.0, FakeClock())
    with caplog.at_level(logging.WARNING, "t.refusals"):
        for detail in "abc":
            refusals.warn("stranger", detail)
        refusals.flush()
        refusals.flush()  # nothing folded any more: no second line
    assert [r.getMessage() for r in caplog.records] == [
        "stranger: a",
        "stranger: c (and 1 more like it)",
    ]


def test_a_flood_that_stopped_is_counted_within_an_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    refusals = RefusalLog(logging.getLogger("t.refusals"), 10.0, clock)
    with caplog.at_level(logging.WARNING, "t.refusals"):
        for i in range(50):
            refusals.warn("stranger", f"from 127.0.0.{i}")
        refusals.flush_due()  # within the interval: still folded
        assert len(caplog.records) == 1
        clock.now += 10.0
        refusals.flush_due()
        refusals.flush_due()  # told once
    assert [r.getMessage() for r in caplog.records] == [
        "stranger: from 127.0.0.0",
        "stranger: from 127.0.0.49 (and 48 more like it in the last 10 s)",
    ]
