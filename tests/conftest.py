"""Options of the whole suite: how long, and from which seed, the fuzzer runs
(tests/adversarial/test_fuzz.py). The default run fuzzes each listener a few seconds from fixed
seeds; `pytest -m slow tests/adversarial/test_fuzz.py --fuzz-seconds 600 --fuzz-seed 7` runs
the long one."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fuzz", "the fuzzer of the client listeners")
    group.addoption(
        "--fuzz-seconds",
        type=float,
        default=None,
        help="how long the long fuzz runs on each listener (default 120 s; with -m slow)",
    )
    group.addoption(
        "--fuzz-seed",
        type=int,
        default=None,
        help="the long fuzz run's seed (default: one from the clock, printed)",
    )
