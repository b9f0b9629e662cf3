"""Issue 20, the `raftbroker` command as a newcomer meets it, run for real in subprocesses
against a real local cluster:

- errors in one line: every error path prints one line on stderr (`raftbroker: ...`, naming its
  object) and exits non-zero, never a traceback or an exception group; a plain `topic create`
  on a 1-node cluster defaults its replication to what the cluster can hold;
- produce as Kafka's console producer: keys, tombstones, headers;
- consume as Kafka's console consumer and kcat: relative offsets, --until-end, the --print-*
  fields, a null key told from an empty one, a closing "Processed N records".

Issue 41, what a Kafka user tripped on in the first hour, on the same `cluster up` cluster:
- a topic a Kafka client names first is created (`kcat -P -t new-topic`), as `cluster up`'s
  nodes create topics on first use; a Metadata request that does not allow it creates nothing;
- the console consumer takes kcat's and Kafka's words (`-o beginning|end|stored|N|s@TIME`, a
  bare `-o N` for every partition), an offset out of range names the range, and a usage error
  (a flag typer refuses) is one line as every other error;
- SIGTERM (`timeout`, systemd, `docker stop`) ends `consume --group` as Ctrl-C does (commits
  what it printed, leaves its group, prints its summary), and `produce` reading a pipe that
  never closes (has what it sent acknowledged, prints its summary, exits).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import pytest

from cluster.clock import wall_ms
from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.cluster.procs import REPO
from tests.cluster.test_cli import cluster_up, ok, raftbroker
from tests.kafka_wire import kafka_call
from tests.polling import poll_until

TOPIC = "orders"  # 3 partitions


class ErrorCase(NamedTuple):
    args: tuple[str, ...]
    says: str  # a part of the one line
    stdin: str | None = None


CASES = {
    "produce to a missing topic": ErrorCase(
        ("produce", "nosuch"), "topic 'nosuch' does not exist", "hi\n"
    ),
    "produce to a missing partition": ErrorCase(
        ("produce", TOPIC, "--partition", "7"), "topic orders has 3 partitions (0-2)", "hi\n"
    ),
    "produce a 5 MB line": ErrorCase(
        ("produce", TOPIC),
        "line 2 of stdin: a record of 5,000,000 bytes",
        "small\n" + "x" * 5_000_000,
    ),
    "a line without the key separator": ErrorCase(
        ("produce", TOPIC, "--key-separator", ","),
        "line 2 of stdin has no key separator ',': 'no separator'; 1 record before it acknowledged",
        "k,v\nno separator\nk,v\n",
    ),
    "an empty key separator": ErrorCase(
        ("produce", TOPIC, "--key-separator", ""), "--key-separator must not be empty", "k,v\n"
    ),
    "an unknown escape in the key separator": ErrorCase(
        ("produce", TOPIC, "--key-separator", "\\q"), "unknown escape '\\q'", "k,v\n"
    ),
    "a header without a value": ErrorCase(
        ("produce", TOPIC, "--header", "trace"), "--header 'trace' is not NAME=VALUE", "v\n"
    ),
    "generate to a missing topic": ErrorCase(
        ("pipeline", "generate", "--topic", "nosuch2", "--count", "10"),
        "topic 'nosuch2' does not exist",
    ),
    "create an existing topic": ErrorCase(
        ("topic", "create", TOPIC), "topic 'orders' already exists"
    ),
    "delete a missing topic": ErrorCase(
        ("topic", "delete", "nosuch"), "topic 'nosuch' does not exist"
    ),
    "replicas beyond the nodes": ErrorCase(
        ("topic", "create", "five", "--replication", "5"),
        "replication factor 5, but the cluster has 3 nodes",
    ),
    "replicas beyond the limit": ErrorCase(
        ("topic", "create", "nine", "--replication", "9"), "at most 7 (replication_factor_max)"
    ),
    "an invalid topic name": ErrorCase(
        ("topic", "create", "no spaces"), "'no spaces' is not a valid topic name"
    ),
    "describe a missing topic": ErrorCase(
        ("topic", "describe", "nosuch"), "topic 'nosuch' does not exist"
    ),
    "consume a missing partition": ErrorCase(
        ("consume", TOPIC, "--partition", "9"), "topic orders has 3 partitions (0-2)"
    ),
    "consume a missing topic": ErrorCase(("consume", "nosuch"), "topic 'nosuch' does not exist"),
    "an offset that is not one": ErrorCase(
        ("consume", TOPIC, "--offset", "soon"),
        "--offset 'soon' is not N, -N, earliest/beginning, latest/end, stored (with --group)",
    ),
    "an offset past the end": ErrorCase(
        ("consume", TOPIC, "-p", "0", "-o", "999999999"),
        "--offset 999999999 is out of range for orders partition 0: it holds offsets 0 to ",
    ),
    "stored offsets without a group": ErrorCase(
        ("consume", TOPIC, "-o", "stored"), "--offset stored starts at a group's committed"
    ),
    "an offset a group member does not take": ErrorCase(
        ("consume", TOPIC, "--group", "g", "-o", "5"), "not with --offset N, -N or s@TIME"
    ),
    "a partition count of 0 (typer's check)": ErrorCase(
        ("topic", "create", "zero", "--partitions", "0"),
        "Invalid value for '--partitions': Input should be greater than or equal to 1 "
        "(see `raftbroker topic create --help`)",
    ),
    "a flag that is not one": ErrorCase(("consume", TOPIC, "--nope"), "No such option: --nope"),
    "follow and until-end": ErrorCase(
        ("consume", TOPIC, "--follow", "--until-end"), "use --follow or --until-end, not both"
    ),
    "producers of a missing partition": ErrorCase(
        ("producers", "describe", TOPIC, "--partition", "3"), "topic orders has 3 partitions"
    ),
}


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with cluster_up(tmp_path_factory.mktemp("cli-usage")) as data_dir:
        ok(raftbroker("topic", "create", TOPIC, "--partitions", "3", "--data-dir", str(data_dir)))
        yield data_dir


def one_line_error(args: tuple[str, ...], stdin: str | None = None) -> str:
    """The command's stderr, asserted to be one `raftbroker: ...` line with a failing status."""
    result = raftbroker(*args, stdin=stdin)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("raftbroker: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_error_is_one_line_naming_its_object(cluster_dir: Path, case: ErrorCase) -> None:
    started = time.monotonic()
    line = one_line_error((*case.args, "--data-dir", str(cluster_dir)), case.stdin)
    assert case.says in line
    assert time.monotonic() - started < 10  # at once: no waiting for a leader that cannot be


def test_a_record_near_the_limit_after_a_small_one_is_sent_alone(cluster_dir: Path) -> None:
    """A line that fits a batch of its own must not crash the producer by being batched
    behind a shorter one (the batch would pass batch_bytes_max)."""
    d = ("--data-dir", str(cluster_dir))
    produced = raftbroker(
        "produce", TOPIC, "--partition", "1", *d, stdin="a" * 1000 + "\n" + "y" * 1_048_000
    )
    assert "2 records acknowledged" in ok(produced) + produced.stderr


def test_topic_create_on_one_node_defaults_replication_to_its_nodes(tmp_path: Path) -> None:
    d = ("--data-dir", str(tmp_path))
    with cluster_up(tmp_path, "--nodes", "1"):
        created = ok(raftbroker("topic", "create", "solo", *d))
        assert "replication 1 (the default is 3; this cluster has 1 node)" in created
        assert "1 partition," in created
        line = one_line_error(("topic", "create", "duo", "--replication", "2", *d))
        assert "replication factor 2, but the cluster has 1 node " in line


def test_produce_keys_headers_and_tombstones_as_kafka_console_producer(cluster_dir: Path) -> None:
    d = ("--data-dir", str(cluster_dir))
    ok(raftbroker("topic", "create", "kinds", *d))
    lines = "k1\tv1\nk2\tNULL\nNULL\tv3\n\tv4\n"
    produced = raftbroker(
        "produce", "kinds", "-K", "\\t", "-H", "trace=t-1", "--header", "src=cli",
        "--null-marker", "NULL", *d, stdin=lines,
    )  # fmt: skip
    ok(produced)
    assert produced.stderr == "4 records acknowledged to kinds (1 partition; offsets 0: 0..3)\n"
    out = ok(raftbroker("consume", "kinds", "--from-beginning", "--format", "json", *d))
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["key"], r["value"]) for r in records] == [
        ("k1", "v1"),
        ("k2", None),
        (None, "v3"),
        ("", "v4"),
    ]
    assert all(r["headers"] == {"trace": "t-1", "src": "cli"} for r in records)


