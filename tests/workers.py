"""How the default run's two test workers (pytest-xdist, `-n 2`) share a 2-core machine.

Most of the suite waits on processes, sockets and deadlines (a serial run keeps about a third of
two cores busy), so two workers halve its time. Two rules keep that from changing what a test
sees:

- Work is handed out a test file at a time, as `--dist loadfile` does, so a module's cluster
  serves every test of that module on one worker; `tests/pipeline/` goes whole to one worker,
  as its cluster and its Spark session (a JVM, tens of seconds of CPU) are per session.
- A test marked `alone` times a cluster against deadlines that a second worker's load could move
  (fault schedules, a paused node, a session timeout): it runs while the other worker waits
  between two of its tests, and a run of them goes on before it. A read-write lock of two
  `flock`s: every test holds the room shared, an `alone` one holds it exclusive; a turnstile
  makes a waiting `alone` test block the next shared taker, so a worker that starts test after
  test cannot starve it. The kernel releases both with the file however the process ends. Like
  the conventional ports' lock, the files are shared by every test run on the machine, so two
  runs at once keep the rule too. Only the other worker's tests wait: its module and session
  fixtures (an idle cluster, the pipeline's Spark JVM) stay up meanwhile. A test that takes the
  conventional ports' lock takes it inside its turn (room, then ports), never across two turns,
  so the two locks are always taken in one order.
"""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

_LOCKS = Path(tempfile.gettempdir())
# Test directories whose files share session fixtures: one unit of work each.
WHOLE_DIRECTORIES = ("tests/pipeline/",)
# The longest units, handed out first so that none starts near the end and runs on alone (the
# rest go by their number of tests, xdist's order): a minute or more each on a loaded machine.
LONGEST_FIRST = (
    "tests/cluster/test_docs_examples.py",
    "tests/chaos/test_chaos.py",
    "tests/pipeline/",
    "tests/cluster/test_client_failover.py",
    "tests/cluster/test_kafka_groups.py",
)


@dataclass(frozen=True, slots=True)
class Room:
    """The read-write lock's two files."""

    shared: Path = _LOCKS / "raftbroker-tests-room.lock"
    turnstile: Path = _LOCKS / "raftbroker-tests-turnstile.lock"

    @contextlib.contextmanager
    def held(self, *, alone: bool) -> Iterator[None]:
        """The machine for one test: shared with the other worker's tests, or to itself."""
        with self.turnstile.open("a") as turnstile, self.shared.open("a") as shared:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            if alone:
                fcntl.flock(shared, fcntl.LOCK_EX)  # the turnstile held: no new shared taker
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            else:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
                fcntl.flock(shared, fcntl.LOCK_SH)
            yield


class Turns:
    """One worker's hold on the room from test to test: released after each test, except
    between two `alone` tests, so that a run of them (a module marked `alone`) is not cut by
    the other worker's tests."""

    def __init__(self, room: Room) -> None:
        self._room = room
        self._held: contextlib.ExitStack | None = None

    def take(self, *, alone: bool) -> None:
        if self._held is None:
            with contextlib.ExitStack() as held:
                held.enter_context(self._room.held(alone=alone))
                self._held = held.pop_all()  # only once the room is held

    def give(self, *, keep: bool) -> None:
        if not keep and self._held is not None:
            self._held.close()
            self._held = None


def scope_of(nodeid: str) -> str:
    """A test's unit of work: its file, or the whole directory it is in."""
    path = nodeid.split("::", 1)[0]
    return next((d for d in WHOLE_DIRECTORIES if path.startswith(d)), path)


class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
    """`--dist loadfile`, with each of `WHOLE_DIRECTORIES` one unit, `LONGEST_FIRST` first."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _assign_work_unit(self, node: object) -> None:
        # `schedule` builds the queue just before it hands out the first unit; idempotent after.
        for scope in reversed(LONGEST_FIRST):
            if scope in self.workqueue:
                self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)
