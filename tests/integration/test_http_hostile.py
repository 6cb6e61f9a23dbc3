"""Every HTTP API the bridge serves, fed garbage by a fuzzer and by hostile clients.

Each API in `APPS` runs as a real `bridge run` process and serves its OpenAPI document; the
suite loads the document from the running process, so a path, a method or a reply shape that
is served but not documented (or documented but not served) fails here. Per API:

- schemathesis generates requests from the document (its examples, coverage and fuzzing phases,
  50 examples per operation): no 5xx the document does not list, and every reply conforms to
  the document (status, content type, headers, JSON schema); a method the document does not
  list is 405 with `Allow`.
- hand-made requests a fuzzer does not make: HEAD, unknown methods and paths, malformed
  request lines and headers, oversized ones (414, 431), bodies where none is taken.
- slowloris: hundreds of connections that trickle their headers a byte at a time neither
  starve the probes (each answers within a second) nor grow the process's threads past
  `MAX_CONNECTIONS`.

No API has authentication yet; one that has joins `APPS`, and schemathesis' `ignored_auth`
check (on by default) then fails any operation whose security is not enforced.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.engine import events

from bridge.service.http import HEAD_SECONDS, MAX_CONNECTIONS, MAX_HEAD, MAX_REQUEST_LINE
from tests.support.localkafka import free_port

pytestmark = pytest.mark.integration

BRIDGE = [sys.executable, "-m", "bridge"]

#: Every HTTP API the bridge serves: its name and the `bridge run` flags that serve it. An API
#: added later (a console, a gateway) is added here and every test below runs against it.
APPS = {
    "run": [],
    # the primary of --workers serves the aggregate of its workers, through the same server
    "workers": ["--workers", "1"],
}


@dataclass
class App:
    base_url: str
    openapi_url: str
    port: int
    pid: int


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_ready(base_url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "bridge run exited"
        try:
            if _get(f"{base_url}/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("bridge run was not ready in time")


@pytest.fixture(scope="module", params=sorted(APPS))
def app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """A running `bridge run` with one SQLite route, serving the API `request.param`."""
    tmp = tmp_path_factory.mktemp(f"http-{request.param}")
    port = free_port()
    config = tmp / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            http: {{host: 127.0.0.1, port: {port}}}
            connections:
              a: {{type: sqlite, path: "{tmp / "a.db"}"}}
              b: {{type: sqlite, path: "{tmp / "b.db"}"}}
            routes:
              - name: a-to-b
                from: {{connection: a, queue: In}}
                to: {{connection: b, queue: Out}}
            """
        )
    )
    subprocess.run([*BRIDGE, "install", "-c", str(config)], check=True, capture_output=True)
    log = tmp / "bridge.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [*BRIDGE, "run", "-c", str(config), *APPS[request.param]], stderr=stderr
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url, process)
        yield App(base_url, f"{base_url}/openapi.json", port, process.pid)
        assert process.poll() is None, "bridge run died under the tests"
    finally:
        process.terminate()
        process.wait(timeout=30)
    err = log.read_text()
    assert process.returncode == 0, err
    assert "Traceback" not in err, err  # no request made the server fail


# -- the fuzzer -------------------------------------------------------------------------------

CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {"max-examples": 50, "database": "none"},
        "request-timeout": 5,
        # a 5xx is judged by `no_undocumented_server_error` instead
        "checks": {"not_a_server_error": {"enabled": False}},
    }
)


@schemathesis.check
def no_undocumented_server_error(ctx: Any, response: Any, case: Any) -> None:
    """A 5xx fails unless the document lists that very status for the operation: /readyz's 503
    says "not ready", which is its job, not a failure of the server."""
    status = response.status_code
    if status >= 500 and str(status) not in case.operation.responses.status_codes:
        raise AssertionError(f"{case.method} {case.path} answered {status}")


