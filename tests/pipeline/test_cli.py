"""`raftbroker pipeline run`, run as a user runs it, on what README's example does not show.

README's Spark jobs block (`pipeline generate`, `run settlement_totals`, `run audit`) runs as
written in tests/cluster/test_docs_examples.py, which also checks where settlement_totals puts
its output and what it says.
"""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("pyspark")

from tests.cluster.test_cli import raftbroker as cli_run

pytestmark = pytest.mark.spark
EVENT_ID = "get_json_object(CAST(value AS STRING), '$.event_id')"


def raftbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_run(*args, timeout_s=180)  # a Spark session starts in the command


def test_audit_of_a_missing_topic_is_one_line_and_exit_1(bootstrap: str) -> None:
    first = bootstrap.split(",", maxsplit=1)[0]
    audited = raftbroker("pipeline", "run", "audit", "no-such-topic", "--bootstrap", first)
    assert audited.returncode == 1
    lines = audited.stderr.strip().splitlines()
    assert lines[-1].startswith("raftbroker:") and "no-such-topic" in lines[-1], audited.stderr
    assert "Traceback" not in audited.stderr
