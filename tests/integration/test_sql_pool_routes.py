"""Many routes in one `bridge run` process share each connection's pool, on real PostgreSQL.

A registry of 150 endpoints, 75 on each of two PostgreSQL connections, derives 150 routes (one
from each endpoint's proxy on the other connection). Without a pool every route loop held its
own database connections (a source's two, a sink's one): 150 routes wanted 300-450 server
connections, past PostgreSQL's default `max_connections` of 100, and the routes that could not
connect never started. With the pool each connection name holds at most `pool_size` (the
default, 10) plus its administration connection, every route starts, and a message into each
one arrives.

The server is shared with other tests: the watch on `pg_stat_activity` fails the test (and
stops the bridge) as soon as a connection name holds more than its bound, so code without a
pool fails here within a second, long before it could exhaust the server.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bridge.envelope import Envelope, Headers
from bridge.transports import load
from bridge.transports.sql.config import PostgresConnection
from tests.conftest import unique
from tests.support.cli import run_bridge

pytestmark = pytest.mark.integration

ENDPOINTS = 150
POOL_SIZE = 10  # the default: the config does not name it
BOUND = 30.0  # seconds for every route to start, and for a message into each to arrive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ConnectionWatch:
    """Counts, every 50 ms, the server connections each application name holds; remembers the
    most seen, and trips when one goes over `bound`."""

    def __init__(self, dsn: str, names: list[str], bound: int) -> None:
        self.dsn, self.names, self.bound = dsn, names, bound
        self.most = dict.fromkeys(names, 0)
        self.tripped = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ConnectionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as db:
            while not self._stop.is_set():
                rows = db.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity"
                    " WHERE application_name = ANY(%s) GROUP BY 1",
                    (self.names,),
                ).fetchall()
                for name, count in rows:
                    self.most[name] = max(self.most[name], count)
                    if count > self.bound:
                        self.tripped.set()
                self._stop.wait(0.05)


@pytest.fixture
def second_schema(pg_dsn: str) -> Iterator[str]:
    schema = unique("t")
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f'DROP SCHEMA "{schema}" CASCADE')


def bridge(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_bridge(*args, config=config, timeout=300)


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """`bridge run` of `config`, its output into `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bridge", "run", "-c", str(config), "--log-level", "WARNING"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as page:
            return bool(page.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def arrived(dsn: str, tables: list[tuple[str, str]]) -> int:
    """How many of the (schema, table) queue tables hold a row."""
    query = " UNION ALL ".join(
        f'SELECT EXISTS (SELECT 1 FROM "{schema}"."{table}")' for schema, table in tables
    )
    with psycopg.connect(dsn, autocommit=True) as db:
        return sum(1 for (found,) in db.execute(query).fetchall() if found)


async def test_150_derived_routes_in_one_process_start_and_share_a_bounded_pool(
    tmp_path: Path, pg_dsn: str, pg_schema: str, second_schema: str
) -> None:
    left, right = unique("left"), unique("right")
    schemas = {left: pg_schema, right: second_schema}
    tag = unique("E")
    names = [f"{tag}_{i:03d}" for i in range(ENDPOINTS)]
    home = {name: left if i % 2 == 0 else right for i, name in enumerate(names)}
    port = free_port()
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            http: {{host: 127.0.0.1, port: {port}}}
            connections:
              {left}: {{type: postgresql, dsn: "{pg_dsn}", schema: "{pg_schema}"}}
              {right}: {{type: postgresql, dsn: "{pg_dsn}", schema: "{second_schema}"}}
            proxies: {{create: true, error_queue: {tag}_poison}}
            endpoints:
            """
        )
        + "".join(f"  {name}: {{connection: {home[name]}}}\n" for name in names)
    )
    # The endpoints' own queues are theirs (their installers create them); the proxies and
    # their error queues are the bridge's. Written through a connection name of the test's own.
    for connection, schema in schemas.items():
        owner = load(
            f"{connection}-owner", PostgresConnection(type="postgresql", dsn=pg_dsn, schema=schema)
        )
        await owner.install([n for n in names if home[n] == connection])
        await owner.close()
    bridge(config, "install")

    applications = [f"bridge {left}", f"bridge {right}"]
    watch = ConnectionWatch(pg_dsn, applications, POOL_SIZE + 1)  # + the administration one
    log = tmp_path / "bridge.log"
    run = start(config, log)
    try:
        with watch:
            started = time.monotonic()
            while not ready(port):
                assert run.poll() is None, log.read_text()[-3000:]
                assert not watch.tripped.is_set(), f"more than the pool: {watch.most}"
                assert time.monotonic() - started < BOUND, "not every route started"
                await asyncio.sleep(0.2)
            startup = time.monotonic() - started

            # A message into each proxy, as the other connection's endpoints would send.
            for connection, schema in schemas.items():
                sender = load(
                    f"{connection}-sender",
                    PostgresConnection(type="postgresql", dsn=pg_dsn, schema=schema),
                )
                for name in names:
                    if home[name] != connection:  # its proxy lives here
                        sink = sender.sink(name)
                        await sink.send(
                            [Envelope(Headers([("NServiceBus.MessageId", name)]), b"{}")]
                        )
                        await sink.close()
                await sender.close()
            sent = time.monotonic()
            destinations = [(schemas[home[name]], name) for name in names]
            while (count := arrived(pg_dsn, destinations)) < ENDPOINTS:
                assert not watch.tripped.is_set(), f"more than the pool: {watch.most}"
                assert time.monotonic() - sent < BOUND, (
                    f"{count} of {ENDPOINTS} arrived; {log.read_text()[-3000:]}"
                )
                await asyncio.sleep(0.2)
            delivered = time.monotonic() - sent
            assert not watch.tripped.is_set(), f"more than the pool: {watch.most}"
    finally:
        run.terminate()
        code = run.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
    assert "too many clients" not in log.read_text()
    assert "no free connection" not in log.read_text()  # no route waited out pool_timeout
    print(f"started in {startup:.1f} s, delivered in {delivered:.1f} s, most held {watch.most}")
    assert max(watch.most.values()) <= POOL_SIZE + 1
