"""TLS end to end, against certificates of a throwaway CA made here (tests/support/tls.py):
PostgreSQL with `sslmode=verify-full`, RabbitMQ over `amqps`, Kafka over SSL.

The servers are private ones, started only by these tests, each serving a certificate for
`localhost` only: a PostgreSQL cluster with `ssl=on` (tests/support/pgserver.py) and a RabbitMQ
node whose AMQP and management API listen only with TLS (tests/support/rabbitmqnode.py). The
local Kafka broker (tansu 0.6.0) takes `--cert` and `--key` but cannot serve TLS: clap puts both
in one exclusive group (tansu-cli/src/cli/broker.rs:97-104, "the argument '--cert <CERT>'
cannot be used with '--key <KEY>'"), a certificate without its key builds no TLS config
(broker.rs:265-267), and the acceptor it would build is never used
(tansu-broker/src/broker.rs:268, `let _acceptor`). So a TLS front made by the tests (the fault
proxy with a server context) listens for it, and the broker advertises that front as
`localhost:PORT`: aiokafka's whole TLS path (context, chain and host name checks, for the
bootstrap and the advertised broker) runs as against a broker of its own.

Each transport moves messages both ways over verified TLS, and refuses a wrong CA or a wrong
host name (the certificate is for localhost; 127.0.0.1 is connected to) with `TlsRefused`:
`bridge check --connect` says FAILED with the reason, `bridge run --until-idle` exits 1 within
seconds naming the connection, and nothing leaves the source.
"""

from __future__ import annotations

import sqlite3
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_refused_access import SECRET, bridge, get, write_routes
from tests.support.faultproxy import FaultProxy
from tests.support.localkafka import LocalKafka, free_port
from tests.support.pgserver import PrivateServer
from tests.support.rabbitmqnode import PrivateRabbitMQ
from tests.support.tls import Pki, make_pki

pytestmark = pytest.mark.integration

BRIDGE = [sys.executable, "-m", "bridge"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


#: Where a server listens: its port, and for RabbitMQ its management API's port.
Ports = tuple[int, ...]


@pytest.fixture(scope="module")
def tls_postgresql(pki: Pki) -> Iterator[Ports]:
    with PrivateServer(tls=(pki.server_cert, pki.server_key)) as server:
        yield (server.port,)


@pytest.fixture(scope="module")
def tls_rabbitmq(pki: Pki) -> Iterator[Ports]:
    with PrivateRabbitMQ(pki.server_cert, pki.server_key) as node:
        yield node.port, node.management_port


@pytest.fixture(scope="module")
def tls_kafka(pki: Pki) -> Iterator[Ports]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    broker_port = free_port()
    with (
        FaultProxy("127.0.0.1", broker_port, tls=context) as front,
        LocalKafka(broker_port, advertised=f"localhost:{front.port}"),
    ):
        yield (front.port,)


def depth(tmp_path: Path, table: str) -> int:
    """Messages in a queue table of the test's SQLite file."""
    with sqlite3.connect(tmp_path / "local.db") as db:
        (count,) = db.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    return int(count)


def connection(kind: str, host: str, ca: Path, ports: Ports, password: str) -> str:
    """The connection line of routes.yaml for `kind`, connecting to `host` and trusting `ca`."""
    port = ports[0]
    if kind == "postgresql":
        dsn = (
            f"postgresql://postgres:{password}@{host}:{port}/postgres"
            f"?sslmode=verify-full&sslrootcert={ca}"
        )
        return f'{{type: postgresql, dsn: "{dsn}", schema: public}}'
    if kind == "rabbitmq":
        url = f"amqps://guest:{password}@{host}:{port}/%2F?ssl_options={{'ca_certs':'{ca}'}}"
        # Quorum queues: the delivery limits are checked through the API, over https too.
        management = f"https://{host}:{ports[1]}/"
        return f'{{type: rabbitmq, url: "{url}", management_url: "{management}"}}'
    return (
        f'{{type: kafka, bootstrap_servers: "{host}:{port}", idempotence: false, '
        f'security_protocol: SSL, ssl_cafile: "{ca}", partitions: 1}}'
    )


@pytest.fixture(params=["postgresql", "rabbitmq", "kafka"])
def secure(request: pytest.FixtureRequest) -> tuple[str, Ports]:
    """(kind, ports) of the transport's server with TLS."""
    kind: str = request.param
    ports: Ports = request.getfixturevalue(f"tls_{kind}")
    return kind, ports


def test_messages_cross_verified_tls_both_ways(
    tmp_path: Path, pki: Pki, secure: tuple[str, Ports]
) -> None:
    kind, ports = secure
    where = "topic" if kind == "kafka" else "queue"
    name = f"Tls{tmp_path.name[-12:].replace('_', '')}"
    group = f", group: bridge-{name}" if kind == "kafka" else ""
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        textwrap.dedent(
            f"""\
            connections:
              local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
              secure: {connection(kind, "localhost", pki.ca, ports, "guest")}
            routes:
              - {{name: out, from: {{connection: local, queue: Sales}},
                  to: {{connection: secure, {where}: {name}}}}}
              - {{name: back, from: {{connection: secure, {where}: {name}{group}}},
                  to: {{connection: local, queue: Done}}}}
            """
        )
    )
    for command in (["install"], ["send", "local", "Sales", "--count", "3"]):
        result = bridge(*command, "-c", str(routes))
        assert result.returncode == 0, result.stdout + result.stderr
    assert bridge("check", "--connect", "-c", str(routes)).stdout.count(": OK") >= 2
    result = bridge("run", "--until-idle", "2", "-c", str(routes))
    assert result.returncode == 0, result.stderr
    assert depth(tmp_path, "Done") == 3, result.stderr


