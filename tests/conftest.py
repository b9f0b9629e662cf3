"""Options of the whole suite: how long, and from which seed, the fuzzer runs
(tests/adversarial/test_fuzz.py). The default run fuzzes each listener a few seconds from fixed
seeds; `pytest -m slow tests/adversarial/test_fuzz.py --fuzz-seconds 600 --fuzz-seed 7` runs
the long one.

Tests marked `kcat` run the kcat binary: where it is not installed they are skipped with the
reason (pytest's -ra lists it), unless RAFTBROKER_REQUIRE_KCAT=1 (as .ci/run sets, having
installed it), where they run and fail.

The run is spread over two workers (tests/workers.py says how they share the machine): a test
marked `alone` runs while the other worker waits."""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator

import pytest

from tests import workers

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


TURNS = pytest.StashKey[workers.Turns]()


def alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    # Around setup, call and teardown: a module's cluster starts and stops inside its test's turn.
    turns = item.config.stash.setdefault(TURNS, workers.Turns(workers.Room()))
    turns.take(alone=alone(item))
    try:
        return (yield)
    finally:
        turns.give(keep=alone(item) and alone(nextitem))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(
    config: pytest.Config, log: object
) -> workers.FileScheduling | None:
    # The default distribution (and loadfile): ours; another asked for by name: xdist's own.
    if config.getvalue("dist") not in ("load", "loadfile"):
        return None
    return workers.FileScheduling(config, log)
