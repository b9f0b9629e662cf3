"""`raftbroker pipeline generate`, `run audit` and `run settlement_totals`, run as a user runs
them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from cluster.client.sync import SyncClient
from tests.cluster.procs import REPO
from tests.cluster.test_cli import raftbroker as cli_run
from tests.pipeline.conftest import new_topic

pytestmark = pytest.mark.spark
EVENT_ID = "get_json_object(CAST(value AS STRING), '$.event_id')"


def raftbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_run(*args, timeout_s=180)  # a Spark session starts in the command


def test_generate_then_audit_reports_a_clean_topic(client: SyncClient, bootstrap: str) -> None:
    topic = new_topic(client, 2, "cli")
    generated = raftbroker(
        "pipeline", "generate", "--topic", topic, "--count", "300", "--rate", "0",
        "--bootstrap", bootstrap.split(",", maxsplit=1)[0],
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    assert "300 settlement events acknowledged" in generated.stdout
    audited = raftbroker(
        "pipeline", "run", "audit", topic, "--business-key", EVENT_ID, "--json",
        "--bootstrap", bootstrap.split(",", maxsplit=1)[0],
    )  # fmt: skip
    assert audited.returncode == 0, audited.stderr
    report = json.loads(audited.stdout)
    assert (report["records"], report["clean"]) == (300, True)
    assert sum(p["duplicates_by_business_key"] for p in report["partitions"]) == 0


def test_audit_of_a_missing_topic_is_one_line_and_exit_1(bootstrap: str) -> None:
    first = bootstrap.split(",", maxsplit=1)[0]
    audited = raftbroker("pipeline", "run", "audit", "no-such-topic", "--bootstrap", first)
    assert audited.returncode == 1
    lines = audited.stderr.strip().splitlines()
    assert lines[-1].startswith("raftbroker:") and "no-such-topic" in lines[-1], audited.stderr
    assert "Traceback" not in audited.stderr


def test_settlement_totals_writes_under_the_data_dir_and_says_what(
    client: SyncClient, bootstrap: str, tmp_path: Path
) -> None:
    source, totals = new_topic(client, 2, "cli-settle"), new_topic(client, 1, "cli-totals")
    first = bootstrap.split(",", maxsplit=1)[0]
    generated = raftbroker("pipeline", "generate", "--topic", source, "--count", "120",
                           "--merchants", "6", "--rate", "0", "--bootstrap", first)  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    ran = raftbroker(
        "pipeline", "run", "settlement_totals", "--source", source, "--totals-topic", totals,
        "--available-now", "--bootstrap", first, "--data-dir", str(tmp_path),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    parquet = tmp_path / "settlement_totals" / "merchant-totals.parquet"
    assert f"parquet {parquet} (checkpoint {tmp_path / 'settlement_totals' / 'checkpoint'})" in (
        ran.stderr
    )
    assert ran.stdout.startswith("totals of 120 events over 6 merchants (")
    assert f"in parquet {parquet} and topic {totals}" in ran.stdout
    assert any(parquet.glob("*.parquet"))
    assert not (REPO / "merchant-totals.parquet").exists()  # never the current directory
