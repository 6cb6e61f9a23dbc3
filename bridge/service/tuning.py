"""Process tuning for `bridge run`: the garbage collector and the C allocator.

Both are speed-ups only: neither changes what a route moves, and `BRIDGE_TUNING=off` leaves
the process at CPython's and glibc's defaults.

`tune_gc()`: a batch of 500 messages holds some 20,000 small containers (header pairs,
envelopes, records) for a few milliseconds. At CPython's default a young collection runs every
700 allocations and walks everything still alive; nearly all of these objects are freed by
reference counting, so the collector runs every `GC_YOUNG_THRESHOLD` allocations instead, and
what lives now (modules, configuration) is frozen out of every collection.

`tune_allocator()` (glibc only): a batch's large buffers (an 800 KB Kafka produce request is
copied at every level of its encoding; drivers' fetch buffers are of the same order) would be
returned to the system after each batch and faulted in again, zeroed, for the next one. Raising
`M_MMAP_THRESHOLD` to 8 MiB and `M_TRIM_THRESHOLD` to 32 MiB keeps them in the heap, at the cost
of up to 32 MiB of freed heap held after a burst. Setting either through glibc's own environment
variables (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) leaves both as they are.
Elsewhere (musl, macOS) it does nothing.

`tests/unit/test_tuning.py` shows that a route moves the same messages either way;
`bench/speedups.py tuning` weighs the gain (the same route with and without `BRIDGE_TUNING=off`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

__all__ = [
    "GC_YOUNG_THRESHOLD",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "tune_allocator",
    "tune_gc",
    "tune_process",
]

#: Allocations (net of frees) between two young-generation collections; CPython's default is 700.
GC_YOUNG_THRESHOLD = 20_000

MMAP_THRESHOLD = 8 * 1024 * 1024
TRIM_THRESHOLD = 32 * 1024 * 1024

#: mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_gc() -> None:
    """Collect young objects less often, and freeze what lives now (see the module doc)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def tune_allocator() -> bool:
    """Raise glibc's malloc thresholds (see the module doc); True when they were set."""
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


def tune_process() -> None:
    """Both tunings, unless `BRIDGE_TUNING=off` asks for the interpreter's defaults."""
    if os.environ.get("BRIDGE_TUNING", "on").lower() in ("off", "0", "false", "no"):
        return
    tune_gc()
    tune_allocator()
