"""One chaos run: a fresh local cluster, the workload under the nemesis, heal, drain, check.

Role: compose the pieces and leave a directory a person can audit: `history.jsonl` (every
operation and fault), `report.json` and `summary.txt` (the checker's verdict and figures), the
node logs and data under `cluster/`. Nothing is left running: the cluster is stopped by PID in
a `finally`, on success, failure or cancellation.

`client` chooses who does the workload's producing and consuming: raftbroker's native client,
or Kafka's (`kafka`: confluent-kafka and our Kafka codec against every node's Kafka listener,
kafka_clients.py, imported only then). Either way the topic is created, the streaming sink
writes, and the final reads and replica dumps the checker needs are made, natively.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cluster import native as p
from cluster.chaos.checker import check_file
from cluster.chaos.clients import Clients, Record, WorkloadSettings
from cluster.chaos.history import HistoryWriter
from cluster.chaos.links import LinkCutter
from cluster.chaos.native_clients import NativeClients
from cluster.chaos.native_txns import NativeTxnWorkload
from cluster.chaos.nemesis import GROUP_FAULTS, NETWORK_FAULTS, Nemesis, schedule
from cluster.chaos.report import Report
from cluster.chaos.txn_workload import TxnWorkloadBase
from cluster.chaos.workload import Clock, Workload
from cluster.client import Admin, Client, ClientError, Consumer, ConsumerConfig, Groups
from cluster.local import launcher
from statemachine.errors import ErrorCode
from statemachine.records import RecordBatch

TOPIC = "chaos"
GROUP = "chaos-group"  # the workload's consumer group (native client runs)
GROUP_FORM_TIMEOUT_S = 30.0  # the faults wait this long at most for the group to form
CLIENTS = ("native", "kafka")
GROUP_INITIAL_REBALANCE_DELAY_MS = 1  # the least a node takes (a delay is positive)
SETTLE_S = 3.0  # after healing, the workload goes on this long before it stops
DRAIN_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    duration_s: float
    seed: int
    out_dir: Path
    partitions: int = 4
    producers: int = 3
    fault_interval_s: float = 6.0
    client: str = "native"  # one of CLIENTS
    # The negative control: nodes append retried batches again (cluster/config.py).
    unsafe_disable_deduplication: bool = False
    # The transactions' negative control: nodes serve read_committed as read_uncommitted.
    unsafe_ignore_isolation: bool = False
    # Nodes fsync before they acknowledge (`fsync = true`, the default); False: the negative
    # control of the power cuts.
    fsync: bool = True
    # Power cuts among the faults (nemesis.POWER_FAULTS): the nodes record their fsyncs.
    power_loss: bool = False
    # The transactions' workload (txn_workload.py) beside the rest.
    transactions: bool = True
    # Why there are no network faults (None: the run has its own namespace and cuts links).
    no_network_reason: str | None = "not inside a network namespace of its own"


Progress = Callable[[str], None]


async def run_chaos(options: ChaosOptions, progress: Progress = lambda _: None) -> Report:
    out = options.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cutter = None
    if options.no_network_reason is None:
        cutter = LinkCutter()
        cutter.prepare()  # loopback up before any node binds to it
    cluster = launcher.up(out / "cluster", 3, extra_toml=_node_settings(options))
    nemesis: Nemesis | None = None
    try:
        await launcher.wait_ready(cluster, 60.0)
        progress(f"cluster up in {out / 'cluster'}")
        with HistoryWriter(out / "history.jsonl") as history:
            clock = Clock()  # the history's time starts when its file does

            def timed(event: dict[str, object]) -> None:
                event.setdefault("time_ms", clock.ms())
                history.write(event)

            group = GROUP if _with_group(options) else None
            async with _transactions(options, cluster, timed, clock) as txns:
                coordinator = None if txns is None else txns.coordinator_node
                nemesis = Nemesis(
                    cluster, TOPIC, timed, cutter, group=group, txn_coordinator=coordinator
                )
                await _run(options, cluster, nemesis, timed, progress, txns=txns)
                cluster = nemesis.cluster
        report = check_file(out / "history.jsonl")
        _write_report(out, options, report, nemesis)
        return report
    finally:
        if nemesis is not None:
            cluster = nemesis.cluster
            await nemesis.close()
        launcher.down(cluster.current())


def _node_settings(options: ChaosOptions) -> str:
    """The nodes' configuration lines this run asks for (besides the launcher's own)."""
    flags = {
        "unsafe_record_syncs": options.power_loss,
        "unsafe_disable_deduplication": options.unsafe_disable_deduplication,
        "unsafe_ignore_isolation": options.unsafe_ignore_isolation,
    }
    fsync = f"fsync = {'true' if options.fsync else 'false'}\n"
    # No initial rebalance delay to speak of (Kafka's 3 s wait for more members of a new
    # group, which its own test harnesses set to 0): the group forms at once, so the faults
    # begin 3 s sooner and a run spends its time under them.
    timing = (
        f"timing = {{ group_initial_rebalance_delay_ms = {GROUP_INITIAL_REBALANCE_DELAY_MS} }}\n"
    )
    return fsync + "".join(f"{name} = true\n" for name, on in flags.items() if on) + timing


async def _run(
    options: ChaosOptions,
    cluster: launcher.LocalCluster,
    nemesis: Nemesis,
    timed: Callable[[dict[str, object]], None],
    progress: Progress,
    *,
    txns: TxnWorkloadBase | None,
) -> None:
    client = Client(cluster.bootstrap, request_timeout_s=5.0)
    try:
        admin = Admin(client)
        await admin.create_topic(TOPIC, options.partitions, 3)
        await admin.wait_for_leaders(TOPIC, 30.0)
        if txns is not None:
            await txns.create_topics(admin)
        settings = WorkloadSettings(TOPIC, options.partitions, options.producers)
        async with _clients(options.client, client, cluster, settings, timed) as clients:
            workload = Workload(clients, client, settings, timed)
            await _under_faults(options, nemesis, workload, progress, txns=txns)
        progress("workload stopped; draining every partition")
        for partition in range(options.partitions):
            timed(await _final_read(client, partition))
        for node in nemesis.cluster.nodes:
            for partition in range(options.partitions):
                timed(await _replica_log(client, node, partition))
        for node_name, line in applied_truncations(options.out_dir / "cluster"):
            timed({"type": "info", "process": "nemesis", "f": "raft_truncation",
                   "node": node_name, "line": line})  # fmt: skip
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def _clients(
    kind: str,
    native: Client,
    cluster: launcher.LocalCluster,
    settings: WorkloadSettings,
    record: Record,
) -> AsyncIterator[Clients]:
    assert kind in CLIENTS, kind
    if kind == "native":
        yield NativeClients(native, settings)
        return
    from cluster.chaos.kafka_clients import KafkaClients  # noqa: PLC0415 - needs confluent-kafka

    kafka = KafkaClients(cluster.kafka_bootstrap, settings, record)
    try:
        yield kafka
    finally:
        await kafka.close()


@contextlib.asynccontextmanager
async def _transactions(
    options: ChaosOptions,
    cluster: launcher.LocalCluster,
    record: Record,
    clock: Clock,
) -> AsyncIterator[TxnWorkloadBase | None]:
    """The transactional workload: Kafka's clients' in a Kafka-client run, the client
    library's in a native one; None without transactions."""
    if not options.transactions:
        yield None
        return
    if options.client != "kafka":
        native = NativeTxnWorkload(cluster.bootstrap, options.partitions, record, clock.ms)
        try:
            yield native
        finally:
            await native.close()
        return
    from cluster.chaos.kafka_txns import TxnWorkload  # noqa: PLC0415 - needs confluent-kafka
    from cluster.chaos.kafka_wire import KafkaWireClient  # noqa: PLC0415

    wire = KafkaWireClient(cluster.kafka_bootstrap, 5.0)
    try:
        yield TxnWorkload(cluster.kafka_bootstrap, options.partitions, record, wire, clock.ms)
    finally:
        await wire.close()


