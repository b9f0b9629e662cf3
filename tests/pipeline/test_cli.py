"""`raftbroker pipeline run`, run as a user runs it, on what README's example does not show:
a missing topic, and a streaming run stopped by Ctrl-C (under `-m slow`: a streaming Spark job
runs about 30 s; `.venv/bin/pytest -m slow tests/pipeline/test_cli.py`).

README's Spark jobs block (`pipeline generate`, `run settlement_totals --available-now`, `run
audit`) runs as written in tests/cluster/test_docs_examples.py, which also checks where
settlement_totals puts its output and what it says.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from cluster.client.sync import SyncClient
from tests.cluster.procs import REPO
from tests.cluster.test_cli import raftbroker as cli_run
from tests.cluster.test_cli import sigint_default
from tests.pipeline.conftest import new_topic
from tests.polling import poll_until

pytestmark = pytest.mark.spark
OUR_FRAME = re.compile(r'File ".*/(cli|pipeline|cluster)/')  # a traceback line in our code


def raftbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_run(*args, timeout_s=180)  # a Spark session starts in the command


def test_audit_of_a_missing_topic_is_one_line_and_exit_1(bootstrap: str) -> None:
    first = bootstrap.split(",", maxsplit=1)[0]
    audited = raftbroker("pipeline", "run", "audit", "no-such-topic", "--bootstrap", first)
    assert audited.returncode == 1
    lines = audited.stderr.strip().splitlines()
    assert lines[-1].startswith("raftbroker:") and "no-such-topic" in lines[-1], audited.stderr
    assert "Traceback" not in audited.stderr


@pytest.mark.slow  # 30 s of a streaming Spark job: within the default run's budget no more
@pytest.mark.parametrize(
    ("sig", "said"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")], ids=["int", "term"]
)
def test_a_streaming_settlement_run_stopped_by_a_signal_says_what_it_wrote(
    client: SyncClient, bootstrap: str, tmp_path: Path, sig: signal.Signals, said: str
) -> None:
    """Ctrl-C (SIGINT), or SIGTERM as `timeout`, systemd and `docker stop` send (issue 41: it
    ended the job without a word): the job stops between two waits and says what it wrote."""
    source, totals = new_topic(client, 2, "cli-settle"), new_topic(client, 1, "cli-totals")
    first = bootstrap.split(",", maxsplit=1)[0]
    generated = raftbroker("pipeline", "generate", "--topic", source, "--count", "120",
                           "--merchants", "6", "--rate", "0", "--bootstrap", first)  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    parquet = tmp_path / "settlement_totals" / "merchant-totals.parquet"
    streaming = subprocess.Popen(
        [sys.executable, "-m", "cli", "pipeline", "run", "settlement_totals", "--source", source,
         "--totals-topic", totals, "--bootstrap", first, "--data-dir", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_default,  # noqa: PLW1509 - Ctrl-C even in a run started in the background
    )  # fmt: skip
    try:
        poll_until(lambda: events_in(parquet) == 120, 120, "the totals of all 120 events")
        streaming.send_signal(sig)
        out, err = streaming.communicate(timeout=60)
    finally:
        if streaming.poll() is None:
            streaming.kill()
            streaming.wait()
    assert streaming.returncode == 128 + sig, err
    assert out.startswith(f"stopped ({said}): totals of 120 events over 6 merchants ("), out
    # No traceback of ours. (PySpark's accumulator server may print an EOFError of its own
    # while the session stops: its shutdown race, not this command's.)
    ours = [
        line for line in err.splitlines() if re.search(r'File ".*/(cli|pipeline|cluster)/', line)
    ]
    assert ours == [], err


def events_in(parquet: Path) -> int | None:
    """The events the totals table counts, or None while there is none to read."""
    import pyarrow.compute as pc  # noqa: PLC0415 - with PySpark, as this module
    import pyarrow.parquet as pq  # noqa: PLC0415

    if not any(parquet.glob("*.parquet")):
        return None
    try:
        events: int = pc.sum(pq.read_table(parquet)["events"]).as_py()
    except (OSError, KeyError):
        return None  # being rewritten: files or columns not all there yet
    return events
