"""`bridge run --workers N`: N worker processes run the routes; a primary keeps them running.

Why
    One Python process moves messages on one core at a time, and a route spends most of its
    CPU in Python (drivers, header mapping): on a machine with cores to spare, one process per
    core moves more. A worker is `bridge run` itself with the same config and flags, so the
    workers compete for each route's source as replicas of a Deployment do: a SQL queue table's
    receive locks the rows it takes (SQLite: the file), a Kafka consumer group shares the
    topic's partitions among its members, RabbitMQ gives each delivery to one consumer. The
    delivery guarantees are those of one process, per worker.

Primary
    Runs no route and opens no connection. It starts the workers and starts a worker that
    dies (killed, out of memory) again after a capped, jittered backoff, logged as an error;
    with `--until-idle` it starts none again and exits with the worst worker's exit code.
    SIGTERM/SIGINT go to every worker (each finishes its batch in hand and commits) and the
    primary exits once all have. It serves /healthz, /readyz, /routes and /metrics for the
    whole process tree (below). With `--until-idle` it prints the run's summary: the routes'
    counts of every worker added up (`bridge.service.summary`).

Workers
    Each serves its own /routes and /metrics on 127.0.0.1, on a port it picks, and tells the
    primary the port over a socket pair it inherits (a line with the number), and with
    `--until-idle` its summary as it ends (a line of JSON). It stops as on SIGTERM when the
    primary's end of that pair closes, so a primary killed with -9 leaves no worker running on.

Status
    /readyz is ready when every worker is up and every route running in each. /routes gives
    each route once, with its counters summed over the workers, the worst state of any worker
    (failed, backoff, starting, running), the most recent error, and each worker's state under
    `workers`. /metrics is every worker's metrics with a `worker` label, plus
    `bridge_worker_up` and `bridge_worker_restarts_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.routing.retry import Backoff
from bridge.service.http import HealthServer
from bridge.service.summary import RunSummary

__all__ = ["WorkerLink", "Workers", "merge_metrics", "merge_routes"]

log = logging.getLogger("bridge.workers")

#: A worker that ran this long before it died starts again without the backoff of earlier deaths.
HEALTHY_RUN_SECONDS = 60.0
#: How long the primary waits for a worker's status before counting it as down.
STATUS_TIMEOUT = 2.0

_SEVERITY = {"failed": 5, "failing": 4, "backoff": 3, "starting": 2, "stopped": 1, "running": 0}
_COUNTERS = (
    *("forwarded", "expired", "poison", "retried", "retried_messages", "batches"),
    "control_dropped",
)


class WorkerLink:
    """A worker's end of the socket pair it shares with the primary."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)

    def announce(self, port: int) -> None:
        """Tell the primary where this worker serves its status (0: it serves none)."""
        self._sock.sendall(f"{port}\n".encode())

    def report(self, summary: dict[str, Any]) -> None:
        """Hand the primary this worker's summary of an `--until-idle` run, as it ends."""
        self._sock.setblocking(True)
        try:
            self._sock.sendall(json.dumps(summary).encode() + b"\n")
        except OSError as exc:  # the primary is gone: nobody to tell
            log.debug("summary not handed to the primary: %s", exc)

    def watch(self, loop: asyncio.AbstractEventLoop, on_gone: Callable[[], None]) -> None:
        """Call `on_gone` once the primary's end closes (the primary exited or was killed)."""
        self._sock.setblocking(False)

        def readable() -> None:
            try:
                data = self._sock.recv(64)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(self._sock.fileno())
                log.warning("the primary process is gone: stopping")
                on_gone()

        loop.add_reader(self._sock.fileno(), readable)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._sock.close()


