"""The service's HTTP face: /healthz, /readyz, /metrics, /routes, and /openapi.json describing them.

Served by the standard library's threading HTTP server on a daemon thread, reading route state
that the event loop writes (plain attribute reads; no locks needed for a status page). What it
shows comes from a `Status` (`bridge.service.api`, which also holds the shapes of the JSON
replies): `RunnerStatus` for the routes of this process, or, under `bridge run --workers N`,
the primary's view over its workers (`bridge.service.workers`).

- `/healthz`: 200 while the process runs.
- `/readyz`: 200 when every route is running (its source and destination reached, no loop in
  backoff or failing), else 503 with each waiting route and its state.
- `/metrics`: Prometheus text from the prometheus_client registry the OpenTelemetry reader feeds.
- `/routes`: JSON with each route's state, counters and last error; a route the registry
  derives names its `endpoint`.
- `/openapi.json`: the OpenAPI 3.1 document of these paths (`api.openapi_document`), its
  JSON shapes generated from the pydantic models of the replies, so what it promises is what
  is served.

Every path answers GET and HEAD (the same status and headers, no body); another method on a
known path is 405 with `Allow: GET, HEAD`, an unknown path 404, each with a JSON `error`. A
query string is ignored. One request per connection (HTTP/1.0 style: the reply closes it).

A probe must answer while clients misbehave, so a connection is held to limits:
`HEAD_SECONDS` to send its request line and headers (a slowloris client that trickles them is
cut off), `MAX_REQUEST_LINE` bytes of request line (414) and `MAX_HEAD` bytes of request line
and headers (431), a body of at most `MAX_BODY` bytes (read and dropped, 413 beyond; a
Content-Length that is not ASCII digits is 400), and
`MAX_CONNECTIONS` connections at once (a thread each): at that many, a new connection takes the
place of the one that has waited longest for its headers, so slow clients cannot hold every
thread and the probes still get through.

A client that drops the connection early (a probe that times out, a load balancer's TCP check)
or that was cut off is worth one DEBUG line, not a traceback; any other failure of a request is
logged as an error and answered 500. An address the server cannot listen on (taken by another
process, a port below 1024 without the privilege, a host that is not this machine's) is
`CannotListen`, which says which `host:port` and why; `bridge run` adds where the config's
`http` block says so.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bridge.errors import BridgeError
from bridge.service.api import RunnerStatus, Status, openapi_document

__all__ = [
    "HEAD_SECONDS",
    "MAX_BODY",
    "MAX_CONNECTIONS",
    "MAX_HEAD",
    "MAX_REQUEST_LINE",
    "CannotListen",
    "HealthServer",
    "RunnerStatus",
    "Status",
]

log = logging.getLogger("bridge.http")

#: Seconds a client has from connecting to the end of its headers (and body, if any).
HEAD_SECONDS = 5.0
#: Seconds a reply may take to be written to a client that reads slowly.
WRITE_SECONDS = 10.0
#: Seconds a refused client's remaining bytes are read (and dropped) before the close.
LINGER_SECONDS = 1.0
#: Bytes of request line (method, target, version) before 414.
MAX_REQUEST_LINE = 8 * 1024
#: Bytes of request line and headers together before 431.
MAX_HEAD = 32 * 1024
#: Bytes of request body read and dropped (none of these paths takes one) before 413.
MAX_BODY = 64 * 1024
#: Digits of a Content-Length read at most: more is a length over any `MAX_BODY` (413).
MAX_LENGTH_DIGITS = 18
#: Connections served at once, a thread each.
MAX_CONNECTIONS = 64

#: The methods every path answers.
ALLOWED = "GET, HEAD"


class _TooLarge(Exception):
    """The client sent more than its request may have."""


class _Reader(io.RawIOBase):
    """A connection's bytes as the handler reads them: each read waits only for what is left of
    the deadline, and no more than `limit` bytes are read in all (then `_TooLarge`). A client
    that sends a byte at a time stays within each read's timeout but not within the deadline."""

    def __init__(self, sock: socket.socket, deadline: float, limit: int) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = deadline
        self.limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        room = self.limit - self.count
        if room <= 0:
            raise _TooLarge
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long to arrive")
        self._sock.settimeout(left)
        view = memoryview(buffer)
        n = self._sock.recv_into(view[: min(len(view), room)])
        self.count += n
        return n


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Connections the kernel holds until they are accepted: a burst of slow clients must not
    # fill it, or a probe's connection waits for a SYN retry (a second or more).
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._lock = threading.Lock()
        self._open = 0
        #: Connections still sending their headers, the one waiting longest first.
        self._waiting: dict[socket.socket, None] = {}
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if self._open >= MAX_CONNECTIONS and not self._evict():
                log.debug("%d connections busy: refusing one more", self._open)
                self.shutdown_request(request)
                return
            self._open += 1
            self._waiting[request] = None
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.done(request)
            raise

    def _evict(self) -> bool:
        """Cut off the connection that has waited longest for its headers (under the lock)."""
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting))
        del self._waiting[oldest]
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)  # its thread's read returns: it ends
        log.debug("%d connections open: cut off the slowest to send its headers", self._open)
        return True

    def headers_read(self, request: socket.socket) -> None:
        with self._lock:
            self._waiting.pop(request, None)

    def lingers(self, request: socket.socket) -> None:
        """A refused connection whose rest is being read: it may be cut off as a slow one."""
        with self._lock:
            self._waiting[request] = None

    def done(self, request: socket.socket) -> None:
        with self._lock:
            self._waiting.pop(request, None)
            self._open -= 1

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.done(request)

    def handle_error(self, request: object, client_address: Any) -> None:
        """Log a request's failure, where the standard library prints a traceback to stderr."""
        exc = sys.exc_info()[1]
        client = ":".join(map(str, client_address))
        # reset, broken pipe, aborted, or a client too slow to read its reply: the client left
        if isinstance(exc, ConnectionError | TimeoutError):
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