def test_every_operation_holds_to_the_document_under_fuzzing(app: App) -> None:
    """schemathesis' own engine runs its phases (examples, coverage: every method the document
    does not list, fuzzing: 50 examples an operation) and all its checks on every operation.
    (Its pytest plugin is not used: it reaches into pytest internals that pytest 9 dropped.)"""
    schema = schemathesis.openapi.from_url(app.openapi_url, config=CONFIG)
    tested: set[str] = set()
    failed: list[str] = []
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.FatalError):
            raise event.exception
        if isinstance(event, events.NonFatalError):
            failed.append(f"{event.label}: {event.value!r}")
        if not isinstance(event, events.ScenarioFinished) or event.label is None:
            continue
        tested.add(event.label)
        for checks in event.recorder.checks.values():
            failed += [
                f"{event.label} ({event.phase}): {check.name}: {check.failure_info.failure.title}"
                f"\n{check.failure_info.failure.message}\n{check.failure_info.code_sample}"
                for check in checks
                if check.failure_info is not None
            ]
    assert not failed, "\n\n".join(sorted(set(failed)))
    # every operation but the document's own, which schemathesis leaves out of its run (the
    # hand-made requests below cover it)
    assert tested >= {f"GET {path}" for path in _paths(app) if path != "/openapi.json"}, tested


# -- hand-made requests ------------------------------------------------------------------------


def _paths(app: App) -> list[str]:
    return sorted(json.loads(_get(app.openapi_url)[1])["paths"])


def _request(app: App, method: str, target: str) -> tuple[http.client.HTTPResponse, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=5)
    try:
        connection.request(method, target)
        response = connection.getresponse()
        return response, response.read()
    finally:
        connection.close()


def test_the_document_lists_every_path_served(app: App) -> None:
    document = json.loads(_get(app.openapi_url)[1])
    assert document["openapi"].startswith("3.")
    assert _paths(app) == ["/healthz", "/metrics", "/openapi.json", "/readyz", "/routes"]
    assert all(set(operations) == {"get"} for operations in document["paths"].values())


def test_head_answers_as_get_does_without_a_body(app: App) -> None:
    for path in _paths(app):
        got, _ = _request(app, "GET", path)
        head = http.client.HTTPConnection("127.0.0.1", app.port, timeout=5)
        head.request("HEAD", path)
        response = head.getresponse()
        assert response.status == got.status == 200, path
        assert response.getheader("Content-Type") == got.getheader("Content-Type"), path
        assert response.read() == b"", path
        head.close()


@pytest.mark.parametrize(
    "method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "QUERY", "BREW", "get"]
)
def test_another_method_is_405_with_allow(app: App, method: str) -> None:
    for path in _paths(app):
        response, body = _request(app, method, path)
        assert response.status == 405, (method, path)
        assert response.getheader("Allow") == "GET, HEAD"
        assert method in json.loads(body)["error"]


def test_unknown_paths_are_404_and_query_strings_are_ignored(app: App) -> None:
    for target in ("/", "/nope", "/healthz/", "/healthz.json", "*", "/%00", "/" + "x" * 4000):
        response, body = _request(app, "GET", target)
        assert response.status == 404, target
        assert json.loads(body)["error"].startswith("no such path")
    for query in ("?", "?a=1&a=2", "?%zz=&&==", "?" + "q" * 4000):
        assert _get(f"{app.base_url}/healthz{query}")[0] == 200, query


def _raw(app: App, data: bytes) -> bytes:
    """Send `data` as is; what comes back before the server closes the connection."""
    with socket.create_connection(("127.0.0.1", app.port), timeout=10) as client:
        client.sendall(data)
        chunks = []
        while chunk := client.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET /healthz HTTX/1.1\r\n\r\n", 400),
        (b"\x00\xff\xfe\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n: no name\r\nno colon\r\n\r\n", 200),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
        # digits to str.isdigit() (superscripts, read as Latin-1) that int() refuses
        (b"GET /healthz HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: 1\xb9\r\n\r\n", 400),
        # more digits than int() reads (4300): too large, not a failure
        (b"GET /healthz HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 413),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405),
        (b"GET /healthz HTTP/1.0\r\n\r\n", 200),
        (b"GET /healthz HTTP/2.0\r\n\r\n", 400),  # a version it does not speak: not a 505
        (b"GET /" + b"x" * (MAX_REQUEST_LINE + 100) + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /healthz HTTP/1.1\r\nX: " + b"x" * MAX_HEAD + b"\r\n\r\n", 431),
        (b"GET /healthz HTTP/1.1\r\n" + b"X-Many: yes\r\n" * 3000 + b"\r\n", 431),
    ],
)
def test_malformed_and_oversized_requests_are_refused_not_failed(
    app: App, request_bytes: bytes, status: int
) -> None:
    reply = _raw(app, request_bytes)
    assert _status(reply) == status, reply[:200]
    if status != 200:
        assert b"Content-Type: application/json" in reply
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert _get(f"{app.base_url}/healthz")[0] == 200


