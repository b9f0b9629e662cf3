"""Options of the whole suite: how long, and from which seed, the fuzzer runs
(tests/adversarial/test_fuzz.py). The default run fuzzes each listener a few seconds from fixed
seeds; `pytest -m slow tests/adversarial/test_fuzz.py --fuzz-seconds 600 --fuzz-seed 7` runs
the long one.

Tests marked `kcat` run the kcat binary: where it is not installed they are skipped with the
reason (pytest's -ra lists it), unless RAFTBROKER_REQUIRE_KCAT=1 (as .ci/run sets, having
installed it), where they run and fail."""

from __future__ import annotations

import os
import shutil

import pytest

KCAT_MISSING = (
    "kcat is not installed (Debian and Ubuntu: apt-get install kcat; .ci/run installs it)"
)


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if shutil.which("kcat") is not None or os.environ.get("RAFTBROKER_REQUIRE_KCAT") == "1":
        return
    for item in items:
        if item.get_closest_marker("kcat") is not None:
            item.add_marker(pytest.mark.skip(reason=KCAT_MISSING))
