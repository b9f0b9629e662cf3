"""The interface both sides of the comparison implement, and the run of a side's scenarios.

Role: raftbroker (`bench.cluster`'s `Raftbroker`) and NATS JetStream (`bench.jetstream`'s
`JetStream`) measure the same workload; `Side` names the scenarios they share, one method each,
so the pairing `bench.compare` relies on is written down once and checked by mypy. Each method
returns the report sections that side has always written (their keys differ by side and are
kept: `bench.compare` reads them). Each side's command maps its own scenario names (its
`--scenarios` values, which differ: raftbroker's `throughput` is JetStream's `pipelined`) onto
these methods, and `run_scenarios` runs the chosen ones, a failure recorded and the rest run.

`python -m bench` does not call these methods: it runs each side in a process of its own (so
each starts and stops its servers by PID, and one side's crash or hang cannot take another's
numbers with it), through the side's command.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

# A scenario's part of the report: its sections by key.
Sections = dict[str, Any]


class Side(Protocol):
    """One system under comparison: the scenarios both run, each on fresh clusters of its own."""

    async def pipelined(self) -> Sections:
        """Acknowledged throughput with the client's own pipelining, one partition (stream)
        among the cases, then what it wrote read back from the start (consume)."""
        ...

    async def latency(self) -> Sections:
        """Sequential sends, each awaited before the next: the compared case and the side's
        variants beside it."""
        ...

    async def sequential(self) -> Sections:
        """The compared sequential case alone: what `python -m bench` repeats in rounds."""
        ...

    async def failover(self) -> Sections:
        """SIGKILL of the leader under a steady load: time to the next ack, then the log read
        back for lost and duplicated records."""
        ...

    async def fsync(self) -> Sections:
        """Throughput and sequential latency with every acknowledgement fsynced first
        (raftbroker: in alternation with its own figures without)."""
        ...


S = TypeVar("S", bound=Side)
# A side's scenario by its command's name for it: one of the side's methods.
Scenario = Callable[[S], Awaitable[Sections]]


def with_notes(exc: BaseException) -> str:
    """An error and its notes (a cluster's log tails), as a report gives it."""
    return "".join([repr(exc), *(f"\n{n}" for n in getattr(exc, "__notes__", []))])


async def run_scenarios(
    side: S,
    scenarios: Mapping[str, Scenario[S]],
    names: Iterable[str],
    progress: Callable[[str], None],
    describe: Callable[[BaseException], str] = repr,
) -> tuple[Sections, dict[str, str]]:
    """Run the named scenarios of `side` one after the other: (their sections, the errors of
    those that failed, each as `describe` gives it). A failure is recorded, not raised: the
    other scenarios still run, and the report says which failed."""
    sections: Sections = {}
    errors: dict[str, str] = {}
    for name in names:
        progress(f"scenario {name}")
        try:
            sections.update(await scenarios[name](side))
        except Exception as exc:  # noqa: BLE001 - in the JSON; the other scenarios still run
            errors[name] = describe(exc)
            progress(f"scenario {name} failed: {exc!r}")
    return sections, errors


def arguments(
    prog: str, doc: str | None, quick_help: str, scenarios_help: str, default: Iterable[str]
) -> argparse.ArgumentParser:
    """A side's command line: `--quick`, `--out FILE`, `--scenarios a,b`."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    parser.add_argument("--scenarios", default=",".join(default), help=scenarios_help)
    return parser


def known(parser: argparse.ArgumentParser, names: list[str], scenarios: Collection[str]) -> None:
    """Exit with a usage error if `names` holds a scenario the side does not have."""
    unknown = set(names) - set(scenarios)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
