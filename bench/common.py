"""What every bench script shares: the machine, message shapes, statistics, the table, the bridge.

Scripts in bench/ import this as `common` (they run as `python bench/NAME.py`, so bench/ is on
the path). Nothing here asserts on time: the scripts print tables, tests never time anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, Self

__all__ = [
    "PG_DSN",
    "RABBITMQ_URL",
    "BridgeProcess",
    "BusySampler",
    "CpuTimes",
    "Result",
    "body_of",
    "headers_of",
    "machine",
    "machine_busy",
    "percentile",
    "print_table",
    "time_sent",
    "unique",
]

PG_DSN = os.environ.get("BRIDGE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
RABBITMQ_URL = os.environ.get("BRIDGE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

#: Header the bench writes next to NServiceBus.TimeSent: the write moment as epoch seconds, so
#: a destination consumer computes latency without parsing the wire format.
WRITTEN_AT = "Bench.WrittenAt"
#: Header numbering the messages of one fill or paced run from 0.
NUMBER = "Bench.N"


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def time_sent(moment: float) -> str:
    """NServiceBus.TimeSent of `moment` (epoch seconds), as endpoints write it."""
    utc = datetime.fromtimestamp(moment, UTC)
    return f"{utc:%Y-%m-%d %H:%M:%S}:{utc.microsecond:06d} Z"


def headers_of(n: int, moment: float) -> dict[str, str]:
    """The headers an NServiceBus endpoint sends a command with (about 500 bytes of JSON)."""
    message_id = str(uuid.uuid4())
    return {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.CorrelationId": message_id,
        "NServiceBus.OriginatingEndpoint": "Bench.Sender",
        "NServiceBus.OriginatingMachine": "bench",
        "NServiceBus.ReplyToAddress": "Bench.Sender",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": "Bench.Messages.Ping, Bench.Messages",
        "NServiceBus.Version": "9.2.3",
        "NServiceBus.TimeSent": time_sent(moment),
        WRITTEN_AT: repr(moment),
        NUMBER: str(n),
    }


def headers_json(headers: dict[str, str]) -> str:
    """The SQL Headers column as endpoints write it (compact, `/` escaped)."""
    return json.dumps(headers, separators=(",", ":"), ensure_ascii=False).replace("/", "\\/")


def body_of(size: int) -> bytes:
    return (b'{"payload":"' + b"x" * size)[: size - 2] + b'"}'


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass
class Result:
    """One line of a table: what ran, its rate, and latencies (seconds) when measured."""

    name: str
    messages: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    cpu_seconds: float | None = None
    note: str = ""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else float("nan")


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    return str(value)


def print_table(head: Sequence[str], rows: Sequence[Sequence[object]], file: object = None) -> str:
    """A Markdown table (aligned), printed and returned."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    text = "\n".join(
        [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)]
    )
    print(text, file=file or sys.stdout, flush=True)
    return text


def _first_line(command: Sequence[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "?"


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
    record batches a topic holds: see docs/benchmarks.md, "Tenth session")."""

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


class BridgeProcess:
    """`python -m bridge run` of one route of a generated routes.yaml, as users run it."""

    def __init__(
        self, config_text: str, route: str, workdir: Path | None = None, workers: int = 1
    ) -> None:
        self.workers = workers
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="bridge-bench-"))
        self.config = self.workdir / f"{route}.yaml"
        self.config.write_text(config_text)
        self.route = route
        self.log = self.workdir / f"{route}.log"
        self._process: subprocess.Popen[bytes] | None = None

    def command(self, *args: str) -> None:
        """Run another bridge command (e.g. install) on the same config; exit on failure."""
        out = subprocess.run(
            [sys.executable, "-m", "bridge", *args, "-c", str(self.config)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            sys.exit(f"bridge {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")

    def start(self) -> BridgeProcess:
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bridge",
                    "run",
                    "-c",
                    str(self.config),
                    "--route",
                    self.route,
                    "--log-level",
                    "WARNING",
                    "--workers",
                    str(self.workers),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """SIGTERM (finish the batch in hand, commit, exit 0); kill after 30 s."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = -9
        if code != 0:
            print(f"warning: bridge exited with {code}; see {self.log}", file=sys.stderr)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def wait_until(condition: object, timeout: float, every: float = 0.02) -> float:
    """Poll `condition()` until true; the monotonic time it became true; raise on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():  # type: ignore[operator]
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(every)
