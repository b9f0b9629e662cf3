"""How `raftbroker produce` turns lines into records: key separators (escapes, a missing or an
empty one), the null marker, headers."""

from __future__ import annotations

import pytest

from cli.common import CliError
from cli.record_lines import LineFormat, parse_headers, unescape


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
