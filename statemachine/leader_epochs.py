"""LeaderEpochs: where each leader epoch's records begin in one partition (Kafka's leader-epoch
cache, KIP-101 and KIP-320), so a consumer can check its position after a leader change.

A partition's leader epoch is the Raft term of the entry that appended a batch: every replica
applies the same entries with the same terms, so every replica holds the same list. An epoch is
recorded with the offset of its first record when its first batch applies; epochs in which no
batch was appended are not recorded (a question about one is answered by the epoch before it).

`end_offset(epoch, ...)` answers OffsetForLeaderEpoch as Kafka's `LeaderEpochFileCache.
endOffsetFor` does, with the current term counted as the latest epoch (a Kafka leader records
its epoch when elected; here the term is known without an entry): the end offset of `epoch` is
the start of the first later epoch, or the log end for the latest one.

Committed records are never truncated under Raft, so an answer never tells a reader of
committed records that its position diverged; it is the check Kafka's clients make, served.
"""

from __future__ import annotations

from bisect import bisect_right

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochs:
    """(epoch, start offset) pairs, both increasing; at most `epochs_max`, the oldest dropped."""

    __slots__ = ("_epochs", "_epochs_max", "_starts")

    def __init__(self, epochs_max: int) -> None:
        assert epochs_max > 0
        self._epochs_max = epochs_max
        self._epochs: list[int] = []
        self._starts: list[int] = []

    @property
    def latest(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def appended(self, epoch: int, base_offset: int) -> None:
        """A batch of `epoch` now begins at `base_offset`. An epoch below the latest (an entry
        written before its term's predecessors: impossible in a Raft log) changes nothing."""
        if epoch <= self.latest:
            return
        assert not self._starts or base_offset >= self._starts[-1], "epochs out of order"
        self._epochs.append(epoch)
        self._starts.append(base_offset)
        if len(self._epochs) > self._epochs_max:
            # Asked about a dropped epoch, `end_offset` answers the start of the oldest kept
            # one: later than the dropped epoch's true end, so no reader is told to truncate.
            del self._epochs[0], self._starts[0]

    def start_moved(self, log_start_offset: int) -> None:
        """Records below `log_start_offset` are gone: the epoch holding the new start begins
        there, and epochs wholly before it are forgotten (Kafka's truncation from the start)."""
        kept = bisect_right(self._starts, log_start_offset) - 1
        if kept > 0:
            del self._epochs[:kept], self._starts[:kept]
        if self._starts and self._starts[0] < log_start_offset:
            self._starts[0] = log_start_offset

    def end_offset(self, epoch: int, current_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(the epoch found, its end offset) for a reader asking about `epoch`, `current_epoch`
        being the leader's term; (-1, -1) when `epoch` is undefined or after the current one."""
        if epoch < 0 or epoch > current_epoch:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        latest = self.latest
        if epoch >= latest:
            # The latest epoch with records runs to the log end, and the current term (with no
            # batch applied yet) begins there: an epoch between them ends there too.
            found = latest if UNDEFINED_EPOCH < latest < epoch < current_epoch else epoch
            return found, log_end_offset
        higher = bisect_right(self._epochs, epoch)  # the first epoch after the one asked
        if higher == 0:  # before every known epoch: up to the first's start (Kafka's rule)
            return epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    def epoch_at(self, offset: int) -> int:
        """The epoch whose records hold `offset` (-1 before the first known epoch's start, or
        with none known): the leader epoch ListOffsets answers with a record's offset."""
        at = bisect_right(self._starts, offset) - 1
        return self._epochs[at] if offset >= 0 and at >= 0 else UNDEFINED_EPOCH

    def to_data(self) -> list[list[int]]:
        return [list(pair) for pair in zip(self._epochs, self._starts, strict=True)]

    @classmethod
    def from_data(cls, data: object, epochs_max: int) -> LeaderEpochs:
        """Restore `to_data`'s form; a snapshot is trusted but still checked for shape."""
        epochs = cls(epochs_max)
        if not isinstance(data, list | tuple):
            raise ValueError("leader epochs: not a list")
        for pair in data:
            if not (isinstance(pair, list | tuple) and len(pair) == 2):
                raise ValueError("leader epochs: a pair is [epoch, start offset]")
            epoch, start = pair
            if not (type(epoch) is int and type(start) is int and epoch > epochs.latest >= -1):
                raise ValueError("leader epochs: epochs must be increasing ints")
            if start < (epochs._starts[-1] if epochs._starts else 0):
                raise ValueError("leader epochs: start offsets must be non-decreasing from 0")
            epochs.appended(epoch, start)
        return epochs
