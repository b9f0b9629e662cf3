"""The node's allocator setting, in a process of its own: with it, large buffers freed and
taken again, as a produced batch's copies are, come back from the heap without a page fault
per 4 KiB (by default glibc gives them back to the kernel, and faults them in again)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

_PROGRAM = """
import resource, sys
from cli.runtime import keep_large_blocks_in_the_heap
if sys.argv[1] == "set":
    assert keep_large_blocks_in_the_heap()
def churn():
    for _ in range(20):  # two batch-sized copies alive at once, both freed
        a = bytearray(4 << 20)
        b = bytearray(4 << 20)
        del a, b
churn()  # the heap grows once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_large_buffers_come_back_from_the_heap_without_page_faults() -> None:
    pages = 20 * 2 * (4 << 20) // 4096
    assert _page_faults("default") > pages // 2  # what the setting is for: glibc's default
    assert _page_faults("set") < pages // 20
