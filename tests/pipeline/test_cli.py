"""`raftbroker pipeline generate` and `raftbroker pipeline run audit`, run as a user runs them."""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("pyspark")

from cluster.client.sync import SyncClient
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
