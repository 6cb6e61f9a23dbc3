"""What the numbers were measured on, and the CPU each part of a run used (from /proc)."""

from __future__ import annotations

import contextlib
import os
import platform
import threading
import time
from typing import NamedTuple, Self

__all__ = ["BusySampler", "CpuTimes", "ProcessCpuSampler", "cpu_seconds", "machine", "machine_busy"]


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = "?"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as info:
        kib = int(info.readline().split()[1])
    versions: dict[str, str] = {}
    for module in ("psycopg", "aiokafka", "pika"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:  # a missing driver only leaves a gap in the table
            versions[module] = "?"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": f"{kib / 1024 / 1024:.1f} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
        "drivers": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "sqlite": __import__("sqlite3").sqlite_version,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process and its live children (the workers of
    `bridge run --workers N`), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / ticks
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            kids = [int(child) for child in children.read().split()]
    except OSError:
        kids = []
    for kid in kids:
        with contextlib.suppress(OSError):  # it exited meanwhile
            own += cpu_seconds(kid)
    return own


class CpuTimes(NamedTuple):
    """The whole machine's CPU jiffies so far, from /proc/stat."""

    busy: int  # user, nice, system, irq, softirq: work done on this machine
    stolen: int  # steal: time a virtual CPU was ready to run and the hypervisor ran another
    total: int  # busy + stolen + idle + iowait

    def since(self, earlier: CpuTimes) -> tuple[float, float]:
        """(busy share, stolen share) of the machine's CPU time since `earlier`."""
        total = max(1, self.total - earlier.total)
        return (self.busy - earlier.busy) / total, (self.stolen - earlier.stolen) / total


def machine_busy() -> CpuTimes:
    """The machine's CPU time so far. Stolen time is not busy: on a virtual machine whose host
    is crowded it is what the route could not get, and it makes a run slower, not costlier."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    stolen = values[7]
    total = sum(values[:8])
    return CpuTimes(total - idle - stolen, stolen, total)


class _Sampler:
    """Runs `_sample` every `every` seconds on a thread while entered, once more on exit."""

    def __init__(self, every: float, name: str) -> None:
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self._every):
                self._sample()
                return

    def _sample(self) -> None:
        raise NotImplementedError


class BusySampler(_Sampler):
    """Samples `machine_busy` every `every` seconds on a thread, so the share of the machine's
    CPUs that was busy (or stolen) in any window of `time.perf_counter()` can be read
    afterwards."""

    def __init__(self, every: float = 0.05) -> None:
        super().__init__(every, "busy-sampler")
        self._samples: list[tuple[float, CpuTimes]] = []

    def _sample(self) -> None:
        self._samples.append((time.perf_counter(), machine_busy()))

    def shares(self, start: float, end: float) -> tuple[float, float]:
        """(busy, stolen) shares between the last sample at or before `start` and the first at
        or after `end` (a window a little wider than asked: the samples are `every` apart)."""
        samples = list(self._samples)
        before = [s for s in samples if s[0] <= start] or samples[:1]
        after = [s for s in samples if s[0] >= end] or samples[-1:]
        return after[0][1].since(before[-1][1])


class ProcessCpuSampler(_Sampler):
    """A process's CPU use, one share of one core for each `every` seconds, sampled on a thread
    from the moment it is entered (the local Kafka broker's, whose fetches cost more the more
    record batches a topic holds: see docs/benchmarks.md, "What limits the numbers")."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        super().__init__(every, "cpu-sampler")
        self._pid = pid
        self._last: tuple[float, float] | None = None  # (CPU seconds, time.perf_counter())
        self.shares: list[float] = []

    def _sample(self) -> None:
        cpu, at = cpu_seconds(self._pid), time.perf_counter()
        if self._last is not None and at - self._last[1] >= self._every / 2:  # not a last sliver
            self.shares.append((cpu - self._last[0]) / (at - self._last[1]))
        self._last = (cpu, at)
