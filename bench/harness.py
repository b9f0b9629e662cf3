"""What every benchmark module shares: the values it sends, how it times and counts, how it
reports.

Role: the helpers `bench.cluster`, `bench.jetstream`, `bench.kafka` and `bench.groups` import, so
that each side sends the same bytes and its figures are computed the same way: the 100-byte
values (an index, then random letters), nearest-rank latency summaries, CPU and resident
memory per process from /proc, a poll with a deadline, the run's header (machine, load,
duration), and running a benchmark on the node's event loop, cancelled on SIGTERM, into one JSON
object on stdout.
Starting a raftbroker cluster is `bench.nodes`'s; a JetStream one, `bench.jetstream_servers`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import statistics
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import apply as apply_bench
from cli.common import run as run_on_loop
from cluster.client import ClientError

VALUE_BYTES = 100
READY_TIMEOUT_S = 60.0
POLL_S = 0.05
CLK_TCK = os.sysconf("SC_CLK_TCK")


def reporter(source: str) -> Callable[[str], None]:
    """A progress printer for one benchmark: stderr, timestamped, so stdout stays the JSON."""

    def progress(message: str) -> None:
        print(f"[{source} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return progress


def log_tails(logs: Iterable[Path], lines: int) -> str:
    """The last `lines` lines of each log (a failed cluster's notes), each under its name; a
    log that cannot be read is left out."""
    tails = []
    for log in logs:
        with contextlib.suppress(OSError):
            last = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.name}\n" + "\n".join(last))
    return "\n".join(tails)


# -- numbers --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def latency_summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def letter_pads(count: int, size: int, seed: int = 1) -> tuple[bytes, ...]:
    """`count` strings of `size` random uppercase letters (kafka-producer-perf-test's payload)."""
    letters = bytes(65 + i % 26 for i in range(256))
    data = random.Random(seed).randbytes(count * size).translate(letters)
    return tuple(data[i * size : (i + 1) * size] for i in range(count))


# Values are as compressible as kafka-producer-perf-test's: a batch deflates to about 60%.
# (A constant pad would deflate to 3% and flatter pysyncobj's zlib transport about twofold.)
VALUE_PADS = letter_pads(4_096, VALUE_BYTES - 12)


def value_of(index: int) -> bytes:
    """A distinct 100-byte value: the index in 12 decimal digits, then random letters."""
    return b"%012d" % index + VALUE_PADS[index % len(VALUE_PADS)]


def value_zlib_ratio(records: int = 160) -> float:
    """How far zlib (level 3, as pysyncobj uses) shrinks a batch's worth of values."""
    batch = b"".join(value_of(i) for i in range(records))
    return round(len(zlib.compress(batch, 3)) / len(batch), 3)


# -- CPU of processes -----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat (fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, steal): CPU seconds all cores ran something, and lost to the hypervisor."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


@dataclass(frozen=True, slots=True)
class CpuSample:
    wall_s: float
    seconds: dict[str, float]
    machine_busy_s: float
    machine_steal_s: float


def sample_cpu(pids: Mapping[str, int]) -> CpuSample:
    seconds = {name: cpu_seconds(pid) for name, pid in pids.items()}
    return CpuSample(time.monotonic(), seconds, *machine_cpu_seconds())


def cpu_per_record(before: CpuSample, after: CpuSample, records: int) -> dict[str, float]:
    """CPU microseconds per acknowledged record, per process and in total."""
    used = {name: after.seconds[name] - before.seconds[name] for name in before.seconds}
    used["total"] = sum(used.values())
    return {name: round(s / max(records, 1) * 1e6, 2) for name, s in used.items()}


def cpu_report(before: CpuSample, after: CpuSample) -> dict[str, Any]:
    """CPU seconds and % of one core per process between two samples, their total, and what
    the rest of the machine used meanwhile (other processes: noise in every number here)."""
    wall = after.wall_s - before.wall_s
    used = {name: after.seconds[name] - before.seconds[name] for name in before.seconds}
    used["total"] = sum(used.values())
    used["others_on_machine"] = max(
        0.0, after.machine_busy_s - before.machine_busy_s - used["total"]
    )
    used["steal"] = after.machine_steal_s - before.machine_steal_s
    report: dict[str, Any] = {
        name: {"cpu_s": round(s, 2), "cpu_percent": round(100 * s / wall, 1)}
        for name, s in used.items()
    }
    report["wall_s"] = round(wall, 2)
    report["machine_capacity_percent"] = 100 * (os.cpu_count() or 1)
    return report


def memory_mb(pids: Mapping[str, int]) -> dict[str, dict[str, float]]:
    """Resident memory of each process now and its peak so far (VmRSS, VmHWM in
    /proc/<pid>/status), in MB (10^6 bytes)."""
    report = {}
    for name, pid in pids.items():
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        report[name] = {
            "rss_mb": round(int(fields["VmRSS"].split()[0]) * 1024 / 1e6, 1),
            "peak_rss_mb": round(int(fields["VmHWM"].split()[0]) * 1024 / 1e6, 1),
        }
    return report


# -- waiting --------------------------------------------------------------------------------------


async def poll_until(
    check: Callable[[], Awaitable[bool]],
    what: str,
    timeout_s: float = READY_TIMEOUT_S,
    interval_s: float = POLL_S,
) -> float:
    """Call `check` until it is true (ClientErrors count as false); seconds it took."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(ClientError):
            if await check():
                return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(interval_s)


# -- the run and its report -----------------------------------------------------------------------


def event_loop_name() -> str:
    loop = asyncio.get_running_loop()
    return f"{type(loop).__module__}.{type(loop).__qualname__}"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_header(started: datetime, load_start: list[float]) -> dict[str, Any]:
    """When a run started and how long it took, the machine, and its load at both ends (how
    much the rest of the machine may have disturbed the numbers); taken at the run's end."""
    return {
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "machine": apply_bench.machine_info(),
        "load_average_1_5_15": {"start": load_start, "end": load_average()},
    }


async def _cancelled_on_sigterm(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """`coro`, cancelled (so every cluster is stopped by its `finally`) on SIGTERM."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await coro


def run_loop(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run a benchmark on the loop `raftbroker` runs on (uvloop where installed), cancelled on
    SIGTERM."""
    return run_on_loop(_cancelled_on_sigterm(coro))


def emit(report: dict[str, Any], out: Path | None) -> int:
    """Print the report as JSON (and write it to `out`); exit status 1 if a scenario failed."""
    text = json.dumps(report, indent=2)
    if out is not None:
        out.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 1 if report["errors"] else 0