@dataclass
class _Worker:
    index: int
    pid: int | None = None
    port: int | None = None
    restarts: int = 0
    exit_code: int | None = None
    summary: RunSummary | None = None


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Workers:
    """The primary of `bridge run --workers N` (see the module docstring)."""

    def __init__(
        self,
        count: int,
        worker_args: Sequence[str],
        *,
        routes: Sequence[str],
        http: tuple[str, int] | None,
        until_idle: bool = False,
    ) -> None:
        self.count = count
        self.worker_args = list(worker_args)
        self.route_names = list(routes)
        self.http_address = http
        self.until_idle = until_idle
        self.workers = [_Worker(i) for i in range(count)]
        self.http: HealthServer | None = None
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()
        self._started = time.monotonic()
        self._ended: float | None = None

    def stop(self) -> None:
        running = [p for p in self._processes.values() if p.returncode is None]
        if running and not self._stopping.is_set():
            log.info("stopping: every worker finishes its batch in hand")
        self._stopping.set()
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

    def summary(self) -> RunSummary:
        """The workers' summaries of an `--until-idle` run as one (`bridge.service.summary`)."""
        end = time.monotonic() if self._ended is None else self._ended
        parts = [w.summary for w in self.workers if w.summary is not None]
        merged = RunSummary.merge(parts, self.route_names, end - self._started)
        for worker in self.workers:
            if worker.summary is None:
                how = (
                    "" if worker.exit_code is None else f" (it {_describe_exit(worker.exit_code)})"
                )
                merged.notes.append(
                    f"worker {worker.index} handed in no summary{how}: its messages are not "
                    "counted above"
                )
        return merged

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        self._started = time.monotonic()
        try:
            if self.http_address is not None:
                host, port = self.http_address
                self.http = HealthServer(host, port, WorkersStatus(self)).start()
                log.info("serving /healthz /readyz /metrics /routes on port %d", self.http.port)
            log.info("running %d worker process(es)", self.count)
            await asyncio.gather(*(self._keep(worker) for worker in self.workers))
            self._ended = time.monotonic()
        finally:
            self.stop()
            if self.http is not None:
                self.http.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        return 1 if any(w.exit_code for w in self.workers) else 0

    async def _keep(self, worker: _Worker) -> None:
        backoff = Backoff(initial=0.5, maximum=30.0)
        while not self._stopping.is_set():
            started = time.monotonic()
            code = await self._run_once(worker)
            if self._stopping.is_set() and code == -signal.SIGTERM:
                code = 0  # stopped before it could take the signal itself: it held nothing yet
            worker.exit_code = code
            if self._stopping.is_set() or self.until_idle:
                return
            if time.monotonic() - started >= HEALTHY_RUN_SECONDS:
                backoff.reset()
            delay = backoff.next_delay()
            worker.restarts += 1
            log.error(
                "worker %d (pid %s) %s; starting it again in %.1fs",
                worker.index,
                worker.pid,
                _describe_exit(code),
                delay,
                extra={"worker": worker.index},
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            worker.exit_code = None  # logged; a stop while it waits to start again is clean

    async def _run_once(self, worker: _Worker) -> int:
        primary_end, worker_end = socket.socketpair()
        try:
            command = [
                sys.executable,
                "-m",
                "bridge",
                "run",
                *self.worker_args,
                "--worker-index",
                str(worker.index),
                "--worker-fd",
                str(worker_end.fileno()),
            ]
            process = await asyncio.create_subprocess_exec(
                *command, pass_fds=(worker_end.fileno(),)
            )
            worker_end.close()
            self._processes[worker.index] = process
            worker.pid, worker.port = process.pid, None
            if self._stopping.is_set():  # a stop that came while it was starting
                process.send_signal(signal.SIGTERM)
            log.info("worker %d started (pid %d)", worker.index, process.pid)
            worker.summary = None
            reading = asyncio.create_task(self._read_link(primary_end, worker))
            try:
                code = await process.wait()
                # What it wrote before it exited is still to be read; then its end is closed.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(reading), timeout=STATUS_TIMEOUT)
                return code
            finally:
                reading.cancel()
                worker.port = None
                self._processes.pop(worker.index, None)
        finally:
            worker_end.close()
            primary_end.close()

    @staticmethod
    async def _read_link(sock: socket.socket, worker: _Worker) -> None:
        """The worker's port line, then its summary line, until it closes its end."""
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        data = b""
        lines = 0
        while True:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                return  # the worker went
            data += chunk
            while b"\n" in data:
                line, data = data.split(b"\n", 1)
                lines += 1
                if lines == 1:
                    worker.port = int(line) or None
                else:
                    worker.summary = RunSummary.from_json(json.loads(line))


class WorkersStatus:
    """The primary's /readyz, /routes and /metrics, read from its workers on each request."""

    def __init__(self, workers: Workers) -> None:
        self._workers = workers

    def _get(self, worker: _Worker, path: str) -> bytes | None:
        if worker.port is None:
            return None
        url = f"http://127.0.0.1:{worker.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=STATUS_TIMEOUT) as reply:
                body: bytes = reply.read()
                return body
        except OSError as exc:  # a worker that is going or coming counts as down
            log.debug("worker %d status unavailable: %s", worker.index, exc)
            return None

    def _reports(self) -> list[tuple[int, list[dict[str, Any]] | None]]:
        out: list[tuple[int, list[dict[str, Any]] | None]] = []
        for worker in self._workers.workers:
            body = self._get(worker, "/routes")
            out.append((worker.index, None if body is None else json.loads(body)["routes"]))
        return out

    def not_ready(self) -> list[dict[str, Any]]:
        waiting: list[dict[str, Any]] = []
        for index, routes in self._reports():
            if routes is None:
                waiting.append({"worker": index, "state": "down"})
                continue
            waiting += [
                {"route": r["name"], "state": r["state"], "worker": index}
                for r in routes
                if r["state"] != "running"
            ]
        return waiting

    def routes(self) -> list[dict[str, Any]]:
        return merge_routes(self._reports(), self._workers.route_names)

    def metrics(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST

        texts = []
        for worker in self._workers.workers:
            body = self._get(worker, "/metrics")
            texts.append((worker.index, None if body is None else body.decode()))
        restarts = {w.index: w.restarts for w in self._workers.workers}
        return merge_metrics(texts, restarts), CONTENT_TYPE_LATEST


def merge_routes(
    reports: Iterable[tuple[int, list[dict[str, Any]] | None]], names: Sequence[str]
) -> list[dict[str, Any]]:
    """One /routes entry per route from each worker's (None: a worker that did not answer)."""
    merged: dict[str, dict[str, Any]] = {}
    states: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index, routes in reports:
        seen = set()
        for route in routes or []:
            name = route["name"]
            seen.add(name)
            states.setdefault(name, []).append({"worker": index, "state": route["state"]})
            into = merged.get(name)
            if into is None:
                merged[name] = dict(route)
                continue
            for key in _COUNTERS:
                into[key] = into.get(key, 0) + route.get(key, 0)
            published = into["published"] = dict(into.get("published", {}))
            for event, count in route.get("published", {}).items():
                published[event] = published.get(event, 0) + count
            if _SEVERITY.get(route["state"], 5) > _SEVERITY.get(into["state"], 5):
                into["state"] = route["state"]
            if (route["last_error_at"] or 0) > (into["last_error_at"] or 0):
                into["last_error"], into["last_error_at"] = (
                    route["last_error"],
                    route["last_error_at"],
                )
            into["idle_seconds"] = min(into["idle_seconds"], route["idle_seconds"])
        for name in states:
            if name not in seen:
                states[name].append({"worker": index, "state": "down"})
    out = []
    for name, per_worker in states.items():
        route = merged.get(name, {"name": name, "state": "starting"})
        if any(w["state"] == "down" for w in per_worker) and route["state"] == "running":
            route["state"] = "starting"
        out.append({**route, "workers": per_worker})
    return out


def merge_metrics(texts: Iterable[tuple[int, str | None]], restarts: dict[int, int]) -> bytes:
    """Each worker's Prometheus text with a `worker` label, as one exposition."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    up = Metric("bridge_worker_up", "1 while the worker answers, else 0", "gauge")
    restarted = Metric(
        "bridge_worker_restarts", "Times the worker died and was started again", "counter"
    )
    for index, text in texts:
        label = {"worker": str(index)}
        up.add_sample("bridge_worker_up", label, 0.0 if text is None else 1.0)
        restarted.add_sample("bridge_worker_restarts_total", label, float(restarts.get(index, 0)))
        for family in text_string_to_metric_families(text or ""):
            into = families.get(family.name)
            if into is None:
                into = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            into.samples += [
                Sample(s.name, {**s.labels, **label}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            ]

    class Collected:
        def collect(self) -> list[Metric]:
            return [up, restarted, *families.values()]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collected())
    return generate_latest(registry)
