"""`python -m bridge run` processes on a generated routes.yaml, as users run them."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.machine import cpu_seconds

__all__ = ["BridgeProcess", "Bridges"]


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


@dataclass
class Bridges:
    """`--processes` bridges on the same routes.yaml, as replicas of one Deployment would run:
    competing consumers of one SQL table or RabbitMQ queue, members of one Kafka group."""

    processes: list[BridgeProcess]
    ports: list[int]  # each one's /metrics

    def batches(self) -> tuple[float, float]:
        """(batches, messages) the bridges forwarded so far, from their `bridge_batch_size`
        histograms (every worker's, as the primary's /metrics merges them)."""
        sums = {"bridge_batch_size_count": 0.0, "bridge_batch_size_sum": 0.0}
        for port in self.ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
                for family in text_string_to_metric_families(page.read().decode()):
                    for sample in family.samples:
                        if sample.name in sums:
                            sums[sample.name] += sample.value
        return sums["bridge_batch_size_count"], sums["bridge_batch_size_sum"]

    def start(self) -> None:
        for process in self.processes:
            process.start()

    def cpu(self) -> float:
        return sum(process.cpu() for process in self.processes)

    def alive(self) -> bool:
        return all(process.alive() for process in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            process.stop()

    def tail(self) -> str:
        return "\n".join(process.tail() for process in self.processes)
