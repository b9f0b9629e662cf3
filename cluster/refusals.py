"""Refusals, logged at WARNING without flooding: one line per kind per interval, with a count.

Role: every listener (the client port, the Raft port) refuses strangers, garbage and
connections past a limit. An operator must see that happening, at WARNING, but a client that
opens thousands of connections a second must not turn the log into a flood. `RefusalLog.warn`
logs the first refusal of a kind at once, then at most one line per `interval_s` for that kind,
saying how many refusals it stands for and the latest one's detail; `flush_due`, called on a
timer, logs what a flood that stopped left folded, so every refusal shows within an interval.

Rules: the clock is passed in (`time.monotonic` in a node, a fake in unit tests); kinds are a
small fixed set of words chosen by the caller (never text a peer sent), so the table of kinds
is bounded by the code, not by the traffic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Kind:
    logged_at: float
    suppressed: int = 0
    latest: str = ""


class RefusalLog:
    """WARNING lines for refusals, at most one per kind per `interval_s`."""

    def __init__(self, log: logging.Logger, interval_s: float, clock: Callable[[], float]) -> None:
        self._log = log
        self._interval_s = interval_s
        self._clock = clock
        self._kinds: dict[str, _Kind] = {}
        self.refused = 0  # every refusal, logged or not (a metric and for tests)

    def warn(self, kind: str, detail: str) -> None:
        """Count a refusal of `kind`; log it now, or fold it into the next line of its kind."""
        self.refused += 1
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen.logged_at < self._interval_s:
            seen.suppressed += 1
            seen.latest = detail
            return
        if seen is not None and seen.suppressed:
            self._log.warning(
                "%s: %s (and %d more like it in the last %.0f s)",
                kind,
                detail,
                seen.suppressed,
                now - seen.logged_at,
            )
        else:
            self._log.warning("%s: %s", kind, detail)
        self._kinds[kind] = _Kind(logged_at=now)

    def flush_due(self) -> None:
        """Log the refusals folded for a whole interval that no later refusal of their kind
        has logged yet (a flood that stopped): called on a timer, so no count waits for ever."""
        now = self._clock()
        for kind, seen in self._kinds.items():
            if seen.suppressed and now - seen.logged_at >= self._interval_s:
                self._log_folded(kind, seen, f" in the last {now - seen.logged_at:.0f} s")
                seen.logged_at = now

    def flush(self) -> None:
        """Log what is still folded (at shutdown, or for a test that wants every count out)."""
        for kind, seen in self._kinds.items():
            if seen.suppressed:
                self._log_folded(kind, seen, "")

    def _log_folded(self, kind: str, seen: _Kind, span: str) -> None:
        """One line for the folded refusals of a kind: the latest, and how many more."""
        if seen.suppressed > 1:
            more = seen.suppressed - 1
            self._log.warning("%s: %s (and %d more like it%s)", kind, seen.latest, more, span)
        else:
            self._log.warning("%s: %s", kind, seen.latest)
        seen.suppressed = 0