async def _run_transactions(
    txns: TxnWorkloadBase, stopped: asyncio.Event, progress: Progress
) -> None:
    """The writer until the workload stops, the processor until it drained the input (or the
    drain's time is up), the watcher throughout; then the final reads."""
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(txns.run_writer("x0"))
        tasks.create_task(txns.run_processor("y0"))
        tasks.create_task(txns.run_watcher("l0"))
        await stopped.wait()
        txns.stopping.set()
        try:
            await asyncio.wait_for(txns.drained.wait(), DRAIN_TIMEOUT_S)
            txns.event("ok", "runner", "ctp_drain", ends=[])
        except TimeoutError:
            txns.event("info", "runner", "ctp_drain", ends=[])
            txns.drained.set()
    progress("transactions drained; the final reads")
    await txns.finish("l0")


async def _under_faults(
    options: ChaosOptions,
    nemesis: Nemesis,
    workload: Workload,
    progress: Progress,
    *,
    txns: TxnWorkloadBase | None,
) -> None:
    """The workload under the nemesis for the run's duration, then healed, settled, stopped."""
    faults = schedule(
        options.seed,
        options.duration_s,
        options.partitions,
        options.fault_interval_s,
        network=options.no_network_reason is None,
        power=options.power_loss,
        groups=nemesis.group is not None,
        txns=txns is not None,
    )
    progress(
        f"{len(faults)} faults scheduled over {options.duration_s:.0f} s (seed {options.seed})"
    )
    loop = asyncio.get_running_loop()
    group = nemesis.group
    async with asyncio.TaskGroup() as readers:  # the group reads on until it read everything
        if group is not None:
            for i in range(workload.settings.group_members):
                member = workload.run_group_member(f"g{i}", group, restarts=i == 1)
                readers.create_task(member)
            readers.create_task(workload.run_committed_watch("w0", group))
        if txns is not None:
            readers.create_task(_run_transactions(txns, workload.stopping, progress))
        async with asyncio.TaskGroup() as tasks:
            for i in range(options.producers):
                tasks.create_task(workload.run_producer(f"p{i}"))
            tasks.create_task(workload.run_transactional("t0", "chaos-txn"))
            tasks.create_task(workload.run_consumer("c0"))
            tasks.create_task(workload.run_resender("r0"))
            tasks.create_task(workload.run_sink("s0"))
            if group is not None:  # faults on a formed group (a forming one only re-forms)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(workload.group_formed.wait(), GROUP_FORM_TIMEOUT_S)
                progress("the consumer group formed; the faults begin")
            chaos = tasks.create_task(nemesis.run(faults, loop.time(), options.seed))
            await asyncio.sleep(options.duration_s)
            chaos.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chaos
            await nemesis.heal()
            progress("healed; letting the workload settle")
            await launcher.wait_ready(nemesis.cluster, 60.0)
            await asyncio.sleep(SETTLE_S)
            workload.stopping.set()
        if group is not None:
            progress("producers stopped; the group reads to the end")
            await _drain_group(workload, group, options.partitions)
        workload.group_stopping.set()


