"""How the process's C allocator treats the large buffers a batch makes (glibc only).

A batch of 500 messages of 1 KB is about 800 KB of Kafka records, and aiokafka lays a produce
request out by joining bytes level by level (records, partition, topic, request, size prefix),
each join a new buffer a little larger than the last, all held until the request is written;
the PostgreSQL and SQLite drivers and the Kafka fetches make buffers of the same order. glibc
moves its thresholds only as far as the largest block freed so far: its heap then serves these
buffers, but once they are freed, the free top of the heap (several MB of it) is over the
trim threshold (twice that block) and goes back to the system, so the next batch faults every
page in again, zeroed by the kernel. Encoding one 800 KB produce request took 1.8 ms of CPU
that way, and 0.14 ms with the thresholds below; a PostgreSQL -> Kafka route spent 8 % less
CPU per message (docs/benchmarks.md, eighth session).

`tune()` raises both thresholds for the process (`MMAP_THRESHOLD` and `TRIM_THRESHOLD`): blocks
up to 8 MiB come from the heap and are reused, and up to 32 MiB of free heap is kept for the
next batch instead of being returned at once. The cost is memory the process holds after a
burst: at most that much more resident heap. Setting either through glibc's own environment
variables (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) leaves both as they are, so an
operator can choose other values. Elsewhere (musl, macOS) `tune()` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune"]

MMAP_THRESHOLD = 8 * 1024 * 1024
TRIM_THRESHOLD = 32 * 1024 * 1024

#: mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune() -> bool:
    """Raise the allocator's thresholds (see the module doc); True when they were set."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _ENVIRONMENT):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc has it; musl's mallopt does nothing)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
