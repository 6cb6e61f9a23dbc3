"""A refused login on the real services: `bridge check --connect` says FAILED with the reason,
`bridge run --until-idle` exits 1 at once, and a service shows the route `failing`.

PostgreSQL here trusts every local login, so it refuses an unknown role and a missing
database, not a wrong password; RabbitMQ refuses a wrong password and a vhost that does not
exist. Kafka: the local broker cannot refuse a SASL login as Apache Kafka does, so a listener
that answers only that (tests/support/refusingkafka.py) stands in for the broker's login step,
and aiokafka's real bootstrap runs against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.localkafka import free_port
from tests.support.refusingkafka import REFUSAL, RefusingKafka

pytestmark = pytest.mark.integration

SECRET = "s3cret-Pw"
BRIDGE = [sys.executable, "-m", "bridge"]


def bridge(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*BRIDGE, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy()
    )
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result


@pytest.fixture(scope="module")
def kafka_refusing() -> Iterator[str]:
    with RefusingKafka() as listener:
        yield listener.bootstrap_servers


def refused_connection(case: str, pg_dsn: str, rabbitmq_url: str, kafka: str) -> tuple[str, str]:
    """(connection line, what the refusal says) for each case."""
    pg = pg_dsn.rsplit("/", 1)[0].replace("postgres@", f"postgres:{SECRET}@")
    amqp = rabbitmq_url.rsplit("/", 1)[0]
    return {
        "postgresql-unknown-role": (
            f'{{type: postgresql, dsn: "{pg.replace("postgres:", "nobody_x:")}/test"}}',
            'role "nobody_x" does not exist',
        ),
        "postgresql-missing-database": (
            f'{{type: postgresql, dsn: "{pg}/no_such_db_x"}}',
            'database "no_such_db_x" does not exist',
        ),
        "rabbitmq-wrong-password": (
            f'{{type: rabbitmq, url: "{amqp.replace("guest:guest@", f"guest:{SECRET}@")}/%2F"}}',
            "ACCESS_REFUSED - Login was refused",
        ),
        "rabbitmq-missing-vhost": (
            f'{{type: rabbitmq, url: "{amqp}/no_such_vhost_x"}}',
            "NOT_ALLOWED - vhost no_such_vhost_x not found",
        ),
        "kafka-sasl": (
            f'{{type: kafka, bootstrap_servers: "{kafka}", security_protocol: SASL_PLAINTEXT, '
            f'sasl_mechanism: PLAIN, sasl_username: bridge, sasl_password: "{SECRET}"}}',
            f"SaslAuthenticationFailed: {REFUSAL}",
        ),
    }[case]


CASES = [
    "postgresql-unknown-role",
    "postgresql-missing-database",
    "rabbitmq-wrong-password",
    "rabbitmq-missing-vhost",
    "kafka-sasl",
]


def write_routes(tmp_path: Path, connection: str, kind: str, port: int | None = None) -> Path:
    """A SQLite queue with 3 messages waiting, routed to the `refused` connection."""
    setup = tmp_path / "setup.yaml"
    setup.write_text(
        textwrap.dedent(
            f"""\
            connections:
              local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
            routes:
              - {{name: setup, from: {{connection: local, queue: Sales}},
                  to: {{connection: local, queue: Done}}}}
            """
        )
    )
    assert bridge("install", "-c", str(setup)).returncode == 0
    assert bridge("send", "local", "Sales", "--count", "3", "-c", str(setup)).returncode == 0
    where = "topic" if kind == "kafka" else "queue"
    path = tmp_path / "routes.yaml"
    http = f"http: {{host: 127.0.0.1, port: {port}}}\n" if port else ""
    path.write_text(
        http
        + textwrap.dedent(
            f"""\
            connections:
              local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
              refused: {connection}
            routes:
              - name: to-refused
                from: {{connection: local, queue: Sales}}
                to: {{connection: refused, {where}: Sales}}
            """
        )
    )
    return path


@pytest.mark.parametrize("case", CASES)
def test_check_connect_says_failed_with_the_reason(
    tmp_path: Path, case: str, pg_dsn: str, rabbitmq_url: str, kafka_refusing: str
) -> None:
    connection, reason = refused_connection(case, pg_dsn, rabbitmq_url, kafka_refusing)
    routes = write_routes(tmp_path, connection, case.split("-")[0])
    result = bridge("check", "--connect", "-c", str(routes))
    assert result.returncode == 1, result.stdout + result.stderr
    (failed,) = [line for line in result.stdout.splitlines() if line.startswith("refused: ")]
    assert failed.startswith("refused: FAILED: "), failed
    assert "'refused'" in failed and reason in failed
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize("case", CASES)
def test_until_idle_exits_1_within_seconds_naming_the_connection(
    tmp_path: Path, case: str, pg_dsn: str, rabbitmq_url: str, kafka_refusing: str
) -> None:
    """The README: `--until-idle` exits 1 on a failure that will not go away. Before, a
    PostgreSQL login refused while connecting was retried for ever (libpq gives no SQLSTATE
    then), and so was a SASL login aiokafka's bootstrap swallowed."""
    connection, reason = refused_connection(case, pg_dsn, rabbitmq_url, kafka_refusing)
    routes = write_routes(tmp_path, connection, case.split("-")[0])
    started = time.monotonic()
    result = bridge("run", "--until-idle", "2", "-c", str(routes), timeout=30)
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert took < 15, result.stderr
    failed = [line for line in result.stderr.splitlines() if "route to-refused failed:" in line]
    assert failed, result.stderr
    assert "connection 'refused'" in failed[0] and reason in failed[0]
    assert SECRET not in result.stdout + result.stderr
    peek = bridge("peek", "local", "Sales", "--json", "-c", str(routes))
    assert json.loads(peek.stdout)["depth"] == 3  # nothing left the source


def get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("case", ["postgresql-unknown-role", "rabbitmq-wrong-password"])
def test_a_service_shows_the_route_failing_and_says_it_will_not_pass(
    tmp_path: Path, case: str, pg_dsn: str, rabbitmq_url: str
) -> None:
    connection, reason = refused_connection(case, pg_dsn, rabbitmq_url, "127.0.0.1:1")
    port = free_port()
    routes = write_routes(tmp_path, connection, case.split("-")[0], port)
    log = tmp_path / "bridge.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen([*BRIDGE, "run", "-c", str(routes)], stderr=stderr)
    try:
        deadline = time.monotonic() + 30
        route: dict[str, object] = {}
        while route.get("state") != "failing" or not route.get("last_error"):
            assert time.monotonic() < deadline, log.read_text()
            assert process.poll() is None, log.read_text()  # a service does not give up
            time.sleep(0.2)
            try:
                route = get(port, "/routes")[1]["routes"][0]  # type: ignore[index]
            except OSError:
                continue
        assert reason in str(route["last_error"]) and "AccessRefused" in str(route["last_error"])
        status, ready = get(port, "/readyz")
        assert status == 503
        assert ready["not_ready"] == [{"route": "to-refused", "state": "failing"}]
        time.sleep(1.5)  # slow retries: about 1 s, then 2 s, 4 s, ... up to 5 minutes
        assert int(get(port, "/routes")[1]["routes"][0]["retried"]) <= 3  # type: ignore[index]
    finally:
        process.terminate()
        process.wait(timeout=30)
    text = log.read_text()
    errors = [line for line in text.splitlines() if " ERROR bridge.route: route to-refused" in line]
    assert errors, text
    assert "this will not go away on its own" in errors[0] and reason in errors[0]
    assert SECRET not in text
