"""The pool of a PostgreSQL connection's transport, on real PostgreSQL: who holds a server
connection when, how long a lease waits, what a broken one becomes, what close leaves.

Each test names its connection uniquely, so `pg_stat_activity` rows with its application name
(`bridge <connection>`) are this test's connections and nobody else's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from bridge.config.models import PostgresConnection
from bridge.envelope import Envelope, Headers
from bridge.errors import TransportUnavailable
from bridge.transports import load
from bridge.transports.sql import Transport as SqlTransport
from bridge.transports.sql.dialects.base import scalar
from tests.conftest import unique

pytestmark = pytest.mark.integration


def message(i: int) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", f"id-{i}")]), b"{}")


def ids(envelopes: Any) -> list[str]:
    return [e.headers.get("NServiceBus.MessageId") for e in envelopes]


def held(dsn: str, application: str) -> list[str]:
    """The state of each server connection of `application` ('idle', 'idle in transaction')."""
    with psycopg.connect(dsn, autocommit=True) as db:
        rows = db.execute(
            "SELECT state FROM pg_stat_activity WHERE application_name = %s ORDER BY state",
            (application,),
        ).fetchall()
    return [str(state) for (state,) in rows]


def run_until_idle(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", "run", "-c", str(config), "--until-idle", "2"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


class Site:
    def __init__(self, dsn: str, schema: str, **pool: Any) -> None:
        self.dsn = dsn
        self.connection = unique("pooled")
        self.application = f"bridge {self.connection}"
        config = PostgresConnection(type="postgresql", dsn=dsn, schema=schema, **pool)
        self.transport = cast(SqlTransport, load(self.connection, config))

    def held(self) -> list[str]:
        return held(self.dsn, self.application)

    async def queue(self, *messages: Envelope) -> str:
        name = unique("Q")
        await self.transport.install([name])
        if messages:
            sink = self.transport.sink(name)
            await sink.send(list(messages))
            await sink.close()
        return name


@pytest.fixture
async def one(pg_dsn: str, pg_schema: str) -> AsyncIterator[Site]:
    """A transport whose routes share one server connection, and wait for it 0.5 s at most."""
    site = Site(pg_dsn, pg_schema, pool_size=1, pool_timeout=0.5)
    yield site
    await site.transport.close()


async def test_a_source_polling_an_empty_table_holds_no_connection_between_polls(
    one: Site,
) -> None:
    name = await one.queue()
    source, sink = one.transport.source(name), one.transport.sink(name)
    try:
        assert ids((await source.receive_batch(10, 0.3)).messages) == []  # several polls
        await sink.send([message(1)])  # the connection the polls gave back
        # one pooled connection, not the source's and the sink's own, idle between
        # transactions; and the one install used
        assert one.held() == ["idle", "idle"]
        batch = await source.receive_batch(10, 5.0)
        assert ids(batch.messages) == ["id-1"]
        assert one.held() == ["idle", "idle in transaction"]  # the batch holds it until settled
        await batch.commit()
        assert one.held() == ["idle", "idle"]
    finally:
        await source.close()
        await sink.close()


async def test_a_lease_waits_at_most_pool_timeout_then_fails_retriably(one: Site) -> None:
    name = await one.queue(message(1))
    source, sink = one.transport.source(name), one.transport.sink(name)
    try:
        batch = await source.receive_batch(10, 5.0)  # holds the pool's only connection
        started = time.monotonic()
        with pytest.raises(TransportUnavailable, match="no free connection in its pool of 1"):
            await sink.send([message(2)])
        assert 0.4 < time.monotonic() - started < 3.0
        await batch.commit()
        await sink.send([message(2)])  # given back with the commit
        again = await source.receive_batch(10, 5.0)
        assert ids(again.messages) == ["id-2"]
        await again.commit()
    finally:
        await source.close()
        await sink.close()


async def test_a_source_receives_ahead_only_while_a_connection_is_free(
    pg_dsn: str, pg_schema: str
) -> None:
    """A loop that holds one connection never waits for a second: receiving ahead needs a
    free one at once, and sources hold at most all but one (the last is for sends)."""
    site = Site(pg_dsn, pg_schema, pool_size=3, pool_timeout=0.5)
    name = await site.queue(*(message(i) for i in range(6)))
    source, other = site.transport.source(name), site.transport.source(name)
    try:
        first = await source.receive_batch(2, 5.0)
        assert source.receives_ahead  # two of three are free, one of them for sources
        taken = await other.receive_batch(2, 5.0)  # another route's loop takes it
        assert not source.receives_ahead
        await taken.abort()
        assert source.receives_ahead
        ahead = await source.receive_batch(2, 5.0)
        assert ids(first.messages) == ["id-0", "id-1"]
        assert ids(ahead.messages) == ["id-2", "id-3"]
        await first.commit()
        await ahead.commit()
    finally:
        await source.close()
        await other.close()
        await site.transport.close()


async def test_a_pooled_connection_commits_a_receive_without_the_flush_and_a_send_with_it(
    one: Site,
) -> None:
    """`synchronous_commit = off` is the receive's transaction's alone (SET LOCAL): the same
    server connection, given back and leased by a sink, waits for the flush again, as would
    whatever a pooler in transaction mode runs on that server session next."""
    name = await one.queue(message(1))
    source, sink = one.transport.source(name), one.transport.sink(name)
    show = "SHOW synchronous_commit"
    pid = "SELECT pg_backend_pid()"
    try:
        batch = await source.receive_batch(10, 5.0)
        receiving = await source._connection.run(lambda db: (scalar(db, show), scalar(db, pid)))
        await batch.commit()
        sending = await sink._connection.run(lambda db: (scalar(db, show), scalar(db, pid)))
        assert receiving[0] == "off" and sending[0] == "on"
        assert receiving[1] == sending[1]  # one server connection
    finally:
        await source.close()
        await sink.close()


async def test_a_connection_killed_while_idle_fails_one_lease_and_is_discarded(
    pg_dsn: str, pg_schema: str
) -> None:
    site = Site(pg_dsn, pg_schema, pool_size=3)
    name = await site.queue(message(1))
    pool = site.transport.pool
    assert pool is not None and pool.open == 1 and pool.idle == 1  # the send's, given back
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND state = 'idle'",
            (site.application,),
        )
    sink = site.transport.sink(name)
    try:
        with pytest.raises(TransportUnavailable):
            await sink.send([message(2)])  # on the killed one, found broken
        assert pool.open == 0  # discarded, not given back
        await sink.send([message(2)])  # a new one
        assert pool.open == 1 and pool.idle == 1
    finally:
        await sink.close()
        await site.transport.close()


async def test_close_fails_a_waiting_lease_at_once_and_leaves_nothing_open(
    pg_dsn: str, pg_schema: str
) -> None:
    site = Site(pg_dsn, pg_schema, pool_size=1, pool_timeout=60)
    name = await site.queue(message(1))
    source, sink = site.transport.source(name), site.transport.sink(name)
    batch = await source.receive_batch(10, 5.0)
    assert ids(batch.messages) == ["id-1"]
    waiting = asyncio.create_task(sink.send([message(2)]))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    started = time.monotonic()
    await site.transport.close()
    with pytest.raises(TransportUnavailable, match="closed"):
        await waiting
    assert time.monotonic() - started < 10
    for _ in range(50):  # a backend leaves pg_stat_activity as it exits, just after
        if not site.held():
            break
        await asyncio.sleep(0.1)
    assert site.held() == []
    with psycopg.connect(pg_dsn) as db:  # the batch was rolled back: its row is still there
        assert db.execute(f'SELECT count(*) FROM "{pg_schema}"."{name}"').fetchone() == (1,)


async def test_routes_that_wait_on_each_others_pools_back_off_instead_of_deadlocking(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    """Two connections of one connection each: a loop of A -> B holds A's while it waits for
    B's, a loop of B -> A the other way round. A wait ends after `pool_timeout` with a
    retriable error, the batch goes back, the loop backs off, and everything arrives."""
    a, b = unique("a"), unique("b")
    qa, qb, out_a, out_b = (unique(n) for n in ("qa", "qb", "outa", "outb"))
    config = tmp_path / "routes.yaml"
    pooled = f'dsn: "{pg_dsn}", schema: "{pg_schema}", pool_size: 1, pool_timeout: 0.2'
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              {a}: {{type: postgresql, {pooled}}}
              {b}: {{type: postgresql, {pooled}}}
            routes:
              - {{name: ab, from: {{connection: {a}, queue: {qa}}},
                  to: {{connection: {b}, queue: {out_b}}}, batch_size: 10}}
              - {{name: ba, from: {{connection: {b}, queue: {qb}}},
                  to: {{connection: {a}, queue: {out_a}}}, batch_size: 10}}
            """
        )
    )
    site = Site(pg_dsn, pg_schema)
    count = 300
    try:
        await site.transport.install([qa, qb, out_a, out_b])
        for name in (qa, qb):
            sink = site.transport.sink(name)
            await sink.send([message(i) for i in range(count)])
            await sink.close()
        done = run_until_idle(config)
        assert done.returncode == 0, done.stderr[-3000:]
        with psycopg.connect(pg_dsn) as db:
            for name, expected in ((qa, 0), (qb, 0), (out_a, count), (out_b, count)):
                found = db.execute(f'SELECT count(*) FROM "{pg_schema}"."{name}"').fetchone()
                assert found == (expected,), name
    finally:
        await site.transport.close()


