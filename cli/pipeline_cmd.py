"""`raftbroker pipeline`: the Spark jobs of `pipeline/jobs/` and their event generator.

`run audit TOPIC` reads a topic completely on a local Spark session and reports, per partition,
duplicates, sequence gaps and producers; it exits 1 unless the topic is clean. `run
settlement_totals` keeps per-merchant totals of settlement events, to a topic and to parquet.
`generate` produces settlement events at a given rate. The Spark commands need the `spark`
extra (`pip install 'raftbroker[spark]'`) and Java 17+; without them they say so in one line.
"""

from __future__ import annotations

import json
import re
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
    one_line_errors,
    plural,
    resolve_bootstrap,
    run,
    topic_partitions,
)
from cluster.client import Cluster

app = typer.Typer(help="Spark jobs on the raftbroker data source.", no_args_is_help=True)
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
    except (CliError, KeyboardInterrupt):
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
            f"the Spark jobs need PySpark: pip install 'raftbroker[spark]' ({exc})"
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
    parquet: Path = typer.Option(
        Path("merchant-totals.parquet"),
        "--parquet",
        metavar="DIR",
        help="Parquet directory the totals are written to.",
    ),
    checkpoint: Path = typer.Option(
        Path("settlement-totals-checkpoint"),
        "--checkpoint",
        metavar="DIR",
        help="The streaming query's checkpoint: a rerun resumes from it.",
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
    """Per-merchant totals of settlement events, to a topic (fenced) and to parquet."""
    addresses = resolve_bootstrap(bootstrap, data_dir)
    with _spark_job("raftbroker-settlement-totals") as spark:
        from pipeline.jobs import settlement_totals as job  # noqa: PLC0415 - needs PySpark

        spec = job.TotalsJob(
            ",".join(addresses),
            source,
            totals_topic,
            parquet.resolve(),
            checkpoint.resolve(),
            max_per_trigger,
            available_now,
        )
        job.run(spark, spec)


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
        cluster = Cluster(addresses)
        try:
            await topic_partitions(cluster, topic)
            return await generate(
                cluster, topic, count, rate_per_s=rate, merchants=merchants, seed=seed
            )
        finally:
            await cluster.close()

    sent = run(main())
    typer.echo(f"{plural(sent, 'settlement event')} acknowledged on {topic}")
