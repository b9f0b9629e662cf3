"""Kafka's rule for a hanging transaction (FindHangingTransactions), as `raftbroker
transactions find-hanging` applies it: open on a partition past the largest transaction timeout,
and not held open there by its coordinator."""

from __future__ import annotations

from dataclasses import replace

from cluster import native as p
from cluster.client.txn_admin import OpenTxn, hanging_reason
from statemachine.errors import ErrorCode


def test_a_hanging_transaction_is_one_its_coordinator_does_not_hold_open_there() -> None:
    txn = OpenTxn("t", 0, producer_id=7, producer_epoch=2, coordinator_epoch=1, start_offset=5,
                  last_timestamp_ms=1_000)  # fmt: skip
    held = p.DescribedTxn(
        "id", ErrorCode.NONE, "Ongoing", 60_000, 900, 7, 2, (p.TxnPartition("t", 0),)
    )
    old, young = 1_000 + 61_000, 1_000 + 59_000
    assert hanging_reason(txn, held, young, 60_000) is None  # too young to tell
    assert hanging_reason(txn, held, old, 60_000) is None  # its coordinator holds it
    assert hanging_reason(txn, None, old, 60_000) == "no coordinator knows its producer"
    for other, why in (
        (replace(held, state="CompleteAbort"), "its coordinator has it CompleteAbort"),
        (replace(held, producer_epoch=3), "its coordinator is at epoch 3"),
        (
            replace(held, partitions=()),
            "its coordinator's transaction does not hold this partition",
        ),
    ):
        assert hanging_reason(txn, other, old, 60_000) == why
