"""Option parsing and offset arithmetic: no Spark, no cluster."""

from __future__ import annotations

import itertools
import re
from collections import UserDict

import pytest

from pipeline.offsets import OffsetRange, from_json, rate_limit, split_ranges, to_json
from pipeline.options import (
    EARLIEST,
    LATEST,
    OptionError,
    option,
    parse_read_options,
    parse_write_options,
)

BOOT = {"raftbroker.bootstrap.servers": "127.0.0.2:9092,127.0.0.3:9092"}


class LowerCaseDict(UserDict[str, str]):
    """What Spark hands a data source: keys lower-cased, looked up case-insensitively."""

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key.lower(), value)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


def read(streaming: bool = False, **options: str) -> object:
    return parse_read_options({**BOOT, **options}, streaming=streaming)


def test_keys_are_found_whatever_their_case() -> None:
    spark_like = LowerCaseDict({**BOOT, "startingOffsets": "earliest", "subscribe": "a"})
    assert option(spark_like, "startingOffsets") == "earliest"
    lowered = {"startingoffsets": "latest"}  # a plain dict Spark already lower-cased
    assert option(lowered, "startingOffsets") == "latest"
    parsed = parse_read_options(
        LowerCaseDict({**BOOT, "subscribe": "a", "maxOffsetsPerTrigger": "7"}), streaming=True
    )
    assert parsed.max_offsets_per_trigger == 7


def test_defaults_follow_the_kafka_connector() -> None:
    batch = parse_read_options({**BOOT, "subscribe": "a, b"}, streaming=False)
    assert batch.subscription.topics == ("a", "b")
    assert (batch.starting.default, batch.ending.default) == (EARLIEST, LATEST)
    assert batch.fail_on_data_loss and not batch.include_headers
    stream = parse_read_options({**BOOT, "subscribe": "a"}, streaming=True)
    assert stream.starting.default == LATEST


def test_offsets_json_and_assign() -> None:
    parsed = parse_read_options(
        {
            **BOOT,
            "assign": '{"a": [1, 0]}',
            "startingOffsets": '{"a": {"0": 5, "1": -2}}',
            "endingOffsets": '{"a": {"0": -1, "1": 9}}',
        },
        streaming=False,
    )
    assert parsed.subscription.assigned == (("a", 0), ("a", 1))
    assert parsed.starting.as_dict() == {("a", 0): 5, ("a", 1): EARLIEST}
    assert parsed.ending.as_dict() == {("a", 0): LATEST, ("a", 1): 9}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "a", "raftbroker.bootstrap.servers": ""}, "is required"),
        ({"subscribe": "a", "raftbroker.bootstrap.servers": "nohost"}, "is not host:port"),
        ({}, "exactly one of subscribe, subscribePattern, assign is needed (none)"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "(subscribe, assign)"),
        ({"subscribePattern": "(["}, "is not a regular expression"),
        ({"assign": "[0, 1]"}, "assign: expected a JSON object"),
        ({"assign": '{"a": [-1]}'}, "is not an int >= 0"),
        ({"subscribe": "a", "startingOffsets": "{oops"}, "startingOffsets: not valid JSON"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "not allowed in a batch read"),
        ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, "offset -2 (earliest)"),
        ({"subscribe": "a", "startingOffsets": '{"b": {"0": 1}}'}, "topics that are not read: b"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"x": 1}}'}, "partition 'x'"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, "offset -3"),
        ({"assign": '{"a": [0]}', "endingOffsets": '{"a": {"1": 4}}'}, "not assigned"),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions: must be a positive"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "ten"}, "is not an integer"),
        ({"subscribe": "a", "failOnDataLoss": "yes"}, "expected true or false"),
        ({"subscribe": "a", "maxTriggerDelay": "soon"}, "is not a duration"),
        (
            {"subscribe": "a", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "9"},
            "larger than maxOffsetsPerTrigger",
        ),
    ],
)
def test_bad_read_options_are_named(options: dict[str, str], message: str) -> None:
    merged = {**BOOT, **options}
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_read_options(merged, streaming=False)


def test_streaming_refuses_ending_offsets() -> None:
    with pytest.raises(OptionError, match="endingOffsets is not allowed in a streaming read"):
        read(streaming=True, subscribe="a", endingOffsets="latest")


def test_write_options() -> None:
    assert parse_write_options({**BOOT, "topic": " out "}).topic == "out"
    assert parse_write_options(BOOT).topic is None
    with pytest.raises(OptionError, match="topic must not be empty"):
        parse_write_options({**BOOT, "topic": " "})


def test_offsets_serialise_canonically() -> None:
    offsets = {("b", 10): 1, ("a", 2): 5, ("b", 9): 3}
    as_json = to_json(offsets)
    assert list(as_json) == ["a", "b"] and list(as_json["b"]) == ["9", "10"]
    assert from_json(as_json) == offsets


def test_rate_limit_admits_exactly_the_budget() -> None:
    start = {("a", 0): 0, ("a", 1): 10, ("a", 2): 0}
    latest = {("a", 0): 7, ("a", 1): 13, ("a", 2): 0}
    end = rate_limit(start, latest, 4)
    assert sum(end[tp] - start[tp] for tp in start) == 4
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)
    assert rate_limit(start, latest, 4) == end  # deterministic: a replay plans the same
    assert rate_limit(start, latest, 100) == latest


def test_split_ranges_honours_min_partitions() -> None:
    ranges = [OffsetRange("a", 0, 0, 90), OffsetRange("a", 1, 5, 15), OffsetRange("a", 2, 3, 3)]
    split = split_ranges(ranges, 5)
    assert len(split) >= 5
    assert all(r.size > 0 for r in split)
    for partition, lo, hi in ((0, 0, 90), (1, 5, 15)):
        pieces = sorted((r.start, r.end) for r in split if r.partition == partition)
        assert pieces[0][0] == lo and pieces[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert split_ranges(ranges, None) == ranges[:2]  # empty ranges dropped
