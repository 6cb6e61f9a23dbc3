"""The service's HTTP face: /healthz, /readyz, /metrics, /routes.

Served by the standard library's threading HTTP server on a daemon thread, reading route state
that the event loop writes (plain attribute reads; no locks needed for a status page). What it
shows comes from a `Status`: `RunnerStatus` for the routes of this process, or, under
`bridge run --workers N`, the primary's view over its workers (`bridge.service.workers`).

- `/healthz`: 200 while the process runs.
- `/readyz`: 200 when every route is running (its source and destination reached, no loop in
  backoff or failing), else 503 with each waiting route and its state.
- `/metrics`: Prometheus text from the prometheus_client registry the OpenTelemetry reader feeds.
- `/routes`: JSON with each route's state, counters and last error; a route the registry
  derives names its `endpoint`.

A client that drops the connection early (a probe that times out, a load balancer's TCP check)
is worth one DEBUG line, not a traceback; any other failure of a request is logged as an error.
An address the server cannot listen on (taken by another process, a port below 1024 without
the privilege, a host that is not this machine's) is `CannotListen`, which says which
`host:port` and why; `bridge run` adds where the config's `http` block says so.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from bridge.config.models import DerivedRoute
from bridge.errors import BridgeError
from bridge.routing.runner import RouteRunner
from bridge.telemetry.redact import redactor

__all__ = ["CannotListen", "HealthServer", "RunnerStatus", "Status", "route_report"]

log = logging.getLogger("bridge.http")


def route_report(runners: Sequence[RouteRunner]) -> list[dict[str, Any]]:
    out = []
    for runner in runners:
        stats = asdict(runner.stats)
        stats.pop("last_activity")
        if stats["last_error"]:
            stats["last_error"] = redactor(stats["last_error"])
        route = runner.route
        out.append(
            {
                "name": route.name,
                # the registered endpoint a derived route forwards to; None for a written route
                "endpoint": route.endpoint if isinstance(route, DerivedRoute) else None,
                "from": {"connection": route.from_.connection, "address": route.from_.address},
                "to": {"connection": route.to.connection, "address": route.to.address},
                "concurrency": route.concurrency,
                "batch_size": route.batch_size,
                "batch_bytes": route.batch_bytes,
                "idle_seconds": round(runner.idle_for, 3),
                **stats,
            }
        )
    return out


class Status(Protocol):
    def not_ready(self) -> list[dict[str, Any]]:
        """What keeps the process from being ready (empty: ready)."""

    def routes(self) -> list[dict[str, Any]]:
        """The /routes report."""

    def metrics(self) -> tuple[bytes, str]:
        """Prometheus exposition text and its content type."""


class RunnerStatus:
    """The status of the routes this process runs."""

    def __init__(self, runners: Callable[[], Sequence[RouteRunner]]) -> None:
        self._runners = runners

    def not_ready(self) -> list[dict[str, Any]]:
        return [
            {"route": r.route.name, "state": r.stats.state}
            for r in self._runners()
            if r.stats.state != "running"
        ]

    def routes(self) -> list[dict[str, Any]]:
        return route_report(self._runners())

    def metrics(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: Any) -> None:
        """Log a request's failure, where the standard library prints a traceback to stderr."""
        exc = sys.exc_info()[1]
        client = ":".join(map(str, client_address))
        if isinstance(exc, ConnectionError):  # reset, broken pipe, aborted: the client left
            log.debug("client %s left early: %s", client, exc)
        else:
            log.error("request from %s failed", client, exc_info=exc)


#: What to do about the errors an address is refused with.
_ADVICE = {
    errno.EADDRINUSE: "another process listens there (another bridge?): stop it or choose "
    "another http.port",
    errno.EACCES: "permission denied: ports below 1024 need privileges; choose another http.port",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address: check http.host",
}


class CannotListen(BridgeError):
    """The HTTP server cannot listen on `host:port`; `location` is the config's `http` block
    (`FILE:LINE:COL`) once the caller knows it."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        reason = error.strerror or str(error)
        if isinstance(error, socket.gaierror):
            reason = f"unknown host ({reason}): check http.host"
        elif error.errno in _ADVICE:
            reason = f"{reason}: {_ADVICE[error.errno]}"
        self.message = f"http: cannot listen on {address}: {reason}"
        #: The `http` key at fault: the port when it is taken or privileged, else the host.
        self.key = "port" if error.errno in (errno.EADDRINUSE, errno.EACCES) else "host"
        self.location: str | None = None
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class HealthServer:
    def __init__(self, host: str, port: int, status: Status) -> None:
        self._status = status
        handler = self._handler()
        try:
            self._server = _Server((host, port), handler)
        except OSError as exc:
            raise CannotListen(host, port, exc) from None
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        view = self._status

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None  # probes every few seconds are not worth a log line

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, data: object) -> None:
                self._reply(status, json.dumps(data).encode(), "application/json")

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    self._json(200, {"status": "ok"})
                elif path == "/readyz":
                    waiting = view.not_ready()
                    self._json(
                        503 if waiting else 200, {"ready": not waiting, "not_ready": waiting}
                    )
                elif path == "/routes":
                    self._json(200, {"routes": view.routes()})
                elif path == "/metrics":
                    self._reply(200, *view.metrics())
                else:
                    self._json(404, {"error": f"no such path {path}"})

        return Handler
