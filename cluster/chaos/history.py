"""The chaos history: one JSON object per line, as Jepsen records operations.

Every event has `type` (invoke, ok, fail, info), `time_ms` (since the run started), `process`
and `f` (the operation). `fail` means the operation certainly did not happen; `info` that it may
or may not have (a timeout, a lost connection). Operations and their fields:

- `send`: invoke `partition`, `value`; ok adds `offset`, `pid`, `epoch`, `sequence` (and
  `resent_offset` when the client sent the same batch twice, as after a lost acknowledgement:
  the broker must answer both alike); fail and info add `error`. Every value is invoked once.
  A streaming sink's values (fenced writes) are acknowledged by micro-batch, without their
  offsets: ok carries `offset`, `pid`, `epoch` and `sequence` as -1.
- `poll` (ok): a consumer's `partition` and `records`, each `[offset, value, pid, epoch, seq]`
  (-1 for what the client does not tell: Kafka clients do not expose pid, epoch or sequence).
  A Kafka client's producer does not tell them either: its ok sends carry them as -1.
- `seek` (ok): the consumer reads `partition` from `offset` on.
- `init` (ok): a producer session `pid`, `epoch`, optional `transactional_id`.
- `fault` (info): the nemesis: `kind`, `node`, `partition`, `phase` (start, end, skipped).
- `stats` (ok): counters of a producer: `retries`, `dedup_hits`.
- `sink_run` (info): a run of the sink's micro-batch `batch` that did not complete: `error`
  (cut off on purpose, or a run that failed and is run again).
- `client_error` (info): an error a Kafka client reported by itself (librdkafka's error
  callback, or an error message from its consumer): `error` (its name), `reason`, `fatal`.
- `client_log` (info): a line of a Kafka client's log: `level` (Python's logging level),
  `facility`, `message`.
- `final_read` (ok): the whole `partition` read through its leader after healing: `records`.
- `replica_log` (ok): one `node`'s committed log of `partition`: `records`.
- `raft_truncation` (info): a `node`'s log `line` saying its replica of a Raft group deleted
  entries it had applied (cluster/raft/adapter/appends.py logs it).
- `assigned` (ok): a member of consumer group `group` holds `partitions` in `generation` (its
  id `member`), from this event until its next `assigned`.
- `group_poll` (ok): what that member read of `partition` in `generation`: `records`.
- `commit` (ok, fail, info): the member's commit of `offsets` (`[partition, next offset]`
  pairs) in `generation`; `error` ("" for ok).
- `committed` (ok): the group's committed `offsets` (`[partition, offset]`), as read back.
- `group_error` (info): a member's poll failed: `error`.
- `group_drain` (ok, info): after the producers stopped, the group committed up to `ends`
  (`[partition, end offset]`) of every partition (ok), or not within the drain's time (info).
- Transactions (txn_workload.py: kafka_txns.py and native_txns.py): `txn` (invoke: `txn`,
  `topic`, `values`, `intent`, and a processor's `inputs` and `read_ms`; its outcome `txn`, `error`,
  `ending_ms`), `txn_producer` (info: a transactional producer ended, `error`),
  `client_hang` (info: a librdkafka `call` never returned), `rewind` (info: the processor's
  consumer could not be rewound after an abort, `error`: it is made anew), `lso`,
  `txn_read`, `ctp_committed`: kafka_txns.py says what each carries (`txn_member`,
  info: the native processor's group member failed a poll and is made anew; `ctp_offsets`,
  ok or info: the processor's positions committed in a transaction of offsets alone, when
  only aborted records lay past its last commit).

Reading is strict: a line that is not such an event is a `HistoryError` naming the line, since a
checker that skipped input could miss the one anomaly that matters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NamedTuple, Self

TYPES = frozenset({"invoke", "ok", "fail", "info"})
# Fields each operation must carry, with their types (beyond type, time_ms, process, f).
REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "send": {"partition": int, "value": str},
    "poll": {"partition": int, "records": list},
    "seek": {"partition": int, "offset": int},
    "init": {"pid": int, "epoch": int},
    "fault": {"kind": str},
    "stats": {},
    "final_read": {"partition": int, "records": list},
    "replica_log": {"partition": int, "records": list, "node": str},
    "raft_truncation": {"node": str, "line": str},
    "sink_run": {"batch": int, "error": str},
    "client_error": {"error": str, "reason": str, "fatal": bool},
    "client_log": {"level": int, "facility": str, "message": str},
    "assigned": {"group": str, "member": str, "generation": int, "partitions": list},
    "group_poll": {
        "group": str,
        "member": str,
        "generation": int,
        "partition": int,
        "records": list,
    },
    "commit": {"group": str, "member": str, "generation": int, "offsets": list, "error": str},
    "committed": {"group": str, "offsets": list},
    "group_error": {"group": str, "error": str},
    "group_drain": {"group": str, "ends": list},
    "txn": {"txn": str},
    "txn_producer": {"error": str},
    "client_hang": {"call": str},
    "rewind": {"error": str},
    "txn_member": {"error": str},
    "ctp_offsets": {"offsets": list, "error": str},
    "lso": {"topic": str, "partition": int, "lso": int, "hw": int, "final": bool},
    "txn_read": {
        "topic": str,
        "partition": int,
        "isolation": str,
        "records": list,
        "complete": bool,
    },
    "ctp_committed": {"group": str, "offsets": list},
    "ctp_drain": {"ends": list},
}
TXN_INVOKE: dict[str, type | tuple[type, ...]] = {"topic": str, "values": list, "intent": str}
TXN_OUTCOME: dict[str, type | tuple[type, ...]] = {"error": str, "ending_ms": (int, float)}
SEND_OK: dict[str, type | tuple[type, ...]] = {
    "offset": int,
    "pid": int,
    "epoch": int,
    "sequence": int,
}


class HistoryError(ValueError):
    """A history line that is not a well-formed event."""


class Record(NamedTuple):
    """One record as observed in a partition."""

    offset: int
    value: str
    pid: int
    epoch: int
    sequence: int


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    time_ms: float
    process: str
    f: str
    fields: Mapping[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    @property
    def partition(self) -> int | None:
        value: int | None = self.fields.get("partition")
        return value

    @property
    def records(self) -> list[Record]:
        return [Record(*row) for row in self.fields.get("records", ())]


def parse_event(obj: object) -> Event:
    """An `Event` from a decoded JSON object; `HistoryError` saying what is wrong."""
    if not isinstance(obj, dict):
        raise HistoryError("an event must be a JSON object")
    for name in ("type", "process", "f"):
        if not isinstance(obj.get(name), str):
            raise HistoryError(f"missing or non-string {name!r}")
    if obj["type"] not in TYPES:
        raise HistoryError(f"unknown type {obj['type']!r}")
    time_ms = obj.get("time_ms")
    if isinstance(time_ms, bool) or not isinstance(time_ms, int | float):
        raise HistoryError("missing or non-numeric 'time_ms'")
    f = obj["f"]
    if f not in REQUIRED:
        raise HistoryError(f"unknown operation {f!r}")
    required = _required(f, obj["type"])
    for name, kind in required.items():
        value = obj.get(name)
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise HistoryError(f"{f}: missing or mistyped {name!r}")
    if "records" in required:
        _check_records(obj["records"])
    for counter in ("retries", "dedup_hits"):
        if f == "stats" and not isinstance(obj.get(counter, 0), int):
            raise HistoryError(f"stats: {counter!r} must be an integer")
    fields = {k: v for k, v in obj.items() if k not in ("type", "time_ms", "process", "f")}
    return Event(obj["type"], float(time_ms), obj["process"], f, fields)


def _required(f: str, kind: str) -> dict[str, type | tuple[type, ...]]:
    """The fields an event of operation `f` and this type must carry."""
    required = dict(REQUIRED[f])
    if f == "send" and kind == "ok":
        required.update(SEND_OK)
    if f == "txn":
        required.update(TXN_INVOKE if kind == "invoke" else TXN_OUTCOME)
    return required


def _check_records(rows: list[Any]) -> None:
    for row in rows:
        if not (
            isinstance(row, list)
            and len(row) == 5
            and isinstance(row[1], str)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in (row[0], *row[2:]))
        ):
            raise HistoryError(f"a record must be [offset, value, pid, epoch, seq], not {row!r}")


def iter_history(lines: Iterator[str]) -> Iterator[Event]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield parse_event(json.loads(line))
        except json.JSONDecodeError as exc:
            raise HistoryError(f"line {number}: not JSON: {exc}") from None
        except HistoryError as exc:
            raise HistoryError(f"line {number}: {exc}") from None


def read_history(path: Path) -> list[Event]:
    with path.open(encoding="utf-8") as f:
        return list(iter_history(iter(f)))


class HistoryWriter:
    """Appends events as JSON lines, flushed one by one: a killed run leaves a usable file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def __enter__(self) -> Self:
        self._file = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, event: Mapping[str, object]) -> None:
        assert self._file is not None, "use `with HistoryWriter(path) as history`"
        parse_event(dict(event))  # what we write must be what the checker reads
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()