#: What each refusal says: the host name mismatch (the certificate names only localhost) and a
#: certificate no trusted CA signed.
REASONS = {
    ("postgresql", "wrong-host"): 'does not match host name "127.0.0.1"',
    ("postgresql", "wrong-ca"): "certificate verify failed",
    ("rabbitmq", "wrong-host"): "certificate is not valid for '127.0.0.1'",
    ("rabbitmq", "wrong-ca"): "certificate verify failed: unable to get local issuer certificate",
    ("kafka", "wrong-host"): "certificate is not valid for '127.0.0.1'",
    ("kafka", "wrong-ca"): "certificate verify failed: unable to get local issuer certificate",
}


@pytest.mark.parametrize("case", ["wrong-host", "wrong-ca"])
def test_a_wrong_ca_or_host_name_is_refused_never_downgraded(
    tmp_path: Path, pki: Pki, secure: tuple[str, Ports], case: str
) -> None:
    kind, ports = secure
    host, ca = ("127.0.0.1", pki.ca) if case == "wrong-host" else ("localhost", pki.other_ca)
    routes = write_routes(tmp_path, connection(kind, host, ca, ports, SECRET), kind)
    reason = REASONS[kind, case]

    check = bridge("check", "--connect", "-c", str(routes))
    assert check.returncode == 1, check.stdout + check.stderr
    (failed,) = [line for line in check.stdout.splitlines() if line.startswith("refused: ")]
    assert failed.startswith("refused: FAILED: "), failed
    assert "no verified TLS connection" in failed and reason in failed, failed

    started = time.monotonic()
    run = bridge("run", "--until-idle", "2", "-c", str(routes), timeout=30)
    assert run.returncode == 1, run.stderr
    assert time.monotonic() - started < 15, run.stderr
    errors = [line for line in run.stderr.splitlines() if "route to-refused failed:" in line]
    assert errors and "connection 'refused'" in errors[0] and reason in errors[0], run.stderr
    assert SECRET not in check.stdout + check.stderr + run.stdout + run.stderr
    assert depth(tmp_path, "Sales") == 3  # nothing left the source


def test_a_service_shows_the_route_failing_on_a_refused_certificate(
    tmp_path: Path, pki: Pki, tls_postgresql: Ports
) -> None:
    """As a refused login: `failing` with the reason, not ready, retried slowly."""
    port = free_port()
    secure = connection("postgresql", "localhost", pki.other_ca, tls_postgresql, SECRET)
    routes = write_routes(tmp_path, secure, "postgresql", port)
    log = tmp_path / "bridge.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen([*BRIDGE, "run", "-c", str(routes)], stderr=stderr)
    try:
        deadline = time.monotonic() + 30
        route: dict[str, object] = {}
        while route.get("state") != "failing" or not route.get("last_error"):
            assert time.monotonic() < deadline, log.read_text()
            assert process.poll() is None, log.read_text()
            time.sleep(0.2)
            try:
                route = get(port, "/routes")[1]["routes"][0]  # type: ignore[index]
            except OSError:
                continue
        assert "TlsRefused" in str(route["last_error"])
        assert "certificate verify failed" in str(route["last_error"])
        assert get(port, "/readyz")[0] == 503
    finally:
        process.terminate()
        process.wait(timeout=30)
    text = log.read_text()
    assert "this will not go away on its own" in text
    assert SECRET not in text


def test_rabbitmq_a_management_api_whose_certificate_does_not_verify_is_refused(
    tmp_path: Path, pki: Pki, tls_rabbitmq: Ports
) -> None:
    """The API is verified with the AMQP URL's CA too: here its host name does not match."""
    port, management = tls_rabbitmq
    url = f"amqps://guest:guest@localhost:{port}/%2F?ssl_options={{'ca_certs':'{pki.ca}'}}"
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        textwrap.dedent(
            f"""\
            connections:
              local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
              secure: {{type: rabbitmq, url: "{url}",
                        management_url: "https://127.0.0.1:{management}/"}}
            routes:
              - {{name: in, from: {{connection: secure, queue: TlsApi}},
                  to: {{connection: local, queue: Done}}}}
            """
        )
    )
    install = bridge("install", "-c", str(routes))
    assert install.returncode == 1, install.stdout + install.stderr
    said = install.stdout + install.stderr
    assert f"management API at https://127.0.0.1:{management}/" in said, said
    assert "no verified TLS connection: certificate verify failed: IP address mismatch" in said
    local = tmp_path / "local.yaml"  # the SQLite side, installed on its own
    local.write_text(
        routes.read_text().replace(
            "connection: secure, queue: TlsApi", "connection: local, queue: In"
        )
    )
    assert bridge("install", "-c", str(local)).returncode == 0
    started = time.monotonic()
    run = bridge("run", "--until-idle", "2", "-c", str(routes), timeout=30)
    assert run.returncode == 1, run.stderr
    assert time.monotonic() - started < 15, run.stderr
    (failed,) = [line for line in run.stderr.splitlines() if "route in failed:" in line]
    assert "no verified TLS connection: certificate verify failed: IP address mismatch" in failed