def test_consume_the_last_n_of_each_partition_until_the_end(cluster_dir: Path) -> None:
    d = ("--data-dir", str(cluster_dir))
    ok(raftbroker("topic", "create", "recent", "--partitions", "3", *d))
    for partition in (0, 1):
        lines = "".join(f"p{partition}-{i}\n" for i in range(5))
        ok(raftbroker("produce", "recent", "--partition", str(partition), *d, stdin=lines))
    started = time.monotonic()
    consumed = raftbroker("consume", "recent", "--offset", "-2", "--until-end", *d,
                          "--timeout-ms", "20000")  # fmt: skip
    assert time.monotonic() - started < 10  # the end of the log ends it, not the timeout
    assert ok(consumed).splitlines() == ["p0-3", "p0-4", "p1-3", "p1-4"]  # partition 2: empty
    assert consumed.stderr == "Processed 4 records\n"
    one = raftbroker("consume", "recent", "-o", "4", "-p", "1", "-e", *d)
    assert (ok(one), one.stderr) == ("p1-4\n", "Processed 1 record\n")
    nothing = raftbroker("consume", "recent", "--until-end", *d)  # from the end: nothing
    assert (ok(nothing), nothing.stderr) == ("", "Processed 0 records\n")
    # Issue 41, item 6: kcat's words. A bare offset applies to every partition read (one
    # that lacks it starts at its nearer end: partition 2, empty, reads nothing).
    every = raftbroker("consume", "recent", "-o", "3", "-e", *d)
    assert ok(every).splitlines() == ["p0-3", "p0-4", "p1-3", "p1-4"]
    beginning = raftbroker("consume", "recent", "-o", "beginning", "-e", *d)
    assert len(ok(beginning).splitlines()) == 10
    assert ok(raftbroker("consume", "recent", "-o", "end", "-e", *d)) == ""


