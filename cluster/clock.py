"""Wall-clock time as Kafka counts it: whole milliseconds since the Unix epoch.

Role: the only reader of the wall clock outside `cli/` and the benchmarks. Leaders stamp it into
entries (statemachine/ never reads a clock); producers stamp it into records. Durations and
deadlines use `time.monotonic()`, never this.
"""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Milliseconds since the Unix epoch, as Kafka's record and entry timestamps."""
    return time.time_ns() // 1_000_000
