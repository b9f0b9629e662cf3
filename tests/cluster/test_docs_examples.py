"""README.md and compose/README.md cannot drift from the code: their code blocks run here.

Every fenced block of both files is either run, in the order a reader meets it, or listed in
`NOT_RUN` with the reason (a block added to a README is run unless someone says why not, and a
`NOT_RUN` entry that no longer matches a block fails). The runnable ones go through as written,
in a scratch directory, as a user following the README would run them: README's quick start
starts the cluster (`raftbroker cluster up --detach`, which takes the conventional ports, so the
Python examples' `127.0.0.2:9192` is that cluster, and the Kafka clients' `127.0.0.2:9092` its
Kafka listener), then the Kafka clients' examples, the Python client example, the Spark
example and the Spark jobs run against it. The only thing set around them is what a user's
shell would have: `.venv/` at hand for `source .venv/bin/activate` (and active in the blocks
after it, as in one shell session), and `RAFTBROKER_DATA_DIR` pointing at a scratch directory
instead of `~/.local/share/raftbroker`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.local import launcher
from tests.cluster.conftest import conventional_ports_held
from tests.cluster.procs import stop_recorded_cluster

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "compose/README.md")
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True)
class Block:
    doc: str
    line: int
    language: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.lstrip().splitlines()[0] if self.text.strip() else ""

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.first_line[:50]!r})"


# (document, start of its first line): why that block does not run here.
NOT_RUN = {
    ("README.md", "make demo"): "CI runs both commands itself (.ci/run); make demo is the main job",
    ("README.md", "node_id = 1"): "the configuration reference: test_config_reference.py reads it",
    ("README.md", "client (Producer"): "a diagram",
    ("README.md", "B=127.0.0.2:9092"): (
        "Kafka's distribution (bin/kafka-*.sh) is not installed here: test_kafka_tools.py runs "
        "each of these tools, as classes of kafka-tools, against a cluster"
    ),
    ("README.md", "make test "): "the test suite itself",
    ("README.md", "# Spark's Kafka connector, reading"): (
        "a third Spark JVM (about 20 s) in a run kept within its budget: "
        "tests/pipeline/test_kafka_connector.py runs the connector's reads and writes"
    ),
    ("README.md", "raftbroker chaos run --duration 600"): "10 minutes long (CI: tests/chaos)",
    ("README.md", "raftbroker pipeline run audit merchant-totals"): (
        "a third Spark job (20 s) in a run kept within its budget: tests/pipeline/test_jobs.py "
        "and test_cli.py run audit"
    ),
    ("compose/README.md", "# once: the cluster secret"): "docker compose: no Docker engine here",
    ("compose/README.md", 'dc="docker compose'): "docker compose: no Docker engine here",
    ("compose/README.md", "$dc exec raftbroker-1"): "docker compose: no Docker engine here",
    ("compose/README.md", "$dc exec -T raftbroker-1"): "docker compose: no Docker engine here",
    ("compose/README.md", "docker run --rm --network"): "docker: no Docker engine here",
    ("compose/README.md", "kcat -L -b 127.0.0.1:29092"): (
        "docker compose's published ports: test_compose.py runs these through them"
    ),
}


def blocks(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text()
    return [
        Block(doc, text[: m.start()].count("\n") + 1, m[1], m[2])
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    ]


def skip_reason(block: Block) -> str | None:
    for (doc, start), why in NOT_RUN.items():
        if doc == block.doc and block.first_line.startswith(start):
            return why
    return None


def runnable() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc) if skip_reason(b) is None]


def test_every_block_is_run_or_said_why_not() -> None:
    every = [b for doc in DOCS for b in blocks(doc)]
    for block in every:
        if skip_reason(block) is None:
            assert block.language in ("sh", "python"), f"{block}: neither run nor listed in NOT_RUN"
    for doc, start in NOT_RUN:
        assert any(b.doc == doc and b.first_line.startswith(start) for b in every), (
            f"NOT_RUN lists a block of {doc} starting {start!r} that is gone"
        )
    assert runnable()[0].first_line.startswith("source .venv/bin/activate"), (
        "README's quick start (which starts the cluster) must be the first block run"
    )


@pytest.fixture
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A user's working directory: `.venv` at hand, a data directory of its own; whatever
    cluster the examples start is stopped after."""
    directory = tmp_path_factory.mktemp("docs")
    (directory / ".venv").symlink_to(Path(sys.prefix))
    data_dir = directory / "data"
    with conventional_ports_held():  # no other test process starts a cluster on them meanwhile
        assert launcher.ports_free(3, launcher.CONVENTIONAL_PORTS), (
            f"the examples need ports {launcher.CONVENTIONAL_PORTS} free on 127.0.0.2-4 (a "
            "local cluster of yours holds them: stop it)"
        )
        try:
            yield directory
        finally:
            stop_recorded_cluster(data_dir)


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    # One shell session, as a reader's: the quick start's `source .venv/bin/activate` holds for
    # the blocks after it.
    venv = cwd / ".venv"
    env = {
        **os.environ,
        "RAFTBROKER_DATA_DIR": str(cwd / "data"),
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("RAFTBROKER_BOOTSTRAP", None)
    if block.language == "sh":
        command = ["bash", "-euo", "pipefail", "-c", block.text]
    else:
        command = [str(cwd / ".venv" / "bin" / "python"), "-c", block.text]
    return subprocess.run(
        command,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )


@pytest.mark.spark
def test_the_runnable_blocks_run_as_written(scratch: Path) -> None:
    for block in runnable():
        result = run_block(block, scratch)
        output = (
            f"{block}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-3000:]}"
        )
        assert result.returncode == 0, f"failed as written: {output}"
        assert "Traceback" not in result.stderr, f"a traceback: {output}"
        cluster = launcher.LocalCluster.load(scratch / "data")
        assert cluster is not None and cluster.bootstrap[0] == "127.0.0.2:9192", (
            f"the quick start's cluster is not where the examples look: {output}"
        )
        assert cluster.kafka_bootstrap[0] == "127.0.0.2:9092", (
            f"the quick start's Kafka listener is not where the examples look: {output}"
        )
        if "pipeline run settlement_totals" in block.text:
            check_settlement_outputs(scratch, result)
        if "orders-upper" in block.text:
            check_upper_cased(result)


def check_upper_cased(result: subprocess.CompletedProcess[str]) -> None:
    """The Spark example's streaming query wrote every order, upper-cased (issue 41: it read
    from the latest offsets, printed "1000 orders" and wrote nothing)."""
    read = re.search(r"^(\d+) orders$", result.stdout, re.M)
    written = re.search(r"^(\d+) orders upper-cased$", result.stdout, re.M)
    assert read is not None and written is not None, result.stdout
    assert int(read[1]) > 0
    assert written[1] == read[1], result.stdout


def check_settlement_outputs(scratch: Path, result: subprocess.CompletedProcess[str]) -> None:
    """settlement_totals writes under the data directory, never the working one, says where
    and what, and its stderr holds no Spark progress bars."""
    totals = scratch / "data" / "settlement_totals"
    parquet = totals / "merchant-totals.parquet"
    assert f"parquet {parquet} (checkpoint {totals / 'checkpoint'})" in result.stderr
    assert re.search(r"^totals of [\d,]+ events over \d+ merchants \(", result.stdout, re.M)
    assert f"in parquet {parquet} and topic merchant-totals" in result.stdout
    assert any(parquet.glob("*.parquet"))
    assert not any(scratch.glob("*.parquet")), "output in the working directory"
    assert "[Stage" not in result.stderr, "Spark's progress bars on stderr"
