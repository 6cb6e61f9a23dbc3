"""A message a SQL destination refuses for good goes to the source's error queue; the rest of
its batch is inserted. Real PostgreSQL and SQLite; the refusals are the databases' own."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from typing import cast

import psycopg
import pytest

from bridge.config.models import PostgresConnection, Route
from bridge.envelope import Envelope, Headers
from bridge.errors import MessageRejected, TransportError
from bridge.protocols import Sink, Source
from bridge.routing.runner import RouteRunner
from bridge.transports import load
from bridge.transports.memory import Broker
from bridge.transports.memory import Transport as Memory
from bridge.transports.sql import Transport as SqlTransport
from bridge.transports.sql.dialects import postgresql, sqlite
from bridge.transports.sql.errors import translate
from tests.conftest import unique
from tests.unit.test_runner import run_until

pytestmark = pytest.mark.integration

#: The destination's Headers column is narrowed to this, as on a hand-made legacy table.
HEADERS_WIDTH = 300


def message(i: int, padding: int = 0) -> Envelope:
    headers = Headers([("NServiceBus.MessageId", f"id-{i}"), ("Note", "x" * padding)])
    return Envelope(headers, f"body-{i}".encode())


@pytest.fixture
async def pg(pg_dsn: str, pg_schema: str) -> AsyncIterator[SqlTransport]:
    config = PostgresConnection.model_validate(
        {"type": "postgresql", "dsn": pg_dsn, "schema": pg_schema}
    )
    transport = cast(SqlTransport, load("shop", config))
    try:
        yield transport
    finally:
        await transport.close()


def narrow_headers(dsn: str, schema: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'ALTER TABLE "{schema}"."{table}" ALTER COLUMN headers TYPE varchar({HEADERS_WIDTH})'
        )


def count(dsn: str, schema: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
    assert row is not None
    return int(row[0])


async def test_a_row_postgresql_refuses_goes_to_the_error_queue_and_the_rest_is_inserted(
    pg: SqlTransport, pg_dsn: str, pg_schema: str
) -> None:
    dst = unique("Dst")
    await pg.install([dst])
    narrow_headers(pg_dsn, pg_schema, dst)
    memory = Memory(broker=Broker())
    route = Route.model_validate(
        {
            "name": "r",
            "from": {"connection": "mem", "queue": unique("src")},
            "to": {"connection": "shop", "queue": dst},
            "error_queue": unique("error"),
            "batch_size": 10,
        }
    )
    batch = [message(i, padding=HEADERS_WIDTH if i == 2 else 0) for i in range(5)]
    await memory.sink(route.from_.address).send(batch)

    def endpoints() -> tuple[Source, Sink]:
        source = memory.source(route.from_.address, error_queue=route.error_queue_name)
        return source, pg.sink(dst)

    runner = RouteRunner(route, endpoints, poll_timeout=0.05)
    dead = memory.broker.queue(route.error_queue_name)
    await run_until(runner, lambda: len(dead) == 1)
    assert count(pg_dsn, pg_schema, dst) == 4
    assert not memory.broker.queue(route.from_.address)
    (copy,) = dead
    assert isinstance(copy, Envelope) and copy.body == b"body-2"
    headers = copy.headers
    assert headers.get("NServiceBus.MessageId") == "id-2"
    assert headers.get("NServiceBus.FailedQ") == route.from_.address
    assert headers.get("NServiceBus.ExceptionInfo.ExceptionType") == "bridge.errors.MessageRejected"
    assert "(SQLSTATE 22001)" in (headers.get("NServiceBus.ExceptionInfo.Message") or "")
    assert headers.get("NServiceBus.TimeOfFailure")
    assert headers.get("NServiceBus.ProcessingEndpoint") == "bridge"
    assert runner.stats.forwarded == 4 and runner.stats.poison == 1


async def test_a_refused_row_inside_the_sources_transaction_aborts_the_batch(
    pg: SqlTransport, pg_dsn: str, pg_schema: str
) -> None:
    src, dst = unique("Src"), unique("Dst")
    await pg.install([src, dst])
    narrow_headers(pg_dsn, pg_schema, dst)
    sink = pg.sink(src)
    await sink.send([message(1), message(2, padding=HEADERS_WIDTH)])
    source = pg.source(src)
    inside = source.sink_in_transaction(dst)
    batch = await source.receive_batch(10, 5.0)
    async with batch:
        with pytest.raises(TransportError) as raised:
            await inside.send(batch.messages)
    # Not MessageRejected: the failed insert took the source's deletes with it, so sending the
    # batch again in parts would duplicate it.
    assert not isinstance(raised.value, MessageRejected)
    assert count(pg_dsn, pg_schema, src) == 2 and count(pg_dsn, pg_schema, dst) == 0


def refusal(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> TransportError:
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        error = translate(exc, "postgresql connection 'shop'", postgresql.classify)
        assert error is not None
        return error
    raise AssertionError(f"PostgreSQL took {statement!r}")


def test_postgresql_data_errors_are_messages_refused_for_good(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE t (h varchar(3), b bytea)")
        for statement in (
            "SELECT now() + '86399999913600000 ms'::interval",  # 22015
            "INSERT INTO t (h) VALUES ('abcd')",  # 22001
            "SELECT repeat('x', 1073741824)",  # 54000: past the 1 GB field limit
        ):
            error = refusal(conn, statement)
            assert isinstance(error, MessageRejected) and error.index is None, statement
        try:
            conn.execute("INSERT INTO t (h) VALUES (%s)", ("a\x00",))
        except psycopg.DataError as exc:  # refused by psycopg before it reaches the server
            assert isinstance(translate(exc, "pg", postgresql.classify), MessageRejected)
        missing = refusal(conn, "INSERT INTO no_such_table VALUES (1)")
        assert not isinstance(missing, MessageRejected) and not missing.retriable


def test_sqlite_data_errors_are_messages_refused_for_good() -> None:
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE TABLE q (headers TEXT, body BLOB)")
        db.execute("CREATE TABLE s (headers TEXT, body BLOB) STRICT")
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
        refusals = []
        for statement, params in (
            ("INSERT INTO q VALUES (?, ?)", ("{}", b"x" * 2000)),  # SQLITE_TOOBIG
            ("INSERT INTO s VALUES (?, ?)", (b"{}", b"")),  # a STRICT table's datatype
        ):
            with pytest.raises(sqlite3.Error) as raised:
                db.execute(statement, params)
            refusals.append(translate(raised.value, "sqlite connection 'local'", sqlite.classify))
        with pytest.raises(sqlite3.Error) as missing:
            db.execute("INSERT INTO nowhere VALUES (1)")
    finally:
        db.close()
    assert all(isinstance(e, MessageRejected) and e.index is None for e in refusals), refusals
    assert not isinstance(
        translate(missing.value, "sqlite connection 'local'", sqlite.classify), MessageRejected
    )