#: A path's reply: status, body, content type.
_Page = Callable[[], tuple[int, bytes, str]]


def _json(status: int, data: object) -> tuple[int, bytes, str]:
    return status, json.dumps(data).encode(), "application/json"


class HealthServer:
    def __init__(self, host: str, port: int, status: Status) -> None:
        self._status = status
        handler = self._handler()
        try:
            self._server = _Server((host, port), handler)
        except OSError as exc:
            raise CannotListen(host, port, exc) from None
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _pages(self) -> dict[str, _Page]:
        view = self._status
        document = json.dumps(openapi_document()).encode()

        def readyz() -> tuple[int, bytes, str]:
            waiting = view.not_ready()
            return _json(503 if waiting else 200, {"ready": not waiting, "not_ready": waiting})

        return {
            "/healthz": lambda: _json(200, {"status": "ok"}),
            "/readyz": readyz,
            "/routes": lambda: _json(200, {"routes": view.routes()}),
            "/metrics": lambda: (200, *view.metrics()),
            "/openapi.json": lambda: (200, document, "application/json"),
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        pages = self._pages()

        class Handler(BaseHTTPRequestHandler):
            timeout = WRITE_SECONDS
            _reader: _Reader
            _unread = False  # refused before its request was read whole: linger at the close

            def setup(self) -> None:
                super().setup()
                self.rfile.close()  # read through the deadline and the limit instead
                deadline = time.monotonic() + HEAD_SECONDS
                self._reader = _Reader(self.connection, deadline, MAX_HEAD)
                self.rfile = io.BufferedReader(self._reader)

            def log_message(self, format: str, *args: Any) -> None:
                return None  # probes every few seconds are not worth a log line

            def handle_one_request(self) -> None:
                """Read one request within the limits and answer it; the connection closes."""
                self.close_connection = True
                self.command, self.requestline = None, ""  # type: ignore[assignment]
                self.request_version = self.default_request_version
                try:
                    line = self.rfile.readline(MAX_REQUEST_LINE + 1)
                    if len(line) > MAX_REQUEST_LINE:
                        self.send_error(414, f"request line over {MAX_REQUEST_LINE} bytes")
                        return
                    if not line:
                        return  # connected and closed (a TCP check) or cut off
                    self.raw_requestline = line
                    if not self.parse_request():  # a malformed request: answered 400 or 431
                        return
                    if not self._drop_body():
                        return
                except _TooLarge:
                    self.send_error(431, f"request line and headers over {MAX_HEAD} bytes")
                    return
                except TimeoutError:
                    client = ":".join(map(str, self.client_address))
                    log.debug("client %s sent no whole request in %ss", client, HEAD_SECONDS)
                    return
                finally:
                    self.connection.settimeout(WRITE_SECONDS)
                    self._server().headers_read(self.request)
                self._answer()
                self.wfile.flush()

            def _server(self) -> _Server:
                assert isinstance(self.server, _Server)
                return self.server

            def _drop_body(self) -> bool:
                """Read a request's body, if any, so that closing the connection does not reset
                it before the client has read the reply (none of these paths takes one)."""
                if "Transfer-Encoding" in self.headers:
                    self._unread = True  # a chunked body: not read, only drained at the close
                length = self.headers.get("Content-Length")
                if length is None:
                    return True
                digits = length.strip()
                # ASCII only: str.isdigit() takes "²" too, which int() refuses; and no more
                # digits than any real length has (int() refuses over 4300 of them).
                if not (digits.isascii() and digits.isdigit()):
                    self.send_error(400, "Content-Length is not a number")
                    return False
                size = int(digits) if len(digits) <= MAX_LENGTH_DIGITS else MAX_BODY + 1
                if size > MAX_BODY:
                    self.send_error(413, f"a body over {MAX_BODY} bytes")
                    return False
                self._reader.limit = self._reader.count + size
                self.rfile.read(size)
                return True

            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                page = pages.get(path)
                if page is None:
                    self._reply(*_json(404, {"error": f"no such path {path}"}))
                    return
                if self.command not in ("GET", "HEAD"):
                    error = {"error": f"method {self.command} not allowed: {ALLOWED}"}
                    self._reply(*_json(405, error), allow=ALLOWED)
                    return
                try:
                    reply = page()
                except Exception:
                    log.exception("%s %s failed", self.command, path)
                    reply = _json(500, {"error": "internal error: see the bridge's log"})
                self._reply(*reply)

            def send_error(self, code: int, message: str | None = None, *_: Any) -> None:
                """Refuse a request with a JSON `error`, as every other reply is JSON, after a
                status line even when the request line was too broken to tell its version (the
                standard library would answer those as HTTP/0.9: a bare body). A request line of
                HTTP/2 or later is 400, not 505: no input is answered with a 5xx."""
                self.close_connection = True
                self._unread = True
                if self.request_version == "HTTP/0.9":
                    self.request_version = "HTTP/1.0"
                if code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
                    code = HTTPStatus.BAD_REQUEST
                self._reply(*_json(code, {"error": message or HTTPStatus(code).phrase}))

            def finish(self) -> None:
                super().finish()
                if self._unread:
                    self._linger()

            def _linger(self) -> None:
                """Read what a refused client still sends (briefly, boundedly) before closing:
                closing with bytes unread resets the connection, and the reset can overtake
                the refusal, which the client would then never read."""
                self._server().lingers(self.request)
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_WR)
                    until = time.monotonic() + LINGER_SECONDS
                    dropped = 0
                    while dropped < MAX_HEAD + MAX_BODY and (left := until - time.monotonic()) > 0:
                        self.connection.settimeout(left)
                        chunk = self.connection.recv(65536)
                        if not chunk:
                            return
                        dropped += len(chunk)

            def _reply(self, status: int, body: bytes, content_type: str, **extra: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in extra.items():
                    self.send_header(name.title(), value)
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        return Handler
