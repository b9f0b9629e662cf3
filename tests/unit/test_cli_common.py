"""The CLI's shared text: one error line out of whatever a command met, plurals."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.common import CliError, error_line, plural
from cli.main import app
from cluster.client import CallTimeoutError, ClientError
from statemachine.errors import ErrorCode


def test_an_error_inside_nested_exception_groups_is_one_line() -> None:
    inner = ClientError(ErrorCode.TOPIC_ALREADY_EXISTS, "topic 'x' already exists")
    group = ExceptionGroup("task group", [ExceptionGroup("inner", [inner]), ValueError("later")])
    assert error_line(group) == "topic 'x' already exists (TOPIC_ALREADY_EXISTS)"


def test_a_group_of_bugs_only_is_left_to_its_traceback() -> None:
    assert error_line(ExceptionGroup("task group", [ValueError("a bug")])) is None
    assert error_line(KeyError("a bug")) is None


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (CliError("topic orders has 3 partitions (0-2)"), "topic orders has 3 partitions (0-2)"),
        (
            ClientError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "t-9"),
            "UNKNOWN_TOPIC_OR_PARTITION: t-9",
        ),
        (ClientError(ErrorCode.NETWORK_EXCEPTION, "refused"), "cannot reach the cluster ("),
        (CallTimeoutError("no broker served Metadata", 2, None, unreachable=True), "cannot reach"),
        (TimeoutError(), "timed out"),
        (
            FileNotFoundError(2, "No such file or directory", "x.txt"),
            "No such file or directory: x.txt",
        ),
    ],
)
def test_each_kind_of_error_has_its_line(error: BaseException, line: str) -> None:
    found = error_line(error)
    assert found is not None
    assert found.startswith(line)
    assert "\n" not in found


def test_plurals() -> None:
    assert [plural(n, "record") for n in (0, 1, 2, 1000)] == [
        "0 records",
        "1 record",
        "2 records",
        "1,000 records",
    ]


def test_output_to_a_pipe_is_not_wrapped_at_80_columns() -> None:
    result = CliRunner().invoke(app, ["walkthrough"])
    assert result.exit_code == 0, result.output
    story = (
        "A producer sends a batch; it commits, but the acknowledgement is lost on the way back. "
        "The producer cannot tell a lost request from a lost reply"
    )
    assert any(story in line for line in result.output.splitlines())
    assert "log holds 2 records: the payment was recorded once" in result.output