def test_consume_prints_the_fields_asked_for_and_tells_null_from_empty(cluster_dir: Path) -> None:
    d = ("--data-dir", str(cluster_dir))
    ok(raftbroker("topic", "create", "fields", *d))
    ok(raftbroker("produce", "fields", "-K", ",", "--null-marker", "NULL", "-H", "h=1", *d,
                  stdin="k,v\n,empty key\nNULL,null key\nk,NULL\n"))  # fmt: skip
    out = ok(
        raftbroker(
            "consume", "fields", "--from-beginning", "--until-end", "--print-timestamp",
            "--print-partition", "--print-offset", "--print-headers", "--print-key", *d,
        )
    )  # fmt: skip
    rows = [line.split("\t") for line in out.splitlines()]
    stamp = re.compile(r"CreateTime:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    assert all(stamp.fullmatch(row[0]) for row in rows), rows
    assert [row[1:] for row in rows] == [
        ["Partition:0", "Offset:0", "h=1", "k", "v"],
        ["Partition:0", "Offset:1", "h=1", "", "empty key"],
        ["Partition:0", "Offset:2", "h=1", "null", "null key"],
        ["Partition:0", "Offset:3", "h=1", "k", "null"],
    ]
    keys = ok(raftbroker("consume", "fields", "-o", "earliest", "-e", "--print-key",
                         "--null-literal", "<none>", *d))  # fmt: skip
    assert keys.splitlines()[1:3] == ["\tempty key", "<none>\tnull key"]


def test_consume_into_a_pipe_that_closes_stops_quietly(cluster_dir: Path) -> None:
    """`consume | head -1`: the reader goes away; consume stops as `yes | head` does, with no
    message (never a traceback or a "Broken pipe" line) and the shell's SIGPIPE status."""
    d = f"--data-dir {cluster_dir}"
    ok(raftbroker("topic", "create", "piped", "--data-dir", str(cluster_dir)))
    lines = "".join(f"{i}\n" for i in range(50_000))
    ok(raftbroker("produce", "piped", "--data-dir", str(cluster_dir), stdin=lines))
    command = f"{sys.executable} -m cli consume piped --from-beginning -e {d} | head -1"
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stdout == "0\n"
    assert result.returncode == 141, result.stderr
    assert result.stderr == "", result.stderr


def test_consume_from_a_time_starts_at_what_was_appended_since(cluster_dir: Path) -> None:
    d = ("--data-dir", str(cluster_dir))
    ok(raftbroker("topic", "create", "timed", "--partitions", "2", *d))
    ok(raftbroker("produce", "timed", *d, stdin="before-1\nbefore-2\n"))
    since_ms = wall_ms() + 1
    poll_until(lambda: wall_ms() > since_ms, 5, "the clock to pass the mark")  # no sleep
    ok(raftbroker("produce", "timed", *d, stdin="after-1\nafter-2\nafter-3\n"))
    for mark in (str(since_ms), datetime.fromtimestamp(since_ms / 1000, UTC).isoformat()):
        consumed = raftbroker("consume", "timed", "--from-time", mark, "-e", *d)
        assert sorted(ok(consumed).splitlines()) == ["after-1", "after-2", "after-3"], mark
    as_kcat = raftbroker("consume", "timed", "-o", f"s@{since_ms}", "-e", *d)  # kcat's words
    assert sorted(ok(as_kcat).splitlines()) == ["after-1", "after-2", "after-3"]
    later = raftbroker("consume", "timed", "--from-time", str(wall_ms() + 60_000), "-e", *d)
    assert (ok(later), later.stderr) == ("", "Processed 0 records\n")
    line = one_line_error(("consume", "timed", "--from-time", "yesterday", *d))
    assert "is neither ms since the epoch nor an ISO 8601 time" in line


def kafka_bootstrap(data_dir: Path) -> str:
    cluster = launcher.LocalCluster.load(data_dir)
    assert cluster is not None
    return ",".join(cluster.kafka_bootstrap)


def kcat(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kcat", *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.kcat
def test_kcat_creates_a_topic_on_first_use(cluster_dir: Path) -> None:
    """Issue 41, item 3: `kcat -P -t new-topic` waited 30 s, then "Unknown topic or
    partition". A local cluster's nodes create it with their defaults (1 partition), as Kafka
    does; the records go in and come back."""
    bootstrap = kafka_bootstrap(cluster_dir)
    kcat("-P", "-b", bootstrap, "-t", "first-use", stdin="a\nb\nc\n")
    assert kcat("-C", "-b", bootstrap, "-t", "first-use", "-o", "beginning", "-e", "-q") == (
        "a\nb\nc\n"
    )
    listed = json.loads(
        ok(raftbroker("topic", "describe", "first-use", "--json", "--data-dir", str(cluster_dir)))
    )
    assert len(listed["partitions"]) == 1


@pytest.mark.asyncio(loop_scope="function")
async def test_metadata_that_does_not_allow_it_creates_nothing(cluster_dir: Path) -> None:
    address = kafka_bootstrap(cluster_dir).split(",")[0]
    names = ("not-allowed", "bad name!")
    for allow, name, error in (
        (False, "not-allowed", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (True, "bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION),
    ):
        request = m.MetadataRequest(
            (m.MetadataRequestTopic(name),), allow_auto_topic_creation=allow
        )
        answer = await kafka_call(address, m.Api.METADATA, 12, request)
        assert isinstance(answer, m.MetadataResponse)
        assert [(t.name, t.error_code) for t in answer.topics] == [(name, error)]
    listed = ok(raftbroker("topic", "list", "--data-dir", str(cluster_dir)))
    assert not any(name in listed for name in names)


SIGNAL_ENDS_WITHIN_S = 15.0


def started(out: Path, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    """`raftbroker args...` running, its stdout into `out` (a pipe nobody reads meanwhile
    would stop a consumer once full)."""
    with out.open("w") as stdout:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            cwd=REPO,
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )


def terminated(process: subprocess.Popen[str], out: Path) -> tuple[str, str]:
    """SIGTERM `process`; its stdout and stderr once it ended (within SIGNAL_ENDS_WITHIN_S)."""
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=SIGNAL_ENDS_WITHIN_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return out.read_text(), err


def test_sigterm_ends_a_group_consumer_as_ctrl_c_does(cluster_dir: Path, tmp_path: Path) -> None:
    """Issue 41, item 5: `consume --group G --follow` killed by SIGTERM exited without its
    summary or a LeaveGroup, and its member blocked `groups delete` for its session (45 s)."""
    d = ("--data-dir", str(cluster_dir))
    ok(raftbroker("produce", TOPIC, *d, stdin="".join(f"term-{i}\n" for i in range(30))))
    out_path = tmp_path / "out"
    consumer = started(
        out_path, "consume", TOPIC, "--group", "g-term", "--from-beginning", "--follow", *d
    )
    try:
        poll_until(
            lambda: (
                "g-term" in raftbroker("groups", "list", *d).stdout
                and _lag(cluster_dir, "g-term") == 0
            ),
            60,
            "the group's member to print and commit everything",
        )
    finally:
        out, err = terminated(consumer, out_path)
    assert consumer.returncode == 0, err
    printed = len(out.splitlines())
    assert printed >= 30
    assert err.splitlines()[-1] == f"Processed {printed:,} records"
    described = json.loads(ok(raftbroker("groups", "describe", "g-term", "--json", *d)))
    assert described["members"] == []  # it left: its member is gone at once
    ok(raftbroker("groups", "delete", "g-term", *d))  # refused while it has members


def _lag(cluster_dir: Path, group: str) -> int | None:
    result = raftbroker("groups", "describe", group, "--json", "--data-dir", str(cluster_dir))
    if result.returncode != 0:
        return None
    described = json.loads(result.stdout)
    lags = [p["lag"] for p in described["partitions"]]
    return sum(lags) if lags and described["members"] else None


def test_sigterm_ends_a_producer_reading_a_pipe_that_never_closes(
    cluster_dir: Path, tmp_path: Path
) -> None:
    """As `tail -f log | raftbroker produce T` under systemd: the lines sent so far are
    acknowledged and summed up; the read that waits for more does not hold the process."""
    out_path = tmp_path / "out"
    producer = started(
        out_path, "produce", TOPIC, "--data-dir", str(cluster_dir), stdin=subprocess.PIPE
    )
    assert producer.stdin is not None
    producer.stdin.write("".join(f"piped-{i}\n" for i in range(5)))
    producer.stdin.flush()  # and left open: more could come

    def acknowledged() -> bool:
        consumed = raftbroker(
            "consume", TOPIC, "--from-beginning", "--until-end", "--data-dir", str(cluster_dir)
        )
        return consumed.stdout.count("piped-") == 5

    try:
        poll_until(acknowledged, 60, "the 5 piped lines acknowledged")
    finally:
        _out, err = terminated(producer, out_path)
    assert producer.returncode == 0, err
    assert err.splitlines()[-1].startswith("5 records acknowledged to orders (")
    assert err.splitlines()[-1].endswith("; interrupted: the rest of the input was not read")
