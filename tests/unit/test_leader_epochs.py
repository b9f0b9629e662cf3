"""The leader epochs of a partition (statemachine/leader_epochs.py) and what apply records in
them: OffsetForLeaderEpoch's answers as Kafka's leader-epoch cache gives them."""

from __future__ import annotations

import pytest

from statemachine.commands import AdvanceLogStart, AppendBatch
from statemachine.leader_epochs import LeaderEpochs
from statemachine.limits import StateLimits
from statemachine.partition import Appended, PartitionStateMachine
from tests.builders import plain_batch

UNDEFINED = (-1, -1)


def epochs_of(*pairs: tuple[int, int], epochs_max: int = 16) -> LeaderEpochs:
    epochs = LeaderEpochs(epochs_max)
    for epoch, start in pairs:
        epochs.appended(epoch, start)
    return epochs


def test_an_epoch_ends_where_the_next_one_with_records_begins() -> None:
    epochs = epochs_of((2, 0), (4, 10), (7, 25))
    log_end, current = 40, 9
    assert epochs.end_offset(2, current, log_end) == (2, 10)
    assert epochs.end_offset(3, current, log_end) == (2, 10), "no records: the one before"
    assert epochs.end_offset(4, current, log_end) == (4, 25)
    assert epochs.end_offset(7, current, log_end) == (7, 40), "the latest runs to the log end"
    assert epochs.end_offset(8, current, log_end) == (7, 40)
    assert epochs.end_offset(9, current, log_end) == (9, 40), "the current term, no records yet"


def test_an_epoch_before_every_known_one_ends_at_the_first_known_start() -> None:
    # Kafka's rule for an epoch whose records retention removed: the start of the first one
    # known, never an offset before a reader's position.
    assert epochs_of((3, 100), (5, 120)).end_offset(1, 5, 150) == (1, 100)


def test_undefined_and_future_epochs_are_answered_undefined() -> None:
    epochs = epochs_of((2, 0))
    assert epochs.end_offset(-1, 2, 10) == UNDEFINED
    assert epochs.end_offset(3, 2, 10) == UNDEFINED, "after the leader's own term"


def test_a_partition_without_records_answers_the_log_end() -> None:
    assert LeaderEpochs(4).end_offset(1, 3, 0) == (1, 0)
    assert LeaderEpochs(4).end_offset(3, 3, 0) == (3, 0)


def test_the_epoch_at_an_offset_is_the_one_whose_records_hold_it() -> None:
    epochs = epochs_of((2, 5), (4, 10), (7, 25))
    assert [epochs.epoch_at(o) for o in (5, 9, 10, 24, 25, 1_000)] == [2, 2, 4, 4, 7, 7]
    assert epochs.epoch_at(4) == -1, "before the first known epoch"
    assert epochs.epoch_at(-1) == -1
    assert LeaderEpochs(4).epoch_at(0) == -1, "no epoch known"


def test_a_lower_epoch_never_reorders_the_list() -> None:
    epochs = epochs_of((5, 0), (3, 10), (5, 12))
    assert epochs.to_data() == [[5, 0]]


def test_moving_the_log_start_keeps_the_epoch_that_holds_it() -> None:
    epochs = epochs_of((2, 0), (4, 10), (7, 25))
    epochs.start_moved(12)
    assert epochs.to_data() == [[4, 12], [7, 25]]
    epochs.start_moved(25)
    assert epochs.to_data() == [[7, 25]]


def test_the_oldest_epoch_goes_when_the_list_is_full() -> None:
    epochs = epochs_of((1, 0), (2, 5), (3, 9), epochs_max=2)
    assert epochs.to_data() == [[2, 5], [3, 9]]
    # Epoch 1's true end is 5; the answer is later than that, never earlier.
    assert epochs.end_offset(1, 3, 20) == (1, 5)


def test_apply_records_each_terms_first_offset_and_storage_gets_the_term() -> None:
    machine = PartitionStateMachine()
    first = machine.apply(AppendBatch(1, plain_batch(3)).encode(), 4)
    machine.apply(AppendBatch(2, plain_batch(2)).encode(), 4)
    third = machine.apply(AppendBatch(3, plain_batch(1)).encode(), 6)
    assert isinstance(first, Appended) and first.leader_epoch == 4
    assert isinstance(third, Appended) and third.leader_epoch == 6
    assert machine.epochs.to_data() == [[4, 0], [6, 5]]
    assert machine.epochs.end_offset(4, 6, machine.log_end_offset) == (4, 5)
    machine.apply(AdvanceLogStart(5).encode(), 6)
    assert machine.epochs.to_data() == [[6, 5]]


def test_the_epochs_survive_a_snapshot() -> None:
    machine = PartitionStateMachine()
    for term in (1, 1, 3, 8):
        machine.apply(AppendBatch(term, plain_batch(2)).encode(), term)
    restored = PartitionStateMachine.restore(machine.snapshot())
    assert restored.epochs.to_data() == machine.epochs.to_data() == [[1, 0], [3, 4], [8, 6]]
    assert restored.snapshot() == machine.snapshot()


@pytest.mark.parametrize("data", [[[2, 0], [2, 5]], [[3, 0], [1, 5]], [["x", 0]], [[1]], 7])
def test_a_snapshot_with_malformed_epochs_is_refused(data: object) -> None:
    with pytest.raises(ValueError, match="leader epochs"):
        LeaderEpochs.from_data(data, StateLimits().leader_epochs_per_partition_max)
