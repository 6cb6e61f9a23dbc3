"""One route through `bridge run`: its throughput phase, then its latency phase.

Throughput: the source holds `--messages` messages before the bridge starts; the rate counts
from the first message that arrives to the last (start-up and the Kafka group join are not in
it), watched by index lookups, and every message is then counted at the destination. Latency:
with the bridge still running, a paced producer writes `--rate` msg/s into the source, each
message stamped at its write, and a consumer of the destination takes each one as soon as it is
readable there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.bridges import BridgeProcess, Bridges
from bench.legs import KafkaPlace, Place, RabbitPlace, SqlPlace
from bench.machine import ProcessCpuSampler, machine_busy
from bench.messages import make_messages, unique
from bench.report import RouteResult, percentile
from tests.support.localkafka import free_port

__all__ = ["RoutePhases"]

#: Seconds of paced writing before latencies count.
WARM_UP = 1.0


class RoutePhases:
    """Measures routes with the options of `routes.py`; `kafka_pid` is the local broker's, to
    sample its CPU in latency phases."""

    def __init__(self, args: argparse.Namespace, workdir: Path, kafka_pid: int = 0) -> None:
        self.args = args
        self.workdir = workdir
        self.kafka_pid = kafka_pid

    def config(self, source: Place, destination: Place) -> str:
        options = ""
        if self.args.batch_size:
            options += f"    batch_size: {self.args.batch_size}\n"
        if self.args.concurrency:
            options += f"    concurrency: {self.args.concurrency}\n"
        return (
            "connections:\n"
            f"  {source.connection}: {source.connection_yaml()}\n"
            f"  {destination.connection}: {destination.connection_yaml()}\n"
            "routes:\n"
            "  - name: bench\n"
            f"    from: {source.endpoint_yaml('from', unique('bench-group'))}\n"
            f"    to: {destination.endpoint_yaml('to')}\n" + options
        )

    async def measure(self, result: RouteResult, source: Place, destination: Place) -> None:
        """Both phases of `result`'s route from `source` to `destination` (both created, the
        source empty), into `result`; a failure is a note on it."""
        n, route, db, workers = self.args.messages, result.route, result.db, result.workers
        await source.write(make_messages(n, self.args.size), 1000)
        progress = self.progress(source, destination)
        config = self.config(source, destination)
        homes = [self.workdir / f"{route}-{db}-w{workers}-{i}" for i in range(self.args.processes)]
        for home in homes:
            home.mkdir()
        ports = [free_port() for _ in homes]
        bridge = Bridges(
            [
                BridgeProcess(
                    f"{config}http: {{host: 127.0.0.1, port: {port}}}\n", "bench", home, workers
                )
                for home, port in zip(homes, ports, strict=True)
            ],
            ports,
        )
        bridge.start()
        profiler = self.profiler(bridge.processes[0], f"{route}-{db}-w{workers}")
        try:
            rate, cpu, (busy, stolen) = await asyncio.to_thread(self.watch, progress, n, bridge)
            result.machine_busy, result.stolen = busy, stolen
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(timeout=30)
            result.rate, result.cpu_us = rate, cpu / n * 1e6
            await self.verify(result, destination, n)
            if self.args.latency_seconds > 0:
                await self.latency(result, source, destination, bridge)
        except Exception as exc:
            result.notes.append(f"failed: {exc}")
            print(bridge.tail(), file=sys.stderr)
        finally:
            await asyncio.to_thread(bridge.stop)

    def profiler(self, bridge: BridgeProcess, name: str) -> subprocess.Popen[bytes] | None:
        """py-spy on the bridge during the throughput run (--profile DIR), collapsed stacks."""
        if not self.args.profile:
            return None
        out = Path(self.args.profile) / f"{name}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        spy = str(Path(sys.executable).parent / "py-spy")
        command = [spy, "record", "--format", "raw", "--rate", "250", "--threads"]
        command += ["--subprocesses"] if bridge.workers > 1 else []
        command += ["--idle"] if self.args.profile_idle else []
        command += ["--gil"] if self.args.profile_gil else []
        command += ["-o", str(out), "--pid", str(bridge.pid)]
        return subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def progress(self, source: Place, destination: Place) -> Callable[[], int]:
        """Messages through the route so far, by one index lookup."""
        if isinstance(destination, SqlPlace):
            return destination.watcher()
        if isinstance(source, SqlPlace):
            lowest = source.emptiness()
            first = lowest()
            assert first is not None
            return lambda: self.args.messages if (low := lowest()) is None else low - first
        raise AssertionError("every route has a SQL end")

    def watch(
        self, progress: Callable[[], int], n: int, bridge: Bridges
    ) -> tuple[float, float, tuple[float, float]]:
        """(msgs/s from the first message through to the last, bridge CPU seconds meanwhile,
        shares of the machine's CPUs busy and stolen meanwhile)."""
        deadline = time.monotonic() + self.args.timeout
        done0, t0, cpu0, busy0 = 0, 0.0, 0.0, machine_busy()
        while True:
            done, now = progress(), time.monotonic()
            if not t0 and done > 0:
                done0, t0, cpu0, busy0 = done, now, bridge.cpu(), machine_busy()
            if done >= n:
                shares = machine_busy().since(busy0)
                # A backlog small enough to arrive within one look has no rate to show.
                rate = (n - done0) / (now - t0) if done0 < n else float("nan")
                return rate, bridge.cpu() - cpu0, shares
            if now > deadline or not bridge.alive():
                raise RuntimeError(f"{done} of {n} through after {self.args.timeout} s")
            time.sleep(0.02)

    async def verify(self, result: RouteResult, destination: Place, n: int) -> None:
        if isinstance(destination, KafkaPlace):
            records, ids = await destination.drain_all(n, 30)
            result.duplicates, result.missing = records - ids, max(0, n - ids)
            return
        assert isinstance(destination, SqlPlace | RabbitPlace)
        deadline = time.monotonic() + 30
        count = await destination.count()
        while count < n and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            count = await destination.count()
        result.duplicates, result.missing = max(0, count - n), max(0, n - count)
        await destination.clear()

    async def latency(
        self, result: RouteResult, source: Place, destination: Place, bridge: Bridges
    ) -> None:
        rate, seconds = self.args.rate, self.args.latency_seconds
        warm = int(rate * WARM_UP)  # the first second wakes a source out of its idle backoff
        expected = int(rate * seconds)
        since = time.time()
        reader = asyncio.create_task(destination.timed(expected, since, warm, seconds + 30))
        await asyncio.sleep(0.5)  # the consumer is attached before the first write
        batches = await asyncio.to_thread(bridge.batches)
        started, cpu = time.monotonic(), machine_busy()
        with contextlib.ExitStack() as stack:
            broker = None
            if self.kafka_pid and "kafka" in result.route:
                broker = stack.enter_context(ProcessCpuSampler(self.kafka_pid))
            sent = await source.paced(rate, seconds + WARM_UP, self.args.size)
            result.offered = sent / (time.monotonic() - started)
            if broker is not None and broker.shares:
                result.broker_cpu_first = broker.shares[0]
                result.broker_cpu_last = broker.shares[-1]
        latencies = await reader
        result.latency_stolen = machine_busy().since(cpu)[1]
        count, total = await asyncio.to_thread(bridge.batches)
        count, total = count - batches[0], total - batches[1]
        result.latency_batch = total / count if count else float("nan")
        if len(latencies) < sent - warm:
            note = f"latency: {len(latencies)} of {sent - warm} arrived"
            if isinstance(source, SqlPlace | RabbitPlace):  # still there, or gone?
                note += f", {await source.count()} still at the source"
            result.notes.append(note)
        result.p50_ms = percentile(latencies, 50) * 1000
        result.p99_ms = percentile(latencies, 99) * 1000
        if self.args.latency_trace:
            name = f"{result.route}-{result.db}-w{result.workers}.txt"
            write_latencies(Path(self.args.latency_trace) / name, latencies, destination.arrivals)


def write_latencies(path: Path, latencies: list[float], arrivals: list[float]) -> None:
    """A message a line, in the order they arrived (--latency-trace): its latency (ms), and
    when it arrived (Unix time, to set beside the database's and broker's logs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (f"{v * 1000:.2f} {at:.4f}\n" for v, at in zip(latencies, arrivals, strict=True))
    path.write_text("".join(lines))
