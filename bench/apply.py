"""Apply benchmark: how fast one replica's `PartitionStateMachine.apply` takes AppendBatch entries.

Role: the measured answer to the issue's goals for the replicated core, on one core (a single
thread): at least 100,000 batches/s of 1 record, and at least 1,000,000 records/s in batches of
100 records. Run it as `python -m bench.apply [--seconds S] [--quick]`; it prints one JSON object
on stdout and nothing else.

Workload: batches of 1, 16 and 100 records, each a 100-byte value and no key, from 100 live
idempotent producers sending round-robin, each producer's sequences contiguous, epoch 0. Every
entry is the log's bytes, `AppendBatch(now_ms, RecordBatch(...).encode()).encode()`, encoded
before any timing. A warm-up of one window (5 batches) per producer runs untimed first, so the
timed entries meet the steady state: 100 known producers with full windows.

Method: each timed pass applies the same pre-encoded entries to a fresh, warmed machine (entries
cannot be re-applied to one machine: they would be duplicates), timed with `time.perf_counter`
and with the garbage collector paused, as `timeit` does. A run is whole passes until its timed
total reaches `--seconds`; the report is the best of 3 runs. That every timed entry was
appended, not rejected nor taken for a duplicate, is checked per result on an untimed pass and
by the log end offset after every timed pass (only an append moves it).

Baseline, in the same run: a bare `msgpack.unpackb` of the same entries, the floor no apply can
beat since apply must decode the entry first; `ratio_to_unpackb` is apply's cost in those units,
comparable across machines. Also measured: the duplicate path (retries of each producer's 5
retained batches, which change no state) and `snapshot()`/`restore()` of the 100-producer state.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgpack

from statemachine.commands import AppendBatch
from statemachine.limits import WINDOW_BATCHES
from statemachine.partition import Appended, Duplicate, PartitionStateMachine
from statemachine.records import Record, RecordBatch

PRODUCERS = 100
FIRST_PRODUCER_ID = 1_000
VALUE_BYTES = 100
RECORDS_PER_BATCH = (1, 16, 100)
RUNS = 3
START_MS = 1_700_000_000_000
# Bounds on one case's timed entries: passes repeat them until a run lasts `--seconds`.
BODY_BATCHES_MAX = 20_000
BODY_BYTES_MAX = 32 * 1024 * 1024
QUICK_BODY_BATCHES = 2 * PRODUCERS
QUICK_SECONDS = 0.005

GOAL_BATCHES_PER_S_1_RECORD = 100_000
GOAL_RECORDS_PER_S_100_RECORDS = 1_000_000

Apply = Callable[[bytes], object]


@dataclass(frozen=True, slots=True)
class Workload:
    """The pre-encoded entries of one case, in log order: warm-up, then the timed body."""

    records_per_batch: int
    warmup: tuple[bytes, ...]
    body: tuple[bytes, ...]
    # The last WINDOW_BATCHES batches of every producer, re-stamped later: all retained.
    retries: tuple[bytes, ...]

    @property
    def end_offset(self) -> int:
        """The log end offset once warm-up and body have all been appended."""
        return (len(self.warmup) + len(self.body)) * self.records_per_batch


def records_of(records_per_batch: int) -> tuple[Record, ...]:
    return tuple(Record(None, b"v" * VALUE_BYTES, START_MS) for _ in range(records_per_batch))


def build_workload(records_per_batch: int, body_batches: int) -> Workload:
    """Encode the case's entries: round-robin producers, contiguous sequences, epoch 0."""
    records = records_of(records_per_batch)
    next_sequence = [0] * PRODUCERS
    batches: list[bytes] = []
    for i in range(WINDOW_BATCHES * PRODUCERS + body_batches):
        producer = i % PRODUCERS
        batches.append(
            RecordBatch(FIRST_PRODUCER_ID + producer, 0, next_sequence[producer], records).encode()
        )
        next_sequence[producer] += records_per_batch
    entries = [AppendBatch(START_MS + i, batch).encode() for i, batch in enumerate(batches)]
    retry_ms = START_MS + len(batches)
    warm = WINDOW_BATCHES * PRODUCERS
    return Workload(
        records_per_batch,
        warmup=tuple(entries[:warm]),
        body=tuple(entries[warm:]),
        retries=tuple(AppendBatch(retry_ms, b).encode() for b in batches[-warm:]),
    )


