"""bridge.service.tuning: the heap keeps what a batch's buffers freed once `tune_allocator()`
ran (glibc).

Each case runs in a fresh interpreter, whose allocator nothing has tuned yet, and makes what
aiokafka makes for one produce request: six buffers of about 800 KB held together (each join a
little larger than the last), then all freed. Left alone, glibc's dynamic thresholds serve them
from the heap after the first time, and give the heap's free top back to the system (`trim`)
as soon as they are freed, so the next batch faults every page in again; `arena` (the heap's
size, `mallinfo2`) shows what was given back. The suite runs on Linux with glibc, as the
bootstrap sets it up; elsewhere these tests fail rather than skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

PROBE = """
import ctypes, json, sys
from bridge.service import tuning

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def batch(size):
    # (blocks mapped with mmap while held, bytes of heap given back when freed)
    before = libc.mallinfo2()
    held = [b"x" * (size + 64 * step) for step in range(6)]
    during = libc.mallinfo2()
    held.clear()
    return [during.hblks - before.hblks, during.arena - libc.mallinfo2().arena]

batch(800_000)  # the first batch: glibc's dynamic thresholds move past 800 KB
untuned = batch(800_000)
tuned = tuning.tune_allocator() if sys.argv[1] == "tune" else None
print(json.dumps({"untuned": untuned, "tuned": tuned, "after": batch(800_000),
                  "past_threshold": batch(tuning.MMAP_THRESHOLD + (1 << 20))[0]}))
"""


def probe(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_tune_keeps_a_batchs_freed_buffers_in_the_heap_and_maps_only_larger_ones() -> None:
    result = probe("tune")
    mapped, given_back = result["untuned"]
    assert mapped == 0 and given_back > 4_000_000  # glibc alone: the heap trimmed each time
    assert result["tuned"] is True
    assert result["after"] == [0, 0]
    assert result["past_threshold"] == 6


def test_without_tune_glibc_gives_the_heap_back_after_every_batch() -> None:
    result = probe("leave")
    assert result["tuned"] is None
    assert result["after"][0] == 0 and result["after"][1] > 4_000_000


@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_an_operators_own_malloc_setting_is_left_alone(name: str) -> None:
    result = probe("tune", env={name: str(64 << 20)})
    assert result["tuned"] is False
    # glibc's own: a threshold set by the environment is fixed, and the other stays at its
    # default (mmap: 128 KiB, trim: 128 KiB), no longer moved by what was freed
    if name == "MALLOC_MMAP_THRESHOLD_":
        assert result["after"][0] == 0 and result["after"][1] > 4_000_000
    else:
        assert result["after"] == [6, 0]
