"""The helpers written once for everyone: host:port parsing, the wall clock, positive-integer
settings, and the one error type with its retriability and leader hint."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from cluster.addresses import join_address, parse_address
from cluster.clock import wall_ms
from cluster.config import ConfigError, Limits, Timing
from cluster.errors import RaftbrokerError, RequestRefusedError
from pipeline.options import OptionError, parse_write_options
from statemachine.errors import ErrorCode
from statemachine.fields import check_positive_ints
from statemachine.limits import StateLimits

# -- host:port ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:9092", ("127.0.0.1", 9092)),
        ("broker-1.example.com:1", ("broker-1.example.com", 1)),
        (" localhost:65535 ", ("localhost", 65_535)),
        ("[::1]:9092", ("::1", 9092)),
        ("[fe80::1%eth0]:19092", ("fe80::1%eth0", 19_092)),
    ],
)
def test_an_address_parses_to_host_and_port(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text) == address
    assert parse_address(join_address(*address)) == address  # and reads back as written


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("localhost", id="no-port"),
        pytest.param("localhost:", id="empty-port"),
        pytest.param(":9092", id="no-host"),
        pytest.param("[]:9092", id="empty-brackets"),
        pytest.param("host:0", id="port-0"),
        pytest.param("host:65536", id="port-65536"),
        pytest.param("host:-1", id="negative-port"),
        pytest.param("host:+80", id="signed-port"),
        pytest.param("host:80a", id="junk-port"),
        pytest.param("host:\u0663", id="non-ascii-digit"),
        pytest.param("::1:9092", id="ipv6-without-brackets"),
        pytest.param("host:12:34", id="two-ports"),
        pytest.param("[::1]", id="ipv6-no-port"),
        pytest.param("a host:80", id="space-in-host"),
        pytest.param("", id="empty"),
        pytest.param("not-an-address", id="junk"),
    ],
)
def test_anything_else_is_a_value_error_quoting_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not host:port") as info:
        parse_address(text)
    assert f"'{text}'" in str(info.value)


def test_an_ipv6_host_is_joined_in_brackets() -> None:
    assert join_address("::1", 9092) == "[::1]:9092"
    assert join_address("10.0.0.1", 9092) == "10.0.0.1:9092"


def test_callers_keep_their_own_message_shape() -> None:
    """The pipeline option names the option; the parser's ValueError does not leak through."""
    with pytest.raises(OptionError, match=r"^option 'raftbroker.bootstrap.servers': 'h:0' is not"):
        parse_write_options({"raftbroker.bootstrap.servers": "ok:1, h:0"})
    written = parse_write_options({"raftbroker.bootstrap.servers": "[::1]:9092"})
    assert written.bootstrap == ("[::1]:9092",)


# -- the wall clock -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now_ns", "expected_ms"),
    [
        (1_764_000_000_123_999_999, 1_764_000_000_123),  # floored, never rounded up
        (1_764_000_000_124_000_000, 1_764_000_000_124),
        (999_999, 0),
    ],
)
def test_wall_ms_is_the_epoch_in_whole_milliseconds(
    monkeypatch: pytest.MonkeyPatch, now_ns: int, expected_ms: int
) -> None:
    """The system clock is driven here: a real one may step back at any time (NTP), so a test
    of its order would be flaky (issue 35). What wall_ms owns is the conversion."""
    monkeypatch.setattr(time, "time_ns", lambda: now_ns)
    stamp = wall_ms()
    assert type(stamp) is int
    assert stamp == expected_ms


# -- positive integers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    a_bytes: int = 1
    b_count: int = 2


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "1", None])
def test_every_field_must_be_a_positive_int(bad: object) -> None:
    check_positive_ints(Sizes())
    with pytest.raises(ValueError, match=r"^Sizes\.b_count must be a positive integer, not "):
        check_positive_ints(Sizes(b_count=bad))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Sizes\.a_bytes"):
        check_positive_ints(Sizes(a_bytes=bad), ConfigError)  # type: ignore[arg-type]


def test_node_and_state_limits_use_it() -> None:
    with pytest.raises(ConfigError, match=r"Limits\.connections_max must be a positive integer"):
        Limits(connections_max=0)
    with pytest.raises(ConfigError, match=r"Timing\.heartbeat_ms must be a positive integer"):
        Timing(heartbeat_ms=True)
    with pytest.raises(ValueError, match=r"StateLimits\.topics_max must be a positive integer"):
        StateLimits(topics_max=-5)


# -- the one error type ---------------------------------------------------------------------------


def test_an_error_carries_its_code_retriability_and_leader_hint() -> None:
    moved = RequestRefusedError(ErrorCode.NOT_LEADER_OR_FOLLOWER, leader="10.0.0.2:9092")
    assert isinstance(moved, RaftbrokerError)
    assert (moved.error, moved.retriable, moved.leader) == (
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        True,
        "10.0.0.2:9092",
    )
    assert (moved.message, str(moved)) == ("NOT_LEADER_OR_FOLLOWER", "NOT_LEADER_OR_FOLLOWER")
    bad = RequestRefusedError(ErrorCode.INVALID_TOPIC_EXCEPTION, "name too long")
    assert (bad.retriable, bad.leader, bad.message) == (False, "", "name too long")
    assert str(bad) == "INVALID_TOPIC_EXCEPTION: name too long"
