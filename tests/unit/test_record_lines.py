"""How `raftbroker produce` turns lines into records (key separators: escapes, a missing or an
empty one; the null marker; headers) and `raftbroker consume` records into lines (the text
fields, null against empty, JSON), and where consume starts."""

from __future__ import annotations

import base64
import json

import pytest

from cli.common import CliError
from cli.consume_cmd import Start, parse_start
from cli.record_lines import LineFormat, TextFields, as_json, iso_ms, parse_headers, unescape
from cluster.client import ConsumedRecord, Consumer


@pytest.mark.parametrize(
    ("given", "meant"),
    [("\\t", "\t"), ("\\\\", "\\"), ("\\x1f", "\x1f"), ("\\u00e9", "é"), ("::", "::"), ("é", "é")],
)
def test_escapes_in_the_separator_mean_their_character(given: str, meant: str) -> None:
    assert unescape(given, "--key-separator") == meant


@pytest.mark.parametrize("given", ["\\q", "\\", "\\x1", "a\\n"])
def test_an_unknown_escape_is_refused_naming_the_option(given: str) -> None:
    with pytest.raises(CliError, match="--key-separator: unknown escape"):
        unescape(given, "--key-separator")


def test_a_line_splits_at_the_first_separator() -> None:
    lines = LineFormat.of("\\t", None)
    assert lines.split(b"k\tv\tw", "line 1") == (b"k", b"v\tw")
    assert lines.split(b"\tv", "line 1") == (b"", b"v")  # an empty key is not a null one


def test_a_line_without_the_separator_is_an_error_naming_it() -> None:
    with pytest.raises(CliError) as refused:
        LineFormat.of(",", None).split(b"no separator here", "line 7 of stdin")
    assert str(refused.value) == "line 7 of stdin has no key separator ',': 'no separator here'"


def test_a_long_line_is_shown_cut() -> None:
    with pytest.raises(CliError, match=r"'xxxxxxxxxx+\.\.\.'$"):
        LineFormat.of(",", None).split(b"x" * 10_000, "line 1")


def test_an_empty_separator_is_refused() -> None:
    with pytest.raises(CliError, match="--key-separator must not be empty"):
        LineFormat.of("", None)


def test_the_null_marker_makes_a_key_or_value_null() -> None:
    keyed = LineFormat.of(",", "NULL")
    assert keyed.split(b"k,NULL", "line 1") == (b"k", None)
    assert keyed.split(b"NULL,v", "line 1") == (None, b"v")
    assert keyed.split(b"k,NULLS", "line 1") == (b"k", b"NULLS")
    assert LineFormat.of(None, "NULL").split(b"NULL", "line 1") == (None, None)
    assert LineFormat.of(None, None).split(b"", "line 1") == (None, b"")


def test_headers_keep_their_order_and_split_at_the_first_equals() -> None:
    assert parse_headers(["a=1", "b=x=y", "a=", "c=é"]) == (
        ("a", b"1"),
        ("b", b"x=y"),
        ("a", b""),
        ("c", "é".encode()),
    )


@pytest.mark.parametrize("bad", ["novalue", "=v"])
def test_a_header_without_a_name_or_equals_is_refused(bad: str) -> None:
    with pytest.raises(CliError, match="is not NAME=VALUE"):
        parse_headers([bad])


def test_more_headers_than_a_record_holds_are_refused() -> None:
    with pytest.raises(CliError, match="at most 64 headers"):
        parse_headers([f"h{i}=v" for i in range(65)])


def consumed(
    key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()
) -> ConsumedRecord:
    return ConsumedRecord("t", 2, 7, 1_795_000_000_123, 0, key, value, headers, 5, 0, 3)


def test_iso_timestamps_are_utc_with_milliseconds() -> None:
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1_795_000_000_123) == "2026-11-18T11:06:40.123Z"


def test_text_fields_come_in_kafka_console_consumer_order() -> None:
    every = TextFields(timestamp=True, partition=True, offset=True, headers=True, key=True)
    line = every.render(consumed(b"k", b"v", (("a", b"1"), ("b", b"2"))))
    assert line == "CreateTime:2026-11-18T11:06:40.123Z\tPartition:2\tOffset:7\ta=1,b=2\tk\tv"
    assert TextFields().render(consumed(b"k", b"v")) == "v"
    assert TextFields(headers=True).render(consumed(None, b"v")) == "NO_HEADERS\tv"


def test_a_null_key_or_value_prints_as_the_null_literal_an_empty_one_as_nothing() -> None:
    keyed = TextFields(key=True)
    assert keyed.render(consumed(None, None)) == "null\tnull"
    assert keyed.render(consumed(b"", b"")) == "\t"
    assert TextFields(key=True, null_literal="<none>").render(consumed(None, b"v")) == "<none>\tv"


def test_json_has_every_field_and_base64_for_what_is_not_utf8() -> None:
    obj = json.loads(as_json(consumed(b"\xff\xfe", "é".encode(), (("h", b"x"),))))
    assert obj == {
        "topic": "t",
        "partition": 2,
        "offset": 7,
        "timestamp": 1_795_000_000_123,
        "key_base64": base64.b64encode(b"\xff\xfe").decode(),
        "value": "é",
        "headers": {"h": "x"},
        "producer_id": 5,
        "sequence": 3,
    }
    assert json.loads(as_json(consumed(None, None)))["key"] is None


@pytest.mark.parametrize(
    ("from_beginning", "offset", "start"),
    [
        (False, None, Start(Consumer.LATEST)),
        (True, None, Start(Consumer.EARLIEST)),
        (False, "earliest", Start(Consumer.EARLIEST)),
        (False, "beginning", Start(Consumer.EARLIEST)),  # kcat's words
        (False, "LATEST", Start(Consumer.LATEST)),
        (False, "end", Start(Consumer.LATEST)),
        (False, "stored", Start(Consumer.LATEST)),  # a group member's start: its commits
        (True, "stored", Start(Consumer.EARLIEST)),  # and where it has none, the first
        (False, "-10", Start(back=10)),
        (False, "5", Start(5)),  # of every partition read, as kcat's -o 5
        (False, "0", Start(0)),
        (False, "s@1700000000000", Start(time_ms=1_700_000_000_000)),  # kcat's -o s@TIME
        (False, "s@2023-11-14T22:13:20Z", Start(time_ms=1_700_000_000_000)),
    ],
)
def test_where_consume_starts(from_beginning: bool, offset: str | None, start: Start) -> None:
    assert parse_start(from_beginning, offset) == start


@pytest.mark.parametrize(
    ("from_beginning", "offset", "says"),
    [
        (False, "soon", "is not N, -N, earliest/beginning, latest/end, stored"),
        (True, "-3", "use --from-beginning or --offset, not both"),
        (False, "s@never", "is neither ms since the epoch nor an ISO 8601 time"),
    ],
)
def test_starts_that_mean_nothing_are_refused(from_beginning: bool, offset: str, says: str) -> None:
    with pytest.raises(CliError, match=says):
        parse_start(from_beginning, offset)