async def _drain_group(workload: Workload, group: str, partitions: int) -> None:
    """Until the group has committed every partition's end (every record read), or the drain's
    time is up: `group_drain` says which, with the ends."""
    client = workload.native
    admin, groups = Admin(client), Groups(client)
    ends = [(p, await admin.list_offsets(TOPIC, p, Consumer.LATEST)) for p in range(partitions)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_TIMEOUT_S
    while loop.time() < deadline:
        with contextlib.suppress(ClientError):
            committed = await groups.committed(group, timeout_s=5.0)
            if all(committed.get((TOPIC, p), 0) >= end for p, end in ends):
                workload.event("ok", "runner", "group_drain", group=group, ends=ends)
                return
        await asyncio.sleep(0.2)
    workload.event("info", "runner", "group_drain", group=group, ends=ends)


async def _final_read(client: Client, partition: int) -> dict[str, object]:
    """Every record of a partition, from offset 0 to its high watermark, through the leader."""
    admin = Admin(client)
    try:
        end = await admin.list_offsets(TOPIC, partition, Consumer.LATEST)
    except ClientError as exc:
        # Nothing to read (the cluster lost the topic itself: a power cut of every node
        # without fsync): the checker counts every acknowledged record of it as lost.
        return {**_final_rows(partition, []), "error": str(exc)}
    consumer = Consumer(client, ConsumerConfig(max_wait_ms=100))
    await consumer.seek(TOPIC, partition, 0)
    rows: list[list[object]] = []
    deadline = asyncio.get_running_loop().time() + DRAIN_TIMEOUT_S
    while (not rows or rows[-1][0] < end - 1) and end > 0:  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            break  # the checker then reports what is missing
        with contextlib.suppress(ClientError, TimeoutError):
            for r in await consumer.poll():
                rows.append(
                    [
                        r.offset,
                        (r.value or b"").decode(),
                        r.producer_id,
                        r.producer_epoch,
                        r.sequence,
                    ]
                )
    return _final_rows(partition, rows)


def _final_rows(partition: int, rows: list[list[object]]) -> dict[str, object]:
    return {
        "type": "ok",
        "process": "final",
        "f": "final_read",
        "partition": partition,
        "records": rows,
    }


async def _replica_log(
    client: Client, node: launcher.NodeProcess, partition: int
) -> dict[str, object]:
    """One replica's committed log, read from that node itself (not through the leader)."""
    rows: list[list[object]] = []
    offset = 0
    while True:
        request = p.Fetch(0, 4 << 20, (p.FetchPartition(TOPIC, partition, offset, 4 << 20),), True)
        response = await client.send(node.client_address, request, 10.0)
        assert isinstance(response, p.FetchResponse)
        result = response.results[0]
        if result.error != ErrorCode.NONE or not result.batches:
            break
        for fetched in result.batches:
            batch = RecordBatch.decode(fetched.batch)
            for i, record in enumerate(batch.records):
                at = fetched.base_offset + i
                if at < offset:
                    continue
                seq = batch.base_sequence + i if batch.base_sequence >= 0 else -1
                rows.append(
                    [
                        at,
                        (record.value or b"").decode(),
                        batch.producer_id,
                        batch.producer_epoch,
                        seq,
                    ]
                )
                offset = at + 1
        if offset >= result.high_watermark:
            break
    return {
        "type": "ok",
        "process": "final",
        "f": "replica_log",
        "node": f"node{node.node_id}",
        "partition": partition,
        "records": rows,
    }


def _write_report(out: Path, options: ChaosOptions, report: Report, nemesis: Nemesis) -> None:
    document: dict[str, Any] = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "faults_done": nemesis.faults_done,
        "faults_skipped": skipped_faults(options),
        **report.to_json(),
    }
    (out / "report.json").write_text(json.dumps(document, indent=2))
    (out / "summary.txt").write_text(report.summary() + "\n")


