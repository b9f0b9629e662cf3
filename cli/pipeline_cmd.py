"""`raftbroker pipeline`: the Spark jobs of `pipeline/jobs/` and their event generator.

`run audit TOPIC` reads a topic completely on a local Spark session and reports, per partition,
duplicates, sequence gaps and producers; it exits 1 unless the topic is clean. `run
settlement_totals` keeps per-merchant totals of settlement events, to a topic and to parquet
(by default, and with its checkpoint, under `settlement_totals/` of the data dir, never the
current directory); it says where they go when it starts and what they hold when it stops.
`generate` produces settlement events at a given rate. Topics they need must exist: a missing
one is a one-line error before any Spark starts. The Spark commands need the `spark` extra
(`pip install -e '.[spark]'` in the checkout) and Java 17+; without them they say so in one
line.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cli.common import (
    BootstrapOption,
    CliError,
    DataDirOption,
    JsonOption,
    console,
    default_data_dir,
    one_line_errors,
    plural,
    resolve_bootstrap,
    run,
    topic_partitions,
)
from cluster.client import Client

SIGNALLED_EXIT_STATUS = 128  # + the signal's number: what a shell reports for a process it stopped
app = typer.Typer(help="Spark jobs on the raftbroker data source.", no_args_is_help=True)
TOTALS_DIR = "settlement_totals"  # under the data dir: where the job's outputs go by default
PARQUET_NAME = "merchant-totals.parquet"
CHECKPOINT_NAME = "checkpoint"
run_app = typer.Typer(help="Run a job on a local Spark session.", no_args_is_help=True)
app.add_typer(run_app, name="run")


_ERROR_LINE = re.compile(r"\s*([\w.]*(?:Error|Exception)): (.+)")
_NOT_OURS = ("java.", "org.", "py4j", "pyspark", "scala.")


def spark_error_line(exc: BaseException) -> str:
    """The line of a Spark failure that says what went wrong in our code (a Python error
    raised in an executor reaches the driver wrapped in JVM exceptions and their traces)."""
    for line in reversed(str(exc).splitlines()):
        found = _ERROR_LINE.match(line)
        if found and not found.group(1).startswith(_NOT_OURS):
            return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2).strip()}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@contextmanager
def _spark_job(app_name: str) -> Iterator[Any]:
    """A local Spark session for one job; a failure of the job becomes one line."""
    spark = _spark(app_name)
    try:
        yield spark
    except (CliError, KeyboardInterrupt, typer.Exit):
        raise
    except Exception as exc:  # Spark wraps everything: say what matters, in one line
        raise CliError(spark_error_line(exc)) from exc
    finally:
        spark.stop()


def _spark(app_name: str) -> Any:
    try:
        from pipeline.session import local_session  # noqa: PLC0415 - the optional extra
    except ImportError as exc:
        raise CliError(
            f"the Spark jobs need PySpark: pip install -e '.[spark]' in the checkout ({exc})"
        ) from exc
    return local_session(app_name)


@run_app.command("audit")
@one_line_errors
def audit_command(
    topic: str = typer.Argument(..., metavar="TOPIC", help="The topic to audit."),
    business_key: str | None = typer.Option(
        None,
        "--business-key",
        metavar="EXPR",
        help="A Spark SQL expression that identifies a record, e.g. "
        "\"get_json_object(CAST(value AS STRING), '$.event_id')\".",
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
    as_json: bool = JsonOption,
) -> None:
    """Read TOPIC completely; report duplicates, gaps and producers; exit 1 unless clean."""
    addresses = resolve_bootstrap(bootstrap, data_dir)
    run(_existing_topics(addresses, [topic]))  # a missing topic: one line, and no Spark started
    with _spark_job("raftbroker-audit") as spark:
        from pipeline.jobs.audit import audit  # noqa: PLC0415 - needs PySpark

        report = audit(spark, ",".join(addresses), topic, business_key)
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print_audit(report)
    if not report.clean:
        raise typer.Exit(1)


def _print_audit(report: Any) -> None:
    table = Table(title=f"audit of {report.topic}: {plural(report.records, 'record')}")
    for column in ("partition", "records", "dup (pid, seq)", "dup (key)", "gaps", "producers"):
        table.add_column(column, justify="right")
    for p in report.partitions:
        key_dups = str(p.duplicates_by_business_key) if report.business_key else "-"
        table.add_row(
            str(p.partition),
            f"{p.records:,}",
            str(p.duplicates_by_producer_sequence),
            key_dups,
            str(p.sequence_gaps),
            str(p.producers),
        )
    out = console()
    out.print(table)
    out.print("clean: exactly once" if report.clean else "NOT clean: see the counts above")


@run_app.command("settlement_totals")
@one_line_errors
def settlement_totals_command(
    source: str = typer.Option(
        "settlements", "--source", metavar="TOPIC", help="Topic of settlement events."
    ),
    totals_topic: str = typer.Option(
        "merchant-totals",
        "--totals-topic",
        metavar="TOPIC",
        help="Topic the running totals are written to (a fenced streaming write).",
    ),
    parquet: Path | None = typer.Option(
        None,
        "--parquet",
        metavar="DIR",
        help="Parquet directory the totals table is written to. "
        f"Default: {TOTALS_DIR}/{PARQUET_NAME} under the data dir (--data-dir).",
    ),
    checkpoint: Path | None = typer.Option(
        None,
        "--checkpoint",
        metavar="DIR",
        help="The streaming queries' checkpoint: a rerun resumes from it. "
        f"Default: {TOTALS_DIR}/{CHECKPOINT_NAME} under the data dir.",
    ),
    max_per_trigger: int | None = typer.Option(
        None, "--max-per-trigger", min=1, metavar="N", help="At most N events per micro-batch."
    ),
    available_now: bool = typer.Option(
        False, "--available-now", help="Process what is committed, then stop."
    ),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
) -> None:
    """Per-merchant totals of settlement events, to a topic (fenced) and to parquet; says
    where they go, and what was written when it stops."""
    addresses = resolve_bootstrap(bootstrap, data_dir)
    run(_existing_topics(addresses, [source, totals_topic]))
    outputs = (data_dir or default_data_dir()).resolve() / TOTALS_DIR
    parquet_dir = (parquet or outputs / PARQUET_NAME).resolve()
    checkpoint_dir = (checkpoint or outputs / CHECKPOINT_NAME).resolve()
    typer.echo(
        f"settlement_totals: {source} -> topic {totals_topic} and parquet {parquet_dir} "
        f"(checkpoint {checkpoint_dir}); "
        + ("processing what is committed, then stopping" if available_now else "Ctrl-C stops"),
        err=True,
    )
    with _spark_job("raftbroker-settlement-totals") as spark:
        from pipeline.jobs import settlement_totals as job  # noqa: PLC0415 - needs PySpark

        spec = job.TotalsJob(
            ",".join(addresses),
            source,
            totals_topic,
            parquet_dir,
            checkpoint_dir,
            max_per_trigger,
            available_now,
        )
        # Ctrl-C, or SIGTERM (`timeout`, systemd, `docker stop`), asks the run to stop between
        # two waits (PySpark's own handler would raise in the middle of a call into the JVM);
        # then say what it wrote, with the signal's status.
        stopped_by: list[signal.Signals] = []

        def stop(signum: int, _frame: object) -> None:
            stopped_by.append(signal.Signals(signum))

        handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            job.run(spark, spec, stop=lambda: bool(stopped_by))
        finally:
            for sig, previous in handlers.items():
                signal.signal(sig, previous)
        if stopped_by:
            how = "Ctrl-C" if stopped_by[0] == signal.SIGINT else stopped_by[0].name
            typer.echo(f"stopped ({how}): {_totals_written(spec)}")
            raise typer.Exit(SIGNALLED_EXIT_STATUS + stopped_by[0])
        typer.echo(_totals_written(spec))


async def _existing_topics(addresses: list[str], topics: list[str]) -> None:
    cluster = Client(addresses)
    try:
        for topic in topics:
            await topic_partitions(cluster, topic)
    finally:
        await cluster.close()


def _totals_written(spec: Any) -> str:
    """What the totals now hold, read back from the parquet the job wrote (with pyarrow, not
    Spark: after a Ctrl-C the session may be going down)."""
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra, as the job itself
    import pyarrow.parquet as pq  # noqa: PLC0415

    from pipeline.jobs.settlements import CURRENCY  # noqa: PLC0415 - keeps startup light

    nothing = f"no settlement events in {spec.source_topic} yet: nothing written"
    if not any(spec.parquet_dir.glob("*.parquet")):
        return nothing
    try:
        table = pq.read_table(spec.parquet_dir)
        events, cents = (pc.sum(table[name]).as_py() for name in ("events", "total_cents"))
    except (OSError, KeyError) as exc:  # stopped while a micro-batch rewrote it
        return f"the parquet was being rewritten ({exc}); a rerun resumes from the checkpoint"
    if not table.num_rows:
        return nothing
    return (
        f"totals of {plural(events, 'event')} over {plural(table.num_rows, 'merchant')} "
        f"({cents / 100:,.2f} {CURRENCY}) in parquet {spec.parquet_dir} and topic "
        f"{spec.totals_topic} (the latest record per merchant is its total)"
    )


@app.command("generate")
@one_line_errors
def generate_command(
    topic: str = typer.Option(
        "settlements", "--topic", metavar="TOPIC", help="The topic to write to (it must exist)."
    ),
    count: int = typer.Option(10_000, "--count", min=1, metavar="N", help="Events to send."),
    rate: float = typer.Option(
        1_000.0, "--rate", min=0, metavar="R", help="Events per second (0: flat out)."
    ),
    merchants: int = typer.Option(
        50, "--merchants", min=1, metavar="N", help="Merchants the events are spread over."
    ),
    seed: int = typer.Option(1, "--seed", metavar="N", help="Same seed, same events and totals."),
    bootstrap: list[str] | None = BootstrapOption,
    data_dir: Path | None = DataDirOption,
) -> None:
    """Produce settlement events (JSON, keyed by merchant) through the idempotent producer."""
    from pipeline.jobs.settlements import generate  # noqa: PLC0415 - keeps startup light

    addresses = resolve_bootstrap(bootstrap, data_dir)

    async def main() -> int:
        cluster = Client(addresses)
        try:
            await topic_partitions(cluster, topic)
            return await generate(
                cluster, topic, count, rate_per_s=rate, merchants=merchants, seed=seed
            )
        finally:
            await cluster.close()

    sent = run(main())
    typer.echo(f"{plural(sent, 'settlement event')} acknowledged on {topic}")
