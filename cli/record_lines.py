r"""How a line of input becomes a record (`raftbroker produce`), and a record a line of
output (`raftbroker consume`).

Input rules (as Kafka's console producer where it has one):
- with a key separator, a line is KEY<SEP>VALUE split at the first SEP, and a line without SEP
  is an error naming its line number (`parse.key` with `key.separator`); an empty separator is
  refused; `\t`, `\\`, `\xHH` and `\uHHHH` in it mean their character (the shell passes them
  as two characters);
- a key or value equal to the null marker is produced as null (`null.marker`): a null value
  is a tombstone;
- headers (`--header k=v`, as kcat's `-H`) are the same on every record.
Errors are `CliError`s: one line, naming the option or the line.

Output rules: text is the value, after the fields asked for, tab-separated, in the order of
Kafka's console consumer (`print.timestamp`, `print.partition`, `print.offset`,
`print.headers`, `print.key`): `CreateTime:<ISO 8601 UTC>`, `Partition:N`, `Offset:N`,
`name=value,...` (`NO_HEADERS`), key. A null key or value prints as the null literal (`null`,
as `null.literal`), so a null key is told from an empty one. JSON is one object per record; a
key or value that is not UTF-8 comes as `key_base64` / `value_base64`.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from cli.common import CliError
from cluster.client import ConsumedRecord
from statemachine.limits import DEFAULT_LIMITS

_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|.?)", re.DOTALL)
_SIMPLE_ESCAPES = {"t": "\t", "\\": "\\"}
PREVIEW_CHARS = 40


def unescape(text: str, option: str) -> str:
    r"""`text` with `\t`, `\\`, `\xHH`, `\uHHHH` replaced by their character."""

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[code]
        if len(code) > 1:
            return chr(int(code[1:], 16))
        raise CliError(f"{option}: unknown escape '{match.group(0)}' (use \\t, \\\\, \\xHH)")

    return _ESCAPE.sub(one, text)


def parse_headers(pairs: list[str]) -> tuple[tuple[str, bytes], ...]:
    """`--header k=v` options as record headers, in their order (a name may repeat)."""
    if len(pairs) > DEFAULT_LIMITS.record_headers_max:
        raise CliError(f"at most {DEFAULT_LIMITS.record_headers_max} headers per record")
    headers = []
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise CliError(f"--header {pair!r} is not NAME=VALUE")
        headers.append((name, value.encode()))
    return tuple(headers)


def preview(line: bytes) -> str:
    """The start of a line, for an error message."""
    text = line[: PREVIEW_CHARS * 4].decode("utf-8", errors="replace")
    return repr(text[:PREVIEW_CHARS] + ("..." if len(text) > PREVIEW_CHARS else ""))


@dataclass(frozen=True, slots=True)
class LineFormat:
    """How a line splits into a key and a value (see the module's rules)."""

    separator: bytes | None = None
    null_marker: bytes | None = None

    @classmethod
    def of(cls, key_separator: str | None, null_marker: str | None) -> LineFormat:
        if key_separator == "":
            raise CliError("--key-separator must not be empty (leave it out for no keys)")
        separator = None if key_separator is None else unescape(key_separator, "--key-separator")
        return cls(
            None if separator is None else separator.encode(),
            None if null_marker is None else null_marker.encode(),
        )

    def split(self, line: bytes, where: str) -> tuple[bytes | None, bytes | None]:
        """(key, value) of `line`; a CliError naming `where` if it lacks the separator."""
        if self.separator is None:
            return None, self._nullable(line)
        key, found, value = line.partition(self.separator)
        if not found:
            shown = self.separator.decode()
            raise CliError(f"{where} has no key separator {shown!r}: {preview(line)}")
        return self._nullable(key), self._nullable(value)

    def _nullable(self, data: bytes) -> bytes | None:
        return None if data == self.null_marker else data


def iso_ms(timestamp_ms: int) -> str:
    """`2026-11-24T09:30:00.123Z`: a record's timestamp as people read it (UTC)."""
    stamp = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class TextFields:
    """Which fields a text line shows before the value (see the module's output rules)."""

    timestamp: bool = False
    partition: bool = False
    offset: bool = False
    headers: bool = False
    key: bool = False
    null_literal: str = "null"

    def render(self, r: ConsumedRecord) -> str:
        fields = []
        if self.timestamp:
            fields.append(f"CreateTime:{iso_ms(r.timestamp_ms)}")
        if self.partition:
            fields.append(f"Partition:{r.partition}")
        if self.offset:
            fields.append(f"Offset:{r.offset}")
        if self.headers:
            fields.append(",".join(f"{k}={self._text(v)}" for k, v in r.headers) or "NO_HEADERS")
        if self.key:
            fields.append(self._text(r.key))
        fields.append(self._text(r.value))
        return "\t".join(fields)

    def _text(self, data: bytes | None) -> str:
        return self.null_literal if data is None else data.decode("utf-8", errors="replace")


def _json_bytes(name: str, data: bytes | None) -> dict[str, object]:
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode()}


def as_json(r: ConsumedRecord) -> str:
    obj: dict[str, object] = {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp_ms,
    }
    obj |= _json_bytes("key", r.key) | _json_bytes("value", r.value)
    obj["headers"] = {
        k: None if v is None else v.decode("utf-8", errors="replace") for k, v in r.headers
    }
    obj["producer_id"], obj["sequence"] = r.producer_id, r.sequence
    return json.dumps(obj)