# The words of the line a Raft replica logs (at CRITICAL) when it deletes entries it had
# applied: cluster/raft/adapter/appends.py's APPLIED_TRUNCATION, pysyncobj's own words.
APPLIED_TRUNCATION = "truncating already-applied log entries"


def applied_truncations(cluster_dir: Path) -> list[tuple[str, str]]:
    """(node, line) for each line of the nodes' logs where a Raft replica deleted entries it
    had applied."""
    found = []
    for node_log in sorted(cluster_dir.glob("node*.log")):
        with node_log.open(errors="replace") as lines:
            found += [(node_log.stem, line.strip()) for line in lines if APPLIED_TRUNCATION in line]
    return found


def skipped_faults(options: ChaosOptions) -> dict[str, str]:
    """Fault kinds this run could not inject, and why."""
    reason = options.no_network_reason
    skipped = {} if reason is None else dict.fromkeys(NETWORK_FAULTS, reason)
    if not _with_group(options):
        why = (
            "no consumer group in Kafka-client runs yet (confluent-kafka hides generations)"
            if options.client != "native"
            else "no consumer group in power-loss runs (their schedules are of power cuts)"
        )
        skipped.update(dict.fromkeys(GROUP_FAULTS, why))
    return skipped


def _with_group(options: ChaosOptions) -> bool:
    """Whether the run has a consumer group (and kill-coordinator faults)."""
    return options.client == "native" and not options.power_loss
