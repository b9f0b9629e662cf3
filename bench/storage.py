"""Storage benchmark: how fast one `PartitionStore` appends and serves 16 KiB batches.

Role: the measured cost of the segment store on the apply path (append) and the Fetch path
(read), against a peer in the same run: plain `os.write` and `os.pread` of the same bytes to a
plain file, the floor any store on this file system is bound by. Run it as
`python -m bench.storage [--megabytes N] [--dir PATH] [--quick]`; it prints one JSON object on
stdout and nothing else.

Workload: batches of 100-byte records, as many as fit in 16 KiB, encoded once (64 distinct
batches, reused in turn) before any timing, appended at contiguous offsets up to `--megabytes`
of batch bytes with the default `Limits` (64 MiB segments, an index entry per 4 KiB), without
fsync, as a node runs by default. Reads follow while the files are still in the page cache, so
they measure the store's own cost, not the disk's.

Cases, each timed once with `time.perf_counter` and the garbage collector paused:
- append: every batch, `PartitionStore.append`; peer: `os.write` of each batch to one file.
- sequential read: the whole log from offset 0 in Fetch-sized `read(offset, 1 MiB)` calls;
  peer: `os.pread` of the plain file in 1 MiB chunks.
- point reads: `read(offset, 0)` at random offsets (the sparse index and one frame).
- reopen: opening the store again (index rebuilt from every segment, CRC of the active one).
- fsync append: a second store with `fsync=True`, appending for a fixed time.
Every read result is checked for count and offsets after timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.apply import gc_paused
from cluster.broker.storage import PartitionStore
from cluster.config import Limits
from statemachine.limits import KIB, MIB
from statemachine.records import Record, RecordBatch

BATCH_BYTES_MAX = 16 * KIB
VALUE_BYTES = 100
DISTINCT_BATCHES = 64
READ_BYTES = 1 * MIB
START_MS = 1_700_000_000_000
FULL_MEGABYTES = 200
QUICK_MEGABYTES = 4
POINT_READS = 20_000
QUICK_POINT_READS = 500
FSYNC_SECONDS = 0.5
QUICK_FSYNC_APPENDS = 10


def records_that_fit() -> int:
    """The most 100-byte records an encoded batch holds within BATCH_BYTES_MAX."""
    count = 1
    while len(encode_batch(0, count + 1)) <= BATCH_BYTES_MAX:
        count += 1
    return count


def encode_batch(index: int, records: int) -> bytes:
    items = tuple(Record(None, b"v" * VALUE_BYTES, START_MS) for _ in range(records))
    return RecordBatch(1_000, 0, index * records, items).encode()


def rate(total_bytes: int, seconds: float, calls: int) -> dict[str, Any]:
    return {
        "mb_per_s": round(total_bytes / seconds / 1e6, 1),
        "calls_per_s": round(calls / seconds),
        "seconds": round(seconds, 4),
        "calls": calls,
    }


def append_store(
    store: PartitionStore, batches: Sequence[bytes], count: int, records: int
) -> float:
    with gc_paused():
        start = time.perf_counter()
        for i in range(count):
            store.append(i * records, records, START_MS + i, batches[i % len(batches)])
        return time.perf_counter() - start


def append_peer(path: Path, batches: Sequence[bytes], count: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        with gc_paused():
            start = time.perf_counter()
            for i in range(count):
                os.write(fd, batches[i % len(batches)])
            return time.perf_counter() - start
    finally:
        os.close(fd)


def read_store(store: PartitionStore) -> tuple[float, int, int]:
    """Seconds, batch bytes and calls to read the whole log in Fetch-sized calls."""
    offset, total, calls = 0, 0, 0
    with gc_paused():
        start = time.perf_counter()
        while offset < store.next_offset:
            got = store.read(offset, READ_BYTES)
            calls += 1
            total += sum(len(b.batch) for b in got)
            offset = got[-1].next_offset
        elapsed = time.perf_counter() - start
    return elapsed, total, calls


def read_peer(path: Path) -> tuple[float, int, int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    size, position, calls = os.fstat(fd).st_size, 0, 0
    try:
        with gc_paused():
            start = time.perf_counter()
            while position < size:
                position += len(os.pread(fd, READ_BYTES, position))
                calls += 1
            return time.perf_counter() - start, position, calls
    finally:
        os.close(fd)


def point_reads(store: PartitionStore, reads: int, records: int) -> tuple[float, int]:
    rng = random.Random(1)
    offsets = [rng.randrange(store.next_offset) for _ in range(reads)]
    total = 0
    with gc_paused():
        start = time.perf_counter()
        for offset in offsets:
            total += len(store.read(offset, 0)[0].batch)
        elapsed = time.perf_counter() - start
    for offset in offsets[:100]:
        got = store.read(offset, 0)
        if len(got) != 1 or got[0].base_offset != offset // records * records:
            raise AssertionError(f"point read at {offset} returned {got[:1]!r}")
    return elapsed, total


def fsync_appends(directory: Path, batch: bytes, records: int, quick: bool) -> dict[str, Any]:
    with PartitionStore(directory, fsync=True) as store:
        count = 0
        start = time.perf_counter()
        deadline = start + FSYNC_SECONDS
        while (count < QUICK_FSYNC_APPENDS) if quick else (time.perf_counter() < deadline):
            store.append(count * records, records, START_MS, batch)
            count += 1
        elapsed = time.perf_counter() - start
    return rate(count * len(batch), elapsed, count)


def run(directory: Path, megabytes: int, quick: bool) -> dict[str, Any]:
    records = records_that_fit()
    batches = [encode_batch(i, records) for i in range(DISTINCT_BATCHES)]
    count = megabytes * 1_000_000 // len(batches[0])
    total = sum(len(batches[i % len(batches)]) for i in range(count))
    limits = Limits()
    log_dir, peer_file = directory / "log", directory / "peer.bin"

    with PartitionStore(log_dir) as store:
        append_s = append_store(store, batches, count, records)
        if store.next_offset != count * records:
            raise AssertionError("not every batch was appended")
        read_s, read_bytes, read_calls = read_store(store)
        if read_bytes != total:
            raise AssertionError(f"read {read_bytes} bytes of {total}")
        reads = QUICK_POINT_READS if quick else POINT_READS
        point_s, point_bytes = point_reads(store, reads, records)
        segments = len(list(log_dir.glob("*.log")))
        size_bytes = store.size_bytes
    start = time.perf_counter()
    with PartitionStore(log_dir) as reopened:
        reopen_s = time.perf_counter() - start
        if reopened.next_offset != count * records or reopened.recovered_truncated_bytes:
            raise AssertionError("reopen lost or truncated data")
    peer_append_s = append_peer(peer_file, batches, count)
    peer_read_s, peer_bytes, peer_calls = read_peer(peer_file)
    if peer_bytes != total:
        raise AssertionError("peer read a different size")
    fsync = fsync_appends(directory / "fsync", batches[0], records, quick)

    append = rate(total, append_s, count)
    peer_append = rate(total, peer_append_s, count)
    read = rate(read_bytes, read_s, read_calls)
    peer_read = rate(peer_bytes, peer_read_s, peer_calls)
    return {
        "benchmark": "cluster.broker.storage.PartitionStore append and read",
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
        "config": {
            "quick": quick,
            "directory": str(directory),
            "batch_bytes": len(batches[0]),
            "records_per_batch": records,
            "batches": count,
            "batch_bytes_total": total,
            "store_bytes_on_disk": size_bytes,
            "segments": segments,
            "segment_bytes_max": limits.segment_bytes_max,
            "index_interval_bytes": limits.index_interval_bytes,
            "read_max_bytes": READ_BYTES,
            "page_cache": "warm: reads follow the writes",
            "statistic": "one timed pass per case, gc paused",
        },
        "append": {**append, "ratio_to_peer": round(append_s / peer_append_s, 2)},
        "sequential_read": {**read, "ratio_to_peer": round(read_s / peer_read_s, 2)},
        "point_read": rate(point_bytes, point_s, reads),
        "reopen": {"seconds": round(reopen_s, 4), "mb_per_s": round(size_bytes / reopen_s / 1e6)},
        "fsync_append": fsync,
        "peer": {
            "what": "os.write / os.pread of the same batch bytes on one plain file",
            "append": peer_append,
            "sequential_read": peer_read,
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.storage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--megabytes", type=int, default=None, help="batch bytes to append")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny run; numbers are noise")
    args = parser.parse_args(argv)
    megabytes: int = args.megabytes or (QUICK_MEGABYTES if args.quick else FULL_MEGABYTES)
    if megabytes <= 0:
        parser.error("--megabytes must be positive")
    parent: Path | None = args.dir
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=parent))
    try:
        report = run(directory, megabytes, args.quick)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
