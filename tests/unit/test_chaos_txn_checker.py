"""The chaos checker's transaction rules on synthetic histories: a clean one passes, and each
of Jepsen's Kafka anomalies, written into it, is caught as its kind and as nothing else.

The clean story: a writer commits two transactions over two partitions and aborts one; a
consume-transform-produce processor reads the committed values (after their commits were
asked), writes `o-<value>` for each in one committed transaction with its offsets, and aborts
another; the leaders' last stable offsets rise and end at the ends; the final reads show
exactly the committed values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cluster.chaos.checker import check
from cluster.chaos.history import parse_event
from cluster.chaos.txn_checker import TXN_KINDS, output_of

Event = dict[str, Any]
IN, OUT = "chaos-txn", "chaos-txn-out"


class TxnStory:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.t = 0.0
        # (topic, isolation) -> partition -> [[offset, value, -1, -1, -1]]
        self.reads: dict[tuple[str, str], dict[int, list[list[Any]]]] = {}
        self.committed_offsets = [[0, 0], [1, 0]]
        self.short: set[tuple[str, int]] = set()  # final reads that stopped short

    def add(self, type_: str, process: str, f: str, **fields: Any) -> Event:
        self.t += 10.0
        event = {"type": type_, "time_ms": self.t, "process": process, "f": f, **fields}
        self.events.append(event)
        return event

    def txn(self, process: str, name: str, topic: str, values: list[list[Any]], **more: Any) -> str:
        intent = more.pop("intent", "commit")
        outcome = more.pop("outcome", "ok")
        self.add("invoke", process, "txn", txn=name, topic=topic, values=values, intent=intent,
                 **more)  # fmt: skip
        ending = self.t + 5
        self.add(outcome, process, "txn", txn=name, error="", ending_ms=ending)
        for isolation in ("read_committed", "read_uncommitted"):
            if isolation == "read_committed" and not (outcome == "ok" and intent == "commit"):
                continue
            rows = self.reads.setdefault((topic, isolation), {0: [], 1: []})
            for partition, value in values:
                rows[partition].append([len(rows[partition]), value, -1, -1, -1])
        return name

    def lso(self, topic: str, partition: int, lso: int, hw: int, *, final: bool = False) -> None:
        self.add("ok", "l0", "lso", topic=topic, partition=partition, lso=lso, hw=hw, final=final)

    def finish(self) -> list[Event]:
        for (topic, isolation), partitions in sorted(self.reads.items()):
            for partition, rows in partitions.items():
                complete = (topic, partition) not in self.short
                self.add("ok", "final", "txn_read", topic=topic, partition=partition,
                         isolation=isolation, records=rows, complete=complete)  # fmt: skip
        self.add("ok", "final", "ctp_committed", group="chaos-ctp", offsets=self.committed_offsets)
        return self.events


def clean() -> TxnStory:
    s = TxnStory()
    s.txn("x0", "x0-0", IN, [[0, "x0-0-0"], [1, "x0-0-1"]])
    s.lso(IN, 0, 2, 2)  # (offsets 0-1: data and marker)
    s.txn("x0", "x0-1", IN, [[0, "x0-1-0"], [1, "x0-1-1"]], intent="abort")
    s.txn("x0", "x0-2", IN, [[0, "x0-2-0"], [1, "x0-2-1"]])
    inputs: list[list[Any]] = [
        [0, 0, "x0-0-0"],
        [1, 0, "x0-0-1"],
        [0, 4, "x0-2-0"],
        [1, 4, "x0-2-1"],
    ]
    read_ms = s.t + 1
    aborted = [[p, output_of(str(v), "y0-0")] for p, _, v in inputs[:1]]
    s.txn("y0", "y0-0", OUT, aborted, inputs=inputs[:1], read_ms=read_ms, intent="abort")
    outputs = [[p, output_of(str(v), "y0-1")] for p, _, v in inputs]
    s.txn("y0", "y0-1", OUT, outputs, inputs=inputs, read_ms=read_ms)
    s.committed_offsets = [[0, 5], [1, 5]]
    for topic in (IN, OUT):
        for partition in (0, 1):
            s.lso(topic, partition, 6, 6, final=True)
    return s


def run(events: list[Event]) -> dict[str, int]:
    report = check([parse_event(e) for e in events])
    return {k: v for k, v in report.counts_by_kind.items() if v}


def test_the_clean_story_has_no_anomaly() -> None:
    events = clean().finish()
    assert run(events) == {}
    report = check([parse_event(e) for e in events])
    figures = report.figures["transactions"]
    assert figures["transactions"] == {"aborted": 2, "committed": 3}


def _lose(s: TxnStory) -> None:  # a committed value missing from the final read
    del s.reads[(IN, "read_committed")][1][0]


def _show_aborted(s: TxnStory) -> None:  # G1a: an aborted transaction's value is read
    s.reads[(IN, "read_committed")][0].append([9, "x0-1-0", -1, -1, -1])


def _tear(s: TxnStory) -> None:  # an unknown transaction half visible
    s.txn("x0", "x0-3", IN, [[0, "x0-3-0"], [1, "x0-3-1"]], outcome="info")
    s.reads[(IN, "read_committed")][0].append([9, "x0-3-0", -1, -1, -1])


def _duplicate(s: TxnStory) -> None:
    s.reads[(OUT, "read_committed")][1].append([9, output_of("x0-0-1", "y0-1"), -1, -1, -1])


def _read_dirty(s: TxnStory) -> None:  # read before its commit was asked
    s.txn("x0", "x0-4", IN, [[0, "x0-4-0"]])
    ending = s.events[-1]["ending_ms"]
    s.add("invoke", "y0", "txn", txn="y0-9", topic=OUT, values=[], intent="abort",
          inputs=[[0, 9, "x0-4-0"]], read_ms=ending - 1)  # fmt: skip
    s.add("ok", "y0", "txn", txn="y0-9", error="", ending_ms=s.t)


def _lso_back(s: TxnStory) -> None:
    s.lso(IN, 0, 1, 6)


def _hang(s: TxnStory) -> None:
    s.lso(OUT, 1, 6, 7, final=True)


def _twice_processed(s: TxnStory) -> None:  # an input transformed in two committed txns
    again = [[0, output_of("x0-0-0", "y0-2")]]
    s.txn("y0", "y0-2", OUT, again, inputs=[[0, 0, "x0-0-0"]], read_ms=s.t)


def _output_without_offset(s: TxnStory) -> None:  # the offsets were not committed with it
    s.committed_offsets = [[0, 5], [1, 0]]


def _short_read(s: TxnStory) -> None:  # values missing, but the read says it stopped short
    del s.reads[(IN, "read_committed")][1][0]
    s.short.add((IN, 1))


def _offset_unknown(s: TxnStory) -> None:  # no committed offset read for partition 1
    s.committed_offsets = [[0, 5]]


def _stranger(s: TxnStory) -> None:
    s.reads[(IN, "read_committed")][1].append([9, "nobody", -1, -1, -1])


@pytest.mark.parametrize(
    ("breaks", "kinds"),
    [
        (_lose, {"txn-lost": 1, "txn-torn": 1, "ctp-not-exactly-once": 1}),
        (_show_aborted, {"txn-aborted-read": 1, "txn-torn": 1}),
        (_tear, {"txn-torn": 1}),
        (_duplicate, {"txn-duplicate": 1, "ctp-not-exactly-once": 1}),
        (_read_dirty, {"txn-dirty-read": 1, "ctp-not-exactly-once": 1}),
        (_lso_back, {"lso-backwards": 1}),
        (_hang, {"txn-hanging": 1}),
        (_twice_processed, {"ctp-not-exactly-once": 1}),
        (_output_without_offset, {"ctp-not-exactly-once": 2}),
        (_stranger, {"unexpected": 1}),
        (_short_read, {"txn-read-incomplete": 1}),
        (_offset_unknown, {}),
    ],
)
def test_each_anomaly_is_caught_as_its_kind(
    breaks: Callable[[TxnStory], None], kinds: dict[str, int]
) -> None:
    story = clean()
    breaks(story)
    assert run(story.finish()) == kinds


def test_every_transaction_kind_is_reported() -> None:
    from cluster.chaos.report import KINDS  # noqa: PLC0415

    assert set(TXN_KINDS) <= set(KINDS)
