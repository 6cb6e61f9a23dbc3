"""The service's HTTP face on a real `bridge run`: health, readiness, routes, metrics."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import struct
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.localkafka import free_port

pytestmark = pytest.mark.integration


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(condition: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():  # type: ignore[operator]
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


BRIDGE = [sys.executable, "-m", "bridge"]
SECRET = "s3cret"


def write_routes(path: Path, port: int, destination: str) -> Path:
    where = "topic" if destination == "kafka" else "queue"
    path.write_text(
        textwrap.dedent(
            f"""\
            http: {{host: 127.0.0.1, port: {port}}}
            connections:
              a: {{type: sqlite, path: "{path.parent / "a.db"}"}}
              b: {{type: sqlite, path: "{path.parent / "b.db"}"}}
              down: {{type: postgresql, dsn: "postgresql://postgres:{SECRET}@127.0.0.1:1/x"}}
              postgresql: {{type: postgresql, dsn: "postgresql://postgres:{SECRET}@127.0.0.1:1/x"}}
              rabbitmq: {{type: rabbitmq, url: "amqp://guest:{SECRET}@127.0.0.1:1/%2F"}}
              kafka: {{type: kafka, bootstrap_servers: "127.0.0.1:1", idempotence: false}}
            routes:
              - name: a-to-{destination}
                from: {{connection: a, queue: In}}
                to: {{connection: {destination}, {where}: Out}}
            """
        )
    )
    return path


#: Rows written as a broken or late producer leaves them: unreadable headers, long expired.
POISON = ("not json", None)
EXPIRED = ('{"NServiceBus.MessageId": "late"}', "2000-01-01T00:00:00.000Z")


@dataclass
class Service:
    port: int
    log: Path  # what the bridge writes to stderr


@contextmanager
def service(
    tmp_path: Path,
    destination: str,
    count: int,
    rows: tuple[tuple[str, str | None], ...] = (),
    log_level: str = "INFO",
) -> Iterator[Service]:
    """`bridge run` of one route from SQLite to `destination`, with `count` messages waiting
    (after `rows`: raw (headers, expires) rows of the source table)."""
    setup = write_routes(tmp_path / "setup.yaml", 0, "b")
    subprocess.run([*BRIDGE, "install", "-c", str(setup)], check=True, capture_output=True)
    with sqlite3.connect(tmp_path / "a.db") as db:
        db.executemany(
            "INSERT INTO \"In\" (id, headers, expires, body) VALUES (?, ?, ?, x'00')",
            [(f"raw-{i}", headers, expires) for i, (headers, expires) in enumerate(rows)],
        )
    if count:
        send = [*BRIDGE, "send", "a", "In", "--count", str(count), "-c", str(setup)]
        subprocess.run(send, check=True, capture_output=True)
    port = free_port()
    config = write_routes(tmp_path / "routes.yaml", port, destination)
    log = tmp_path / "bridge.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [*BRIDGE, "run", "-c", str(config), "--log-level", log_level], stderr=stderr
        )
    try:
        yield Service(port, log)
    finally:
        process.terminate()
        process.wait(timeout=30)
        err = log.read_text()
        assert process.returncode == 0, err  # SIGTERM: finish the batch, commit, exit 0
        assert SECRET not in err


def test_health_readiness_routes_and_metrics(tmp_path: Path) -> None:
    with service(tmp_path, "b", 40, rows=(POISON, EXPIRED)) as running:
        check_running_service(running.port)


def metric(text: str, name: str, route: str = "a-to-b", **labels: str) -> float:
    """The value of one sample of /metrics, by name and labels (the route's among them);
    bucket bounds (`le`) compare as numbers."""
    wanted = {"route": route, **labels}
    for match in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if "le" in found:
            found["le"] = str(float(found["le"]))
        if all(found.get(k) == (str(float(v)) if k == "le" else v) for k, v in wanted.items()):
            return float(match.group(2))
    raise AssertionError(f"no sample {name} {wanted} in /metrics")


def check_running_service(port: int) -> None:
    wait_for(lambda: get(port, "/healthz")[0] == 200)
    wait_for(lambda: get(port, "/readyz")[0] == 200)
    wait_for(lambda: json.loads(get(port, "/routes")[1])["routes"][0]["forwarded"] == 40)
    (route,) = json.loads(get(port, "/routes")[1])["routes"]
    assert route["name"] == "a-to-b" and route["state"] == "running"
    assert route["from"] == {"connection": "a", "address": "In"}
    assert route["last_error"] is None
    assert route["poison"] == 1 and route["expired"] == 1
    status, body = get(port, "/metrics")
    text = body.decode()
    assert status == 200
    assert metric(text, "bridge_messages_forwarded_total") == 40
    assert metric(text, "bridge_messages_expired_total") == 1
    assert metric(text, "bridge_messages_failed_total") == 1
    # nothing failed to send: the retry counters are there, at 0, for rate() to start from
    assert metric(text, "bridge_messages_retried_total") == 0
    assert metric(text, "bridge_batches_retried_total") == 0
    assert metric(text, "bridge_messages_in_flight") == 0
    assert metric(text, "bridge_source_depth") >= 0  # looked at when the service started
    # the poison row and the 40 messages came in batches of at most 100 (one receive or more)
    assert metric(text, "bridge_batch_size_sum") == 41
    assert metric(text, "bridge_batch_size_bucket", le="100") >= 1
    for histogram in ("bridge_batch_duration_seconds", "bridge_end_to_end_latency_seconds"):
        for le in ("0.001", "60", "120", "300", "900", "3600", "+Inf"):
            metric(text, f"{histogram}_bucket", le=le)
    assert metric(text, "bridge_end_to_end_latency_seconds_count") >= 1
    assert get(port, "/nope")[0] == 404


def test_a_route_in_backoff_is_not_ready_and_says_why(tmp_path: Path) -> None:
    with service(tmp_path, "down", 1) as running:
        port = running.port
        wait_for(lambda: get(port, "/readyz")[0] == 503)
        wait_for(lambda: json.loads(get(port, "/routes")[1])["routes"][0]["last_error"])
        _, body = get(port, "/readyz")
        assert json.loads(body)["not_ready"] == [{"route": "a-to-down", "state": "backoff"}]
        (route,) = json.loads(get(port, "/routes")[1])["routes"]
        assert route["state"] == "backoff" and route["retried"] >= 1
        assert "TransportUnavailable" in route["last_error"]
        assert SECRET not in route["last_error"]
        assert get(port, "/healthz")[0] == 200  # alive all the same
        text = get(port, "/metrics")[1].decode()
        assert metric(text, "bridge_batches_retried_total", route="a-to-down") >= 1
        assert metric(text, "bridge_messages_forwarded_total", route="a-to-down") == 0


@pytest.mark.parametrize("destination", ["postgresql", "rabbitmq", "kafka"])
def test_an_unreachable_destination_is_not_ready_behind_an_empty_source(
    tmp_path: Path, destination: str
) -> None:
    """Sinks connect at their first send; the route's probe must find the outage before."""
    name = f"a-to-{destination}"
    with service(tmp_path, destination, 0) as running:
        port = running.port
        wait_for(lambda: json.loads(get(port, "/routes")[1])["routes"][0]["last_error"])
        status, body = get(port, "/readyz")
        assert status == 503
        assert json.loads(body)["not_ready"] == [{"route": name, "state": "backoff"}]
        (route,) = json.loads(get(port, "/routes")[1])["routes"]
        assert route["state"] == "backoff" and route["forwarded"] == 0
        assert "TransportUnavailable" in route["last_error"]
        assert "127.0.0.1" in route["last_error"] or destination in route["last_error"]
        assert SECRET not in route["last_error"]


def test_a_client_resetting_its_connection_costs_one_debug_line_and_no_traceback(
    tmp_path: Path,
) -> None:
    """A probe that gives up closes with a TCP reset, before or in the middle of its request.
    The service notes each at DEBUG, logs no error or traceback, and answers the next one."""
    with service(tmp_path, "b", 0, log_level="DEBUG") as running:
        wait_for(lambda: get(running.port, "/readyz")[0] == 200)
        for request in (b"", b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n"):
            with socket.create_connection(("127.0.0.1", running.port), timeout=5) as client:
                # linger on, timeout 0: close() sends RST instead of FIN
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.sendall(request)
        wait_for(lambda: running.log.read_text().count("left early") == 2)
        assert get(running.port, "/healthz") == (200, b'{"status": "ok"}')
        assert get(running.port, "/readyz")[0] == 200
    log = running.log.read_text()
    resets = [line for line in log.splitlines() if "left early" in line]
    assert len(resets) == 2 and all(" DEBUG bridge.http: " in line for line in resets), resets
    assert "Connection reset by peer" in resets[0]
    assert "Traceback" not in log and "Exception occurred" not in log, log
    assert not [line for line in log.splitlines() if " ERROR " in line], log
