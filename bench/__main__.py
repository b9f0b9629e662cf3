"""`python -m bench`: raftbroker, Apache Kafka and NATS JetStream side by side, in one run, on
this machine.

Role: run the raftbroker cluster benchmark (`bench.cluster`), its Kafka-listener benchmark
with librdkafka (`bench.kafka`), the same against Apache Kafka itself (`bench.kafka --broker
apache-kafka`: 3 KRaft nodes from Maven Central's jars), the JetStream one (`bench.jetstream`),
then consumer groups on the three (`bench.groups`) and transactions on raftbroker's Kafka
listener and Apache Kafka (`bench.kafka_txns`), one after the other so none disturbs another,
each in its own process
(so each starts and stops its own servers by PID), then put their numbers side by side with
the ratios the goals are stated in.
Then the sequential latencies the goals compare, again, in rounds: each round runs the compared
case of every side (raftbroker's native producer, librdkafka through the Kafka listener,
JetStream's client on its stream leader's server) on a fresh cluster, one after the other, the
order rotated from round to round; the goals compare each side's median over the rounds. A
sequential p50 here moves by 20% within minutes (bench/HISTORY.md), more than the gap the goal
is about, and the scenario runs above measure the sides minutes apart: the rounds compare
neighbours in time.
Prints one JSON object; unless `--quick`, also writes the markdown report `bench/RESULTS.md`.
Exit status 1 if any side failed a scenario (a goal missed is a result, not a failure).

Method notes (also in the report): the same workload on both (100-byte values, a unique id per
message: raftbroker's idempotent producer, JetStream's `Nats-Msg-Id`; every publish acknowledged
by a majority; 3 nodes, 3 replicas, on 127.0.0.2-4); CPU of every server and of the client
process is recorded, so a CPU-bound result shows as one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import compare
from bench.report import dig

RESULTS = Path(__file__).with_name("RESULTS.md")
SEQUENTIAL_ROUNDS = 3
APACHE_KAFKA = ("--broker", "apache-kafka")
# Each side's compared sequential case alone: (side, module, its scenario, its arguments).
SEQUENTIAL_SIDES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("raftbroker", "bench.cluster", "sequential", ()),
    ("kafka", "bench.kafka", "sequential", ()),
    ("apache_kafka", "bench.kafka", "sequential", APACHE_KAFKA),
    ("jetstream", "bench.jetstream", "sequential_on_leader", ()),
)


def run_side(
    module: str,
    quick: bool,
    scratch: Path,
    scenario: str | None = None,
    *,
    tag: str = "",
    args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One side's benchmark in its own process; its JSON (with `errors` if it failed)."""
    out = scratch / f"{module.rpartition('.')[2]}{tag}.json"
    argv = [sys.executable, "-m", module, "--out", str(out), *(["--quick"] if quick else [])]
    argv += args
    if scenario is not None:
        argv += ["--scenarios", scenario]
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)
    if not out.exists():
        return {"errors": {"run": f"{module} exited {done.returncode} without a report"}}
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def sequential_rounds(quick: bool, scratch: Path) -> list[dict[str, Any]]:
    """The compared sequential cases in rounds, the sides' order rotated each round: per round
    and side, the p50 in ms (None if it failed) and the side's errors."""
    rounds = []
    for number in range(1 if quick else SEQUENTIAL_ROUNDS):
        shift = number % len(SEQUENTIAL_SIDES)
        row: dict[str, Any] = {}
        for side, module, scenario, args in SEQUENTIAL_SIDES[shift:] + SEQUENTIAL_SIDES[:shift]:
            report = run_side(
                module, quick, scratch, scenario, tag=f"-{side}-{number + 1}", args=args
            )
            row[side] = {
                "p50_ms": dig(report, "sequential", "p50_ms"),
                "errors": report.get("errors") or {},
            }
        rounds.append(row)
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="seconds per scenario (CI smoke)")
    parser.add_argument("--out", type=Path, help="also write the combined JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="raftbroker-bench-") as tmp:
        ours = run_side("bench.cluster", args.quick, Path(tmp))
        kafka = run_side("bench.kafka", args.quick, Path(tmp))
        apache = run_side("bench.kafka", args.quick, Path(tmp), tag="-apache", args=APACHE_KAFKA)
        peer = run_side("bench.jetstream", args.quick, Path(tmp))
        groups = run_side("bench.groups", args.quick, Path(tmp))
        txns = run_side("bench.kafka_txns", args.quick, Path(tmp))
        rounds = sequential_rounds(args.quick, Path(tmp))
    combined = compare.combine(ours, peer, kafka, groups, rounds, apache, txns)
    text = json.dumps(combined, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    if not args.quick:
        RESULTS.write_text(compare.markdown(combined))
    sys.stdout.write(text + "\n")
    sides = (ours, peer, kafka, apache, groups, txns)
    sides += tuple(s for row in rounds for s in row.values())
    return 1 if any(side.get("errors") for side in sides) else 0


if __name__ == "__main__":
    sys.exit(main())