def check_connect(config: Path) -> subprocess.CompletedProcess[str]:
    for command in ("install", "check"):
        done = subprocess.run(
            [sys.executable, "-m", "bridge", command, "-c", str(config)]
            + (["--connect"] if command == "check" else []),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return done


async def test_check_connect_warns_when_the_routes_could_need_more_than_the_server_has(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    """One route of 64 loops receiving ahead could hold 128 connections of its source's
    connection: past PostgreSQL's default limit of 100 with a pool that large, well within it
    with the default pool of 10. The destination's 64 sending loops fit either way."""
    a, b = unique("a"), unique("b")
    with psycopg.connect(pg_dsn) as db:
        row = db.execute(
            "SELECT current_setting('max_connections')::int,"
            " current_setting('superuser_reserved_connections')::int"
        ).fetchone()
    assert row is not None
    limit, reserved = row
    assert limit < 129, "this test needs a server allowing fewer than 129 connections"

    def config(pool: str) -> Path:
        path = tmp_path / f"routes{len(pool)}.yaml"
        common = f'dsn: "{pg_dsn}", schema: "{pg_schema}"'
        path.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  {a}: {{type: postgresql, {common}{pool}}}
                  {b}: {{type: postgresql, {common}}}
                routes:
                  - {{name: wide, from: {{connection: {a}, queue: {unique("in")}}},
                      to: {{connection: {b}, queue: {unique("out")}}}, concurrency: 64}}
                """
            )
        )
        return path

    warned = check_connect(config(", pool_size: 200")).stdout
    (line,) = [line for line in warned.splitlines() if "server connections" in line]
    assert line.startswith(
        f"{a}: warning: the routes could hold 129 server connections at once in one `bridge "
        "run` process (64 route loops, pool_size 200, and 1 for administration), but the server "
        "has "
    )
    assert f"({limit} allowed - {reserved} reserved for superusers - " in line
    assert "held by other clients)" in line and "--workers N" in line
    assert "server connections" not in check_connect(config("")).stdout  # 11 of them
