"""The two test workers' lock (tests/workers.py): an `alone` test runs with no other test, and a
worker starting test after test cannot keep it waiting. Threads stand in for the workers: a
`flock` belongs to an open file, so two opens in one process contend as two processes do."""

from __future__ import annotations

import contextlib
import fcntl
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.polling import poll_until
from tests.workers import LONGEST_FIRST, WHOLE_DIRECTORIES, Room, Turns, scope_of

WAIT_S = 10.0


def taken(turnstile: Path) -> bool:
    """Whether someone holds the turnstile (an `alone` taker waiting for the room)."""
    with turnstile.open("a") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


class Holder:
    """A thread that takes the room, holds it until `leave`, and records when it got in."""

    def __init__(self, room: Room, *, alone: bool) -> None:
        self.entered = threading.Event()
        self._left = threading.Event()
        # A daemon: a broken lock leaves it blocked in flock, which must not hold the run open.
        self._thread = threading.Thread(target=self._hold, args=(room, alone), daemon=True)
        self._thread.start()

    def _hold(self, room: Room, alone: bool) -> None:
        with room.held(alone=alone):
            self.entered.set()
            self._left.wait(WAIT_S)

    def release(self) -> None:
        self._left.set()

    def leave(self) -> None:
        self.release()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive()


@contextlib.contextmanager
def holders() -> Iterator[list[Holder]]:
    """Every holder made in the block leaves at its end, whatever the test asserted."""
    made: list[Holder] = []
    try:
        yield made
    finally:
        for holder in reversed(made):
            holder.release()


def test_shared_tests_hold_the_room_together(tmp_path: Path) -> None:
    room = Room(tmp_path / "room", tmp_path / "turnstile")
    with holders() as made:
        made += [Holder(room, alone=False), Holder(room, alone=False)]
        assert all(h.entered.wait(WAIT_S) for h in made)
        for holder in made:
            holder.leave()


def test_an_alone_test_waits_for_the_running_one_and_goes_before_any_later(
    tmp_path: Path,
) -> None:
    room = Room(tmp_path / "room", tmp_path / "turnstile")
    with holders() as made:
        running = Holder(room, alone=False)
        made.append(running)
        assert running.entered.wait(WAIT_S)
        alone = Holder(room, alone=True)
        made.append(alone)
        assert not alone.entered.wait(0.3), "an alone test ran beside another"
        poll_until(lambda: taken(room.turnstile), WAIT_S, "the alone taker to hold the turnstile")
        later = Holder(room, alone=False)
        made.append(later)
        assert not later.entered.wait(0.3), "a shared test went beside a waiting alone one"
        running.leave()
        assert alone.entered.wait(WAIT_S)
        assert not later.entered.wait(0.3), "a shared test ran beside an alone one"
        alone.leave()
        assert later.entered.wait(WAIT_S)
        later.leave()


def test_the_pipeline_directory_is_one_unit_and_other_files_their_own() -> None:
    assert scope_of("tests/pipeline/test_read.py::test_a") == "tests/pipeline/"
    assert scope_of("tests/pipeline/test_write.py::test_b[x]") == "tests/pipeline/"
    assert scope_of("tests/cluster/test_cli.py::test_c") == "tests/cluster/test_cli.py"


def test_every_unit_named_longest_first_exists() -> None:
    root = Path(__file__).resolve().parents[2]
    assert all((root / unit).exists() for unit in (*LONGEST_FIRST, *WHOLE_DIRECTORIES))


def test_a_run_of_alone_tests_keeps_the_room_until_its_last(tmp_path: Path) -> None:
    room = Room(tmp_path / "room", tmp_path / "turnstile")
    turns = Turns(room)
    with holders() as made:
        try:
            turns.take(alone=True)
            other = Holder(room, alone=False)
            made.append(other)
            turns.give(keep=True)  # the next test is alone too
            assert not other.entered.wait(0.3), "the other worker ran between two alone tests"
            turns.take(alone=True)
        finally:
            turns.give(keep=False)
        assert other.entered.wait(WAIT_S)
        other.leave()