def test_a_connection_that_sends_nothing_costs_nothing(app: App) -> None:
    for _ in range(20):  # a load balancer's TCP checks
        socket.create_connection(("127.0.0.1", app.port), timeout=5).close()
    with socket.create_connection(("127.0.0.1", app.port), timeout=5) as client:
        client.shutdown(socket.SHUT_WR)  # sends nothing and says so: closed unanswered
        assert client.recv(1024) == b""
    assert _get(f"{app.base_url}/healthz")[0] == 200


# -- slow clients ------------------------------------------------------------------------------


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


def _probe(url: str) -> float:
    started = time.monotonic()
    status, _ = _get(url)
    took = time.monotonic() - started
    assert status == 200, url
    return took


class _Slowloris:
    """`count` connections that each send a request's head a byte at a time, opening a new one
    whenever the server cuts one off, until stopped."""

    HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.socks = [self._open() for _ in range(count)]
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> tuple[socket.socket, int]:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.setblocking(False)
        return sock, 0

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for i, (sock, sent) in enumerate(self.socks):
                try:
                    sock.send(self.HEAD[sent : sent + 1])
                    self.socks[i] = (sock, sent + 1)
                except OSError:  # cut off: come back with a new one, as an attacker would
                    sock.close()
                    self.socks[i] = self._open()
                    self.reopened += 1

    def __enter__(self) -> _Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock, _ in self.socks:
            sock.close()


def test_a_client_that_trickles_its_headers_is_cut_off_at_the_deadline(app: App) -> None:
    """Each byte comes well within any per-read timeout; the request as a whole does not."""
    clients = [socket.create_connection(("127.0.0.1", app.port), timeout=5) for _ in range(5)]
    started = time.monotonic()
    closed_after: list[float] = []
    request = _Slowloris.HEAD
    for sent in range(100):
        for client in [c for c in clients if c.fileno() != -1]:
            readable, _, _ = select.select([client], [], [], 0)
            if readable or not _send(client, request[sent : sent + 1]):
                closed_after.append(time.monotonic() - started)
                client.close()
        if len(closed_after) == len(clients):
            break
        time.sleep(0.3)
    assert len(closed_after) == len(clients)
    # Cut off at the deadline, not at a per-read timeout (each byte comes within 0.3 s); the
    # upper bound leaves a busy machine room.
    assert min(closed_after) > HEAD_SECONDS - 0.5 and max(closed_after) < HEAD_SECONDS + 5


def _send(client: socket.socket, data: bytes) -> bool:
    try:
        client.send(data)
        return True
    except OSError:
        return False


def test_slow_clients_do_not_starve_the_probes(app: App) -> None:
    threads_before = _threads(app.pid)
    with _Slowloris(app.port, 200) as attack:
        slowest = 0.0
        most_threads = 0
        deadline = time.monotonic() + 7  # past HEAD_SECONDS: the first ones have been cut off
        while time.monotonic() < deadline:
            slowest = max(slowest, _probe(f"{app.base_url}/healthz"))
            slowest = max(slowest, _probe(f"{app.base_url}/readyz"))
            most_threads = max(most_threads, _threads(app.pid))
            time.sleep(0.2)
        assert attack.reopened > 0  # the server did cut slow connections off
    # A starved probe would wait for a slow client's HEAD_SECONDS; a busy machine costs less.
    assert slowest < 3.0, f"a probe took {slowest:.2f}s"
    assert most_threads <= threads_before + MAX_CONNECTIONS + 16, (threads_before, most_threads)
