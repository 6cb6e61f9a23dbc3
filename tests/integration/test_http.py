"""The service's HTTP face on a real `bridge run`: health, readiness, routes, metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bridge.devbroker import free_port

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
    path.write_text(
        textwrap.dedent(
            f"""\
            http: {{host: 127.0.0.1, port: {port}}}
            connections:
              a: {{type: sqlite, path: "{path.parent / "a.db"}"}}
              b: {{type: sqlite, path: "{path.parent / "b.db"}"}}
              down: {{type: postgresql, dsn: "postgresql://postgres:{SECRET}@127.0.0.1:1/x"}}
            routes:
              - name: a-to-{destination}
                from: {{connection: a, queue: In}}
                to: {{connection: {destination}, queue: Out}}
            """
        )
    )
    return path


@contextmanager
def service(tmp_path: Path, destination: str, count: int) -> Iterator[int]:
    """`bridge run` of one route from SQLite to `destination`, with `count` messages waiting."""
    setup = write_routes(tmp_path / "setup.yaml", 0, "b")
    subprocess.run([*BRIDGE, "install", "-c", str(setup)], check=True, capture_output=True)
    send = [*BRIDGE, "send", "a", "In", "--count", str(count), "-c", str(setup)]
    subprocess.run(send, check=True, capture_output=True)
    port = free_port()
    config = write_routes(tmp_path / "routes.yaml", port, destination)
    process = subprocess.Popen(
        [*BRIDGE, "run", "-c", str(config)], stderr=subprocess.PIPE, text=True
    )
    try:
        yield port
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0, err  # SIGTERM: finish the batch, commit, exit 0
        assert SECRET not in err


def test_health_readiness_routes_and_metrics(tmp_path: Path) -> None:
    with service(tmp_path, "b", 40) as port:
        check_running_service(port)


def check_running_service(port: int) -> None:
    wait_for(lambda: get(port, "/healthz")[0] == 200)
    wait_for(lambda: get(port, "/readyz")[0] == 200)
    wait_for(lambda: json.loads(get(port, "/routes")[1])["routes"][0]["forwarded"] == 40)
    (route,) = json.loads(get(port, "/routes")[1])["routes"]
    assert route["name"] == "a-to-b" and route["state"] == "running"
    assert route["from"] == {"connection": "a", "address": "In"}
    assert route["last_error"] is None
    status, body = get(port, "/metrics")
    text = body.decode()
    assert status == 200
    assert re.search(
        r'^bridge_messages_forwarded_total\{[^}]*route="a-to-b"[^}]*\} 40\.0$', text, re.M
    )
    assert "bridge_batch_duration_seconds_bucket" in text
    assert "bridge_end_to_end_latency_seconds_count" in text
    assert get(port, "/nope")[0] == 404


def test_a_route_in_backoff_is_not_ready_and_says_why(tmp_path: Path) -> None:
    with service(tmp_path, "down", 1) as port:
        wait_for(lambda: get(port, "/readyz")[0] == 503)
        wait_for(lambda: json.loads(get(port, "/routes")[1])["routes"][0]["last_error"])
        _, body = get(port, "/readyz")
        assert json.loads(body)["not_ready"] == [{"route": "a-to-down", "state": "backoff"}]
        (route,) = json.loads(get(port, "/routes")[1])["routes"]
        assert route["state"] == "backoff" and route["retried"] >= 1
        assert "TransportUnavailable" in route["last_error"]
        assert SECRET not in route["last_error"]
        assert get(port, "/healthz")[0] == 200  # alive all the same
