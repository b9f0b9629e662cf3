"""PartitionStore on real files in a temporary directory: appends, reads, rolls, replay,
truncation, retention, and reads between every kind of change (recovery from a torn tail:
test_storage_recovery.py).

Segments are kept tiny (a few batches each) so that every test crosses segment boundaries.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.broker.storage import (
    StorageError,
    StorageGapError,
    StoredBatch,
    segment_file_name,
)
from statemachine.errors import ErrorCode
from tests.component.stores import (
    INDEX_INTERVAL,
    SEGMENT_BYTES,
    as_stored,
    encoded,
    fill,
    frame_bytes,
    open_store,
    read_all,
    segment_files,
)

# -- append and read ----------------------------------------------------------------------------


@pytest.mark.parametrize("index_interval", [1, INDEX_INTERVAL, 1 << 20])
def test_round_trip_across_segment_rolls(tmp_path: Path, index_interval: int) -> None:
    with open_store(tmp_path, index_interval_bytes=index_interval) as store:
        batches = fill(store, 40)
        assert store.next_offset == 120
        assert store.size_bytes == sum(frame_bytes(b) for b in batches)
        assert read_all(store) == batches
        for batch in batches:
            assert store.read(batch.base_offset, 0) == [batch]
    files = segment_files(tmp_path)
    assert len(files) > 5
    assert files[0].name == "00000000000000000000.log"
    assert all(len(f.stem) == 20 for f in files)
    assert all(f.stat().st_size <= SEGMENT_BYTES for f in files)
    assert sum(f.stat().st_size for f in files) == store.size_bytes


def test_a_read_need_not_give_a_batch_beyond_its_budget(tmp_path: Path) -> None:
    # A fetch's later partitions: only whole batches within what is left of the budget.
    with open_store(tmp_path) as store:
        batches = fill(store, 10)
        size = len(batches[0].batch)
        assert store.read(0, size - 1, at_least_one=False) == []
        assert store.read(0, 0, at_least_one=False) == []
        assert store.read(0, size, at_least_one=False) == batches[:1]
        assert store.read(0, 3 * size + 1, at_least_one=False) == batches[:3]
        assert store.read(0, 1) == batches[:1]


def test_segment_names_are_base_offsets(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 20)
    bases = [int(f.stem) for f in segment_files(tmp_path)]
    assert bases == sorted(bases)
    assert set(bases) <= {b.base_offset for b in batches}
    assert segment_file_name(42) == "00000000000000000042.log"


def test_read_from_the_middle_of_a_batch_returns_that_batch(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 12, records=5)
        for batch in batches:
            for offset in range(batch.base_offset, batch.next_offset):
                got = store.read(offset, 1 << 20)
                assert got[0] == batch
                assert got == batches[batches.index(batch) :]


def test_max_bytes_is_honoured_but_one_batch_always_served(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 10)
        size = len(batches[0].batch)
        assert store.read(0, 0) == batches[:1]
        assert store.read(0, 1) == batches[:1]
        assert store.read(0, 2 * size) == batches[:2]
        assert store.read(0, 2 * size + size - 1) == batches[:2]
        assert store.read(3, 3 * size) == batches[1:4]
        with pytest.raises(ValueError, match="negative"):
            store.read(0, -1)


def test_an_oversize_batch_gets_its_own_segment_and_is_served(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        fill(store, 2)
        big = as_stored(store.next_offset, 2, 5, encoded(99, records=2, value_bytes=3_000))
        store.append(*big)
        after = fill(store, 2, first=100)
        assert len(big.batch) > SEGMENT_BYTES
        assert store.read(big.base_offset, 10) == [big]
        assert store.read(big.base_offset + 1, 1 << 20) == [big, *after]
    assert (tmp_path / segment_file_name(big.base_offset)).stat().st_size == frame_bytes(big)


def test_offsets_outside_the_log_read_nothing(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        assert store.read(0, 1_000) == []
        fill(store, 3)
        assert store.read(9, 1_000) == []
        assert store.read(100, 1_000) == []
        assert store.read(-1, 1_000) == []


# -- replay, divergence, gaps -------------------------------------------------------------------


def test_replaying_identical_appends_is_a_no_op(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 20)
    sizes = [f.stat().st_size for f in segment_files(tmp_path)]
    with open_store(tmp_path) as store:
        for batch in batches:
            store.append(*batch)
        assert store.next_offset == batches[-1].next_offset
        assert read_all(store) == batches
    assert [f.stat().st_size for f in segment_files(tmp_path)] == sizes


def test_a_differing_append_below_the_end_truncates_and_appends(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 20)
        files_before = len(segment_files(tmp_path))
        changed = as_stored(batches[5].base_offset, 2, 77, encoded(5, records=2, version=1))
        store.append(*changed)
        assert store.next_offset == changed.next_offset
        assert read_all(store) == [*batches[:5], changed]
        assert len(segment_files(tmp_path)) < files_before
        assert store.size_bytes == sum(f.stat().st_size for f in segment_files(tmp_path))
        more = fill(store, 2, first=50)
    with open_store(tmp_path) as store:
        assert read_all(store) == [*batches[:5], changed, *more]


def test_an_append_past_the_end_is_a_gap(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        fill(store, 2)
        with pytest.raises(StorageGapError, match="at offset 7 but the log ends at 6") as info:
            store.append(7, 1, 1, encoded(9, records=1))
        assert store.next_offset == 6
    assert (info.value.error, info.value.retriable) == (ErrorCode.KAFKA_STORAGE_ERROR, True)


def test_a_diverged_append_inside_a_stored_batch_is_a_gap(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 4)
        with pytest.raises(StorageGapError, match="inside a stored batch"):
            store.append(4, 1, 1, encoded(9, records=1))
        assert read_all(store) == batches[:1]


def test_replay_of_batches_deleted_by_retention_is_skipped(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 20)
        store.delete_before(30)
        start = int(segment_files(tmp_path)[0].stem)
        assert start > 0
        for batch in batches:
            store.append(*batch)
        assert store.next_offset == 60
        assert read_all(store) == batches[10:]


# -- truncation, retention, reset ---------------------------------------------------------------


def test_truncate_to_drops_the_batch_holding_the_offset_and_all_after(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 20)
        store.truncate_to(100)  # past the end: nothing to do
        assert store.next_offset == 60
        store.truncate_to(31)  # inside batch 10 (offsets 30-32)
        assert store.next_offset == 30
        assert read_all(store) == batches[:10]
        assert store.read(30, 100) == []
        assert all(int(f.stem) <= 30 for f in segment_files(tmp_path))
        assert store.size_bytes == sum(frame_bytes(b) for b in batches[:10])
        again = fill(store, 3, first=10)
    with open_store(tmp_path) as store:
        assert read_all(store) == batches[:10] + again


def test_truncate_to_the_start_empties_the_log(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        fill(store, 20)
        store.truncate_to(0)
        assert (store.log_start_offset, store.next_offset, store.size_bytes) == (0, 0, 0)
        assert read_all(store) == []
        batches = fill(store, 2)
    with open_store(tmp_path) as store:
        assert read_all(store) == batches


def test_delete_before_deletes_only_whole_segments(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 30)
        bases = [int(f.stem) for f in segment_files(tmp_path)]
        cut = bases[3] + 1  # inside the fourth segment: it stays
        store.delete_before(cut)
        assert store.log_start_offset == cut
        assert [int(f.stem) for f in segment_files(tmp_path)] == bases[3:]
        assert store.read(cut - 2, 100) == []
        assert store.read(cut, 0)[0].base_offset == bases[3]
        store.delete_before(0)  # never moves the start back
        assert store.log_start_offset == cut
        store.delete_before(store.next_offset)  # the active segment stays
        assert [int(f.stem) for f in segment_files(tmp_path)] == bases[-1:]
        assert store.size_bytes == segment_files(tmp_path)[0].stat().st_size
        assert store.read(store.log_start_offset, 100) == []
        with pytest.raises(ValueError, match="log end"):
            store.delete_before(store.next_offset + 1)
        more = fill(store, 1, first=30)
        assert read_all(store) == more
    with open_store(tmp_path) as store:
        assert store.log_start_offset == bases[-1]
        assert store.next_offset == batches[-1].next_offset + 3


def test_segments_for_retention_by_time(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        for index in range(30):
            store.append(store.next_offset, 3, 1_000 * index, encoded(index))
        bases = [int(f.stem) for f in segment_files(tmp_path)]
        assert store.segments_for_retention(30_000, 1_000_000, None) is None
        # Batches up to index 9 (offsets < 30) are older than 15 s at now = 25 s.
        cutoff = store.segments_for_retention(25_000, 15_000, None)
        assert cutoff is not None
        assert cutoff in bases
        assert cutoff <= 30
        assert bases[bases.index(cutoff) + 1] > 30  # the next segment holds younger batches
        # Everything is old, but the active segment never goes.
        assert store.segments_for_retention(10**9, 0, None) == bases[-1]
        assert store.segments_for_retention(10**9, -1, -1) is None


def test_segments_for_retention_by_bytes(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        fill(store, 30)
        sizes = [f.stat().st_size for f in segment_files(tmp_path)]
        bases = [int(f.stem) for f in segment_files(tmp_path)]
        assert store.segments_for_retention(0, None, store.size_bytes) is None
        keep = store.size_bytes - sizes[0] - sizes[1]
        assert store.segments_for_retention(0, None, keep) == bases[2]
        assert store.segments_for_retention(0, None, keep + 1) == bases[1]
        assert store.segments_for_retention(0, None, 0) == bases[-1]
        store.delete_before(bases[2])
        assert store.segments_for_retention(0, None, keep) is None


def test_reset_starts_an_empty_log_at_an_offset(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        fill(store, 10)
        store.reset(1_000)
        assert (store.log_start_offset, store.next_offset, store.size_bytes) == (1_000, 1_000, 0)
        assert store.read(0, 100) == []
        with pytest.raises(StorageGapError):
            store.append(1_003, 1, 1, encoded(1, records=1))
        batches = fill(store, 2, first=500)
    assert segment_files(tmp_path) == [tmp_path / segment_file_name(1_000)]
    with open_store(tmp_path) as store:
        assert (store.log_start_offset, store.next_offset) == (1_000, 1_006)
        assert read_all(store) == batches


# -- durability and lifecycle -------------------------------------------------------------------


def test_fsync_mode_and_close(tmp_path: Path) -> None:
    store = open_store(tmp_path, fsync=True)
    batches = fill(store, 10)
    store.truncate_to(batches[8].base_offset)
    store.delete_before(batches[4].base_offset)
    store.sync()
    store.close()
    store.close()
    with pytest.raises(StorageError, match="closed") as info:
        store.append(*batches[8])
    assert info.value.error == ErrorCode.KAFKA_STORAGE_ERROR
    with pytest.raises(StorageError, match="closed"):
        store.read(batches[5].base_offset, 100)
    with open_store(tmp_path, fsync=True) as reopened:
        assert reopened.read(batches[5].base_offset, 1 << 20) == batches[5:8]


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        open_store(tmp_path, segment_bytes_max=0)
    with open_store(tmp_path) as store:
        with pytest.raises(ValueError, match="bad batch"):
            store.append(0, 0, 1, encoded(0))
        with pytest.raises(ValueError, match="bad batch"):
            store.append(0, 1, 1, b"")


# -- reads between changes ----------------------------------------------------------------------


def test_reads_between_every_kind_of_change_see_exactly_the_log(tmp_path: Path) -> None:
    """The writer appends, rolls, replaces diverged tails with a version of another size, and
    deletes old segments; between its steps, reads at the tail and at the start return exactly
    the batches stored from the one holding their offset on (a store has one thread: each call
    runs to its end, so no read can see a change half done)."""
    total = 300
    versions = [
        [
            as_stored(3 * i, 3, i, encoded(i, value_bytes=40 + 25 * v, version=v))
            for i in range(total)
        ]
        for v in (0, 1)
    ]
    store = open_store(tmp_path, segment_bytes_max=4_096, index_interval_bytes=512)
    log: list[StoredBatch] = []  # the model: what the store must hold, in order
    rng = random.Random(7)

    def reads() -> None:
        start, end = store.log_start_offset, store.next_offset
        for window in ((start, min(end, start + 15)), (max(start, end - 15), end)):
            if window[1] <= window[0]:
                continue
            offset = rng.randrange(*window)
            max_bytes = rng.choice((0, 500, 5_000, 50_000))
            got = store.read(offset, max_bytes)
            held = [b for b in log if b.next_offset > offset]
            assert got and got == held[: len(got)], offset
            assert sum(len(b.batch) for b in got) <= max(max_bytes, len(got[0].batch))

    version = 0
    for i in range(total):
        store.append(*versions[version][i])
        log.append(versions[version][i])
        reads()
        if i % 20 == 19:  # a diverged tail of 5 batches, replaced
            version = 1 - version
            store.truncate_to(versions[0][i - 4].base_offset)
            del log[-5:]
            reads()
            for j in range(i - 4, i + 1):
                store.append(*versions[version][j])
                log.append(versions[version][j])
                reads()
        if i % 60 == 59:
            store.delete_before(versions[0][i - 30].base_offset)
            log = [b for b in log if b.base_offset >= store.log_start_offset]
            reads()
    assert store.next_offset == 3 * total
    store.close()


# -- offsets by time ------------------------------------------------------------------------------


@pytest.mark.parametrize("index_interval", [1, INDEX_INTERVAL, 1 << 20])
def test_offset_for_time_finds_the_first_batch_appended_since(
    tmp_path: Path, index_interval: int
) -> None:
    store = open_store(tmp_path, index_interval_bytes=index_interval, segment_bytes_max=2_000)
    stored = fill(store, 40)  # appended at 10,000 + i; several segments
    assert len(segment_files(tmp_path)) > 3
    for i, batch in enumerate(stored):
        assert store.offset_for_time(10_000 + i) == batch.base_offset, i
    assert store.offset_for_time(0) == stored[0].base_offset
    assert store.offset_for_time(10_000 + len(stored)) is None
    store.close()
    reopened = open_store(tmp_path, index_interval_bytes=index_interval, segment_bytes_max=2_000)
    assert reopened.offset_for_time(10_020) == stored[20].base_offset  # rebuilt on recovery
    reopened.truncate_to(stored[30].base_offset)
    assert reopened.offset_for_time(10_030) is None  # gone with the truncated batches
    reopened.delete_before(stored[12].base_offset)
    assert reopened.offset_for_time(10_000) == reopened.log_start_offset
    reopened.close()


def test_offset_for_time_with_append_times_out_of_order(tmp_path: Path) -> None:
    """A new leader's clock may be behind the old one's: the first batch appended at the time
    or later is found, not merely the first whose predecessors all were earlier."""
    store = open_store(tmp_path, index_interval_bytes=1 << 20)
    times = [100, 300, 200, 400, 250]
    for index, time_ms in enumerate(times):
        store.append(store.next_offset, 3, time_ms, encoded(index))
    assert [store.offset_for_time(t) for t in (50, 250, 301, 400, 401)] == [0, 3, 9, 9, None]
    store.close()