def body_batches_for(records_per_batch: int, quick: bool) -> int:
    """How many timed entries to encode for a case: bounded in count and in bytes."""
    if quick:
        return QUICK_BODY_BATCHES
    batch = RecordBatch(FIRST_PRODUCER_ID, 0, 0, records_of(records_per_batch)).encode()
    sample = AppendBatch(START_MS, batch).encode()
    fit = min(BODY_BATCHES_MAX, BODY_BYTES_MAX // len(sample))
    return max(PRODUCERS, fit // PRODUCERS * PRODUCERS)


# -- timing ---------------------------------------------------------------------------------------


@contextmanager
def gc_paused() -> Iterator[None]:
    """No collection inside a timed section (as timeit does); restores the previous state."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def timed_loop(function: Apply, entries: Sequence[bytes]) -> float:
    """Seconds to call `function` on every entry, results dropped as a consumer would."""
    start = time.perf_counter()
    for entry in entries:
        function(entry)
    return time.perf_counter() - start


@dataclass(frozen=True, slots=True)
class Runs:
    """RUNS runs: the calls each made and each one's mean time per call."""

    calls: tuple[int, ...]
    runs_us: tuple[float, ...]

    @property
    def best_us(self) -> float:
        return min(self.runs_us)


def measure(one_pass: Callable[[], float], calls_per_pass: int, seconds: float) -> Runs:
    """RUNS runs, each of whole passes until its timed seconds reach `seconds`.

    An untimed first pass warms caches and allocator. Only `one_pass`'s own timed section
    counts, so per-pass setup (a fresh machine) stays out of the numbers.
    """
    with gc_paused():
        one_pass()
    calls: list[int] = []
    runs: list[float] = []
    for _ in range(RUNS):
        elapsed, passes = 0.0, 0
        with gc_paused():
            while elapsed < seconds:
                elapsed += one_pass()
                passes += 1
        calls.append(passes * calls_per_pass)
        runs.append(elapsed / calls[-1] * 1e6)
    return Runs(tuple(calls), tuple(runs))


# -- the cases ------------------------------------------------------------------------------------


def warmed_machine(work: Workload) -> PartitionStateMachine:
    """A fresh machine that has applied the warm-up: every producer known, every window full."""
    machine = PartitionStateMachine()
    for entry in work.warmup:
        machine.apply(entry)
    assert machine.log_end_offset == len(work.warmup) * work.records_per_batch
    assert len(machine.producers) == PRODUCERS
    return machine


def checked_pass(work: Workload) -> tuple[PartitionStateMachine, list[Appended]]:
    """Apply warm-up and body once, untimed, checking that every result is the next append.

    Returns the machine, in the body's end state, and every result in log order.
    """
    machine = PartitionStateMachine()
    results: list[Appended] = []
    for entry in (*work.warmup, *work.body):
        result = machine.apply(entry)
        offset = len(results) * work.records_per_batch
        if not isinstance(result, Appended) or result.base_offset != offset:
            raise AssertionError(f"expected Appended at offset {offset}, got {result!r}")
        results.append(result)
    assert machine.log_end_offset == work.end_offset
    assert len(machine.producers) == PRODUCERS
    return machine, results


def apply_pass(work: Workload) -> float:
    """One timed pass of the body on a fresh warmed machine, checked by its log end offset."""
    machine = warmed_machine(work)
    elapsed = timed_loop(machine.apply, work.body)
    if machine.log_end_offset != work.end_offset:
        raise AssertionError("a timed entry was not appended")
    return elapsed


def unpackb_pass(work: Workload) -> float:
    unpackb: Apply = msgpack.unpackb
    return timed_loop(unpackb, work.body)


def duplicate_pass(machine: PartitionStateMachine, retries: Sequence[bytes]) -> float:
    end = machine.log_end_offset
    elapsed = timed_loop(machine.apply, retries)
    if machine.log_end_offset != end:
        raise AssertionError("a retry was appended")
    return elapsed


def rates(records_per_batch: int, runs: Runs, *, appends: bool = True) -> dict[str, Any]:
    """A case's rates at its best run; records/s only where the records are appended."""
    per_batch_s = runs.best_us / 1e6
    report: dict[str, Any] = {
        "records_per_batch": records_per_batch,
        "batches_per_s": round(1 / per_batch_s),
    }
    if appends:
        report["records_per_s"] = round(records_per_batch / per_batch_s)
    return {
        **report,
        "us_per_batch": round(runs.best_us, 3),
        "runs_us_per_batch": [round(us, 3) for us in runs.runs_us],
        "batches_timed_per_run": list(runs.calls),
    }


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One case's report sections, and the machine it left (for the snapshot measurement)."""

    apply: dict[str, Any]
    unpackb: dict[str, Any]
    duplicate: dict[str, Any]
    machine: PartitionStateMachine


def run_case(records_per_batch: int, seconds: float, quick: bool) -> CaseResult:
    work = build_workload(records_per_batch, body_batches_for(records_per_batch, quick))
    machine, appended = checked_pass(work)
    apply_runs = measure(lambda: apply_pass(work), len(work.body), seconds)
    unpack_runs = measure(lambda: unpackb_pass(work), len(work.body), seconds)

    # Duplicates: `machine` holds the end state, where the retried batches are the last
    # WINDOW_BATCHES of each producer; retries change nothing, so it takes them again and again.
    originals = appended[-len(work.retries) :]
    for retry, original in zip(work.retries, originals, strict=True):
        want = Duplicate(original.base_offset, original.last_offset, original.append_time_ms)
        got = machine.apply(retry)
        if got != want:
            raise AssertionError(f"retry answered {got!r}, expected {want!r}")
    retries = work.retries * max(1, len(work.body) // len(work.retries))
    dup_runs = measure(lambda: duplicate_pass(machine, retries), len(retries), seconds)

    entry_bytes = len(work.body[0])
    unpack_us = unpack_runs.best_us
    return CaseResult(
        apply={
            **rates(records_per_batch, apply_runs),
            "entry_bytes": entry_bytes,
            "ratio_to_unpackb": round(apply_runs.best_us / unpack_us, 2),
        },
        unpackb={**rates(records_per_batch, unpack_runs), "entry_bytes": entry_bytes},
        duplicate={
            **rates(records_per_batch, dup_runs, appends=False),
            "ratio_to_unpackb": round(dup_runs.best_us / unpack_us, 2),
        },
        machine=machine,
    )


def run_snapshot(machine: PartitionStateMachine, seconds: float) -> dict[str, Any]:
    """snapshot() and restore() of a machine holding PRODUCERS producers with full windows."""
    assert len(machine.producers) == PRODUCERS
    snapshot = machine.snapshot()
    if PartitionStateMachine.restore(snapshot).snapshot() != snapshot:
        raise AssertionError("restore(snapshot()) does not round-trip")

    def snapshot_pass() -> float:
        start = time.perf_counter()
        machine.snapshot()
        return time.perf_counter() - start

    def restore_pass() -> float:
        start = time.perf_counter()
        PartitionStateMachine.restore(snapshot)
        return time.perf_counter() - start

    # A fifth of a case's budget each: one call is short, and its time steady.
    snap = measure(snapshot_pass, 1, seconds / 5)
    back = measure(restore_pass, 1, seconds / 5)
    return {
        "producers": len(machine.producers),
        "window_batches": WINDOW_BATCHES,
        "bytes": len(snapshot),
        "snapshot_us": round(snap.best_us, 2),
        "restore_us": round(back.best_us, 2),
        "calls_timed_per_run": list(snap.calls),
    }


# -- report ---------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(affinity) if affinity is not None else os.cpu_count(),
        "msgpack": ".".join(map(str, msgpack.version)),
        "msgpack_c_extension": msgpack.Unpacker.__module__ != "msgpack.fallback",
    }


def goal(target: int, measured: int) -> dict[str, Any]:
    return {"target": target, "measured": measured, "met": measured >= target}


def run(seconds: float, quick: bool) -> dict[str, Any]:
    results = {n: run_case(n, seconds, quick) for n in RECORDS_PER_BATCH}
    snapshot = run_snapshot(results[1].machine, seconds)
    batches_1: int = results[1].apply["batches_per_s"]
    records_100: int = results[100].apply["records_per_s"]
    goals = {
        "batches_per_s_1_record": goal(GOAL_BATCHES_PER_S_1_RECORD, batches_1),
        "records_per_s_100_records": goal(GOAL_RECORDS_PER_S_100_RECORDS, records_100),
    }
    return {
        "benchmark": "statemachine.PartitionStateMachine.apply(AppendBatch)",
        "machine": machine_info(),
        "config": {
            "seconds_per_run": seconds,
            "quick": quick,
            "runs": RUNS,
            "statistic": "best of runs, mean per batch within a run",
            "threads": 1,
            "gc_paused_while_timing": True,
            "producers": PRODUCERS,
            "value_bytes": VALUE_BYTES,
            "producer_epoch": 0,
            "warmup_batches_per_producer": WINDOW_BATCHES,
        },
        "cases": [results[n].apply for n in RECORDS_PER_BATCH],
        "baseline": {
            "what": "bare msgpack.unpackb of the same entries, same loop: a floor for apply",
            "cases": [results[n].unpackb for n in RECORDS_PER_BATCH],
        },
        "duplicates": {
            "what": "retries of each producer's 5 retained batches, applied to the end state",
            "cases": [results[n].duplicate for n in RECORDS_PER_BATCH],
        },
        "snapshot": snapshot,
        "goals": {**goals, "all_met": all(g["met"] for g in goals.values())},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.apply",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="minimum length of each run (default 1.0)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny run for CI smoke tests; numbers are noise"
    )
    args = parser.parse_args(argv)
    seconds: float = (
        args.seconds if args.seconds is not None else (QUICK_SECONDS if args.quick else 1.0)
    )
    if not 0 < seconds < math.inf:
        parser.error("--seconds must be a positive number of seconds")
    json.dump(run(seconds, args.quick), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
