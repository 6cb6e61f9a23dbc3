"""SQL queue tables on real SQLite and PostgreSQL: what a queue table must do for the runner.

Rows that a foreign writer would leave (bad headers, hand-written TimeSent) are put in with the
plain drivers, so these tests check the transport against rows it did not write itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from bridge.config.models import PostgresConnection, SqliteConnection
from bridge.envelope import Envelope, Headers
from bridge.errors import (
    ConfigError,
    MessageRejected,
    SettleError,
    TransportError,
    TransportUnavailable,
)
from bridge.nservicebus.deadletter import RAW_HEADERS
from bridge.nservicebus.wireformat import format_timestamp, parse_timespan, timestamp_seconds
from bridge.protocols import FencedCheckpoint
from bridge.transports import load
from bridge.transports.sql import CheckpointConflict, PositionMoved
from bridge.transports.sql import Transport as SqlTransport
from bridge.transports.sql import chain as chain_module
from bridge.transports.sql import sink as sink_module
from bridge.transports.sql.dialects.base import scalar
from tests.conftest import unique

pytestmark = pytest.mark.integration

KINDS = ["sqlite", "postgresql"]


@dataclass
class Db:
    """A transport plus raw access to the same database through the plain driver."""

    kind: str
    transport: SqlTransport
    sqlite_path: str = ""
    pg_dsn: str = ""
    schema: str = ""

    def table(self, name: str) -> str:
        quoted = '"' + name.replace('"', '""') + '"'
        return quoted if self.kind == "sqlite" else f'"{self.schema}".{quoted}'

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.kind == "sqlite":
            with contextlib.closing(sqlite3.connect(self.sqlite_path)) as lite, lite:
                yield lite.cursor()
        else:
            with psycopg.connect(self.pg_dsn) as pg, pg.cursor() as cursor:
                yield cursor

    def _sql(self, statement: str) -> str:
        return statement if self.kind == "sqlite" else statement.replace("?", "%s")

    def insert(self, name: str, headers: str | bytes, body: bytes = b"") -> str:
        """A row as a foreign writer leaves it, and its Id; bytes headers go in as TEXT holding
        those bytes (SQLite only: PostgreSQL TEXT cannot hold anything but valid UTF-8)."""
        column = "CAST(? AS TEXT)" if isinstance(headers, bytes) else "?"
        row_id = str(uuid.uuid4())
        with self._cursor() as cursor:
            cursor.execute(
                self._sql(
                    f"INSERT INTO {self.table(name)} (id, headers, body) VALUES (?, {column}, ?)"
                ),
                (row_id, headers, body),
            )
        return row_id

    def canonical(self, name: str) -> str:
        """The address NServiceBus writes in headers (wire-format §6), spelled out."""
        quoted = '"' + name.replace('"', '""') + '"'
        return f'"main".{quoted}' if self.kind == "sqlite" else f'"{self.schema}".{quoted}'

    def delete(self, name: str) -> None:
        with self._cursor() as cursor:
            cursor.execute(f"DELETE FROM {self.table(name)}")

    def expiring(self, name: str) -> list[bool]:
        """Whether each row has an `Expires`, in queue order."""
        with self._cursor() as cursor:
            cursor.execute(f"SELECT expires IS NOT NULL FROM {self.table(name)} ORDER BY seq")
            return [bool(row[0]) for row in cursor.fetchall()]

    def expire_in_the_year_2999(self, name: str) -> None:
        """Give every row an `Expires`, as a foreign writer may."""
        year_2999 = "2999-01-01T00:00:00.000Z" if self.kind == "sqlite" else "2999-01-01"
        with self._cursor() as cursor:
            cursor.execute(self._sql(f"UPDATE {self.table(name)} SET expires = ?"), (year_2999,))

    def rows(self, name: str) -> list[tuple[str, str | bytes, bytes]]:
        """Headers as text where they are valid UTF-8, else as the bytes the TEXT column holds."""
        if self.kind == "postgresql":
            statement = f"SELECT id, headers, body FROM {self.table(name)} ORDER BY seq"
        else:  # sqlite3 cannot read TEXT that is not UTF-8; every value must still be TEXT
            statement = (
                "SELECT id, CAST(headers AS BLOB), body, typeof(headers) = 'text' "
                f"FROM {self.table(name)} ORDER BY seq"
            )
        with self._cursor() as cursor:
            cursor.execute(statement)
            found = cursor.fetchall()
        assert all(row[3] for row in found if self.kind == "sqlite"), "Headers not stored as TEXT"
        return [(str(row[0]), text_if_utf8(row[1]), bytes(row[2])) for row in found]


def text_if_utf8(raw: str | bytes) -> str | bytes:
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def sqlite_config(path: str, busy_timeout: float = 30.0) -> SqliteConnection:
    return SqliteConnection.model_validate(
        {"type": "sqlite", "path": path, "busy_timeout": busy_timeout}
    )


def postgres_config(dsn: str, schema: str = "public") -> PostgresConnection:
    return PostgresConnection.model_validate({"type": "postgresql", "dsn": dsn, "schema": schema})


@pytest.fixture(params=KINDS)
async def db(request: pytest.FixtureRequest) -> AsyncIterator[Db]:
    if request.param == "sqlite":
        path = request.getfixturevalue("sqlite_path")
        config: Any = sqlite_config(path=path)
        found = Db("sqlite", cast(SqlTransport, load("local", config)), sqlite_path=path)
    else:
        found = postgres_db(request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema"))
    try:
        yield found
    finally:
        await found.transport.close()


def postgres_db(dsn: str, schema: str) -> Db:
    config = postgres_config(dsn=dsn, schema=schema)
    return Db("postgresql", cast(SqlTransport, load("shop", config)), pg_dsn=dsn, schema=schema)


async def queue(db: Db, prefix: str = "Sales") -> str:
    name = unique(prefix)
    await db.transport.install([name])
    return name


def message(i: int) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", f"id-{i}")]), f"body-{i}".encode())


async def send(db: Db, name: str, envelopes: list[Envelope]) -> None:
    sink = db.transport.sink(name)
    try:
        await sink.send(envelopes)
    finally:
        await sink.close()


async def drain(db: Db, name: str, batch_size: int = 100) -> list[Envelope]:
    source = db.transport.source(name)
    got: list[Envelope] = []
    try:
        while True:
            batch = await source.receive_batch(batch_size, 0.05)
            async with batch:
                got.extend(batch.messages)
                await batch.commit()
            if not len(batch):
                return got
    finally:
        await source.close()


def ids(envelopes: list[Envelope]) -> list[str | None]:
    return [e.message_id for e in envelopes]


async def test_print_only_install_needs_no_connection(db: Db, tmp_path: Path) -> None:
    if db.kind == "sqlite":
        config: Any = sqlite_config(path=str(tmp_path / "none" / "x.db"))
    else:
        dsn = "postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=1"
        config = postgres_config(dsn=dsn, schema='odd "schema"')
    offline = cast(SqlTransport, load("offline", config))
    try:
        statements = await offline.install(['Sales.Delayed v"2'], print_only=True)
    finally:
        await offline.close()
    text = "\n".join(statements)
    assert '"Sales.Delayed v""2"' in text
    assert "CREATE TABLE IF NOT EXISTS" in text and "BridgeCheckpoints" in text
    if db.kind == "postgresql":
        assert '"odd ""schema"""."Sales.Delayed v""2"' in text
    assert not (tmp_path / "none").exists()


def staged_sends(db: Db, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the sends staged through the dialect's COPY (PostgreSQL), by their row counts."""
    counts: list[int] = []
    dialect = db.transport.dialect
    if dialect.send_stage:
        stage_rows = dialect.stage_rows

        def counted(conn: Any, rows: Any) -> None:
            counts.append(len(rows))
            stage_rows(conn, rows)

        monkeypatch.setattr(dialect, "stage_rows", counted)
    return counts


async def test_a_large_send_keeps_every_value_and_the_order(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send of many rows is staged on PostgreSQL (COPY, then INSERT ... SELECT): the rows,
    their order and each one's lifetime (by the database clock) are what a send of one row
    at a time would write."""
    staged = staged_sends(db, monkeypatch)
    name = await queue(db)
    count = sink_module.STAGE_FROM * 2 + 3
    envelopes = []
    for i in range(count):
        envelope = Envelope(
            Headers(
                [
                    ("NServiceBus.MessageId", f"id-{i}"),
                    ("NServiceBus.ReplyToAddress", "Sales@[dbo]/x"),
                    ("unicode", 'café / 東京 \u2028 "q" \\'),
                    ("null", None),
                ]
            ),
            bytes([i % 256]) * (i * 7),
        )
        if i % 3 == 0:
            envelope.expires_at = time.time() + 600
        envelopes.append(envelope)
    await send(db, name, envelopes[:5])  # below STAGE_FROM: one insert per row
    await send(db, name, envelopes[5:])
    assert staged == ([count - 5] if db.kind == "postgresql" else [])
    got = await drain(db, name, batch_size=500)
    assert ids(got) == [f"id-{i}" for i in range(count)]
    for sent, received in zip(envelopes, got, strict=True):
        assert received.body == sent.body
        assert received.headers.items() == sent.headers.items()
        if sent.expires_at is None:
            assert received.expires_at is None
        else:
            assert received.expires_at is not None
            assert abs(received.expires_at - sent.expires_at) < 5


async def test_a_refused_row_fails_a_large_send_as_a_whole_and_the_next_one_works(
    pg: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data exception inside a staged send (here a CHECK that divides by zero for one body)
    rolls the whole send back, unnamed, so the runner sends each message alone; the next
    large send on the same connection is staged again."""
    staged = staged_sends(pg, monkeypatch)
    name = await queue(pg)
    with psycopg.connect(pg.pg_dsn, autocommit=True) as admin:
        admin.execute(
            f"ALTER TABLE {pg.table(name)} ADD CONSTRAINT refuse CHECK "
            "(1 / (CASE WHEN body = 'refused'::bytea THEN 0 ELSE 1 END) = 1)"
        )
    count = sink_module.STAGE_FROM + 10
    good = [message(i) for i in range(count)]
    bad = Envelope(Headers([("NServiceBus.MessageId", "bad")]), b"refused")
    sink = pg.transport.sink(name)
    try:
        with pytest.raises(MessageRejected) as raised:
            await sink.send([*good[:20], bad, *good[20:]])
        assert raised.value.index is None
        assert pg.rows(name) == []
        await sink.send(good)
    finally:
        await sink.close()
    assert staged == [count + 1, count]
    assert ids(await drain(pg, name, batch_size=500)) == [f"id-{i}" for i in range(count)]


async def test_a_large_send_creates_the_stage_when_its_session_has_none(
    pg: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a pooler in transaction mode, the next transaction may run in a server session
    that never had the stage; here the sink's own session loses it (`DISCARD TEMP`)."""
    staged = staged_sends(pg, monkeypatch)
    name = await queue(pg)
    count = sink_module.STAGE_FROM
    sink = pg.transport.sink(name)

    def discard_temp(conn: Any) -> None:
        conn.cursor().execute("DISCARD TEMP")
        conn.commit()

    try:
        await sink.send([message(i) for i in range(count)])
        await sink._connection.run(discard_temp)
        await sink.send([message(i) for i in range(count, 2 * count)])
    finally:
        await sink.close()
    assert staged == [count, count]
    assert ids(await drain(pg, name, batch_size=500)) == [f"id-{i}" for i in range(2 * count)]


async def test_a_large_send_after_the_connection_was_killed_stages_again(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage is a temporary table of the session: a new connection creates its own."""
    connection = unique("shop")
    transport = cast(SqlTransport, load(connection, postgres_config(pg_dsn, pg_schema)))
    db = Db("postgresql", transport, pg_dsn=pg_dsn, schema=pg_schema)
    staged = staged_sends(db, monkeypatch)
    name = unique("Sales")
    count = sink_module.STAGE_FROM
    try:
        await transport.install([name])
        sink = transport.sink(name)
        await sink.send([message(i) for i in range(count)])
        assert terminate_backends(pg_dsn, f"bridge {connection}") >= 1
        with pytest.raises(TransportUnavailable):
            await sink.send([message(i) for i in range(count, 2 * count)])
        await sink.send([message(i) for i in range(count, 2 * count)])  # a fresh connection
        assert staged == [count, count, count]  # the one on the killed session failed there
        assert ids(await drain(db, name, batch_size=500)) == [f"id-{i}" for i in range(2 * count)]
    finally:
        await transport.close()


@pytest.fixture
async def pg(pg_dsn: str, pg_schema: str) -> AsyncIterator[Db]:
    found = postgres_db(pg_dsn, pg_schema)
    try:
        yield found
    finally:
        await found.transport.close()


async def test_a_batch_received_ahead_holds_other_rows_and_settles_on_its_own(pg: Db) -> None:
    name = await queue(pg)
    await send(pg, name, [message(i) for i in range(5)])
    source = pg.transport.source(name)
    try:
        first = await source.receive_batch(2, 5.0)
        ahead = await source.receive_batch(2, 5.0)
        assert ids(first.messages) == ["id-0", "id-1"]
        assert ids(ahead.messages) == ["id-2", "id-3"]  # skips the rows `first` holds
        await ahead.commit()
        await first.abort()
    finally:
        await source.close()
    assert ids(await drain(pg, name)) == ["id-0", "id-1", "id-4"]


async def test_a_source_commits_without_waiting_for_the_log_flush(db: Db) -> None:
    """Only a receive's commit: a crash that loses it brings its rows back (duplicates); a
    send's commit waits for the flush, or a crash could lose what the source let go of."""
    name = await queue(db)
    await send(db, name, [message(1)])
    source, sink = db.transport.source(name), db.transport.sink(name)
    if db.kind == "sqlite":  # 1 NORMAL: synced at checkpoints, 2 FULL: at each commit
        show, relaxed, durable = "PRAGMA synchronous", 1, 2
    else:
        show, relaxed, durable = "SHOW synchronous_commit", "off", "on"
    try:
        batch = await source.receive_batch(10, 5.0)
        assert await source._connection.run(lambda c: scalar(c, show)) == relaxed
        await batch.commit()
        await sink.send([message(2)])
        assert await sink._connection.run(lambda c: scalar(c, show)) == durable
    finally:
        await source.close()
        await sink.close()
    assert ids(await drain(db, name)) == ["id-2"]


async def sqlite_pragma_after_a_receive(tmp_path: Path, pragma: str) -> tuple[Any, Any]:
    """`PRAGMA {pragma}` on a SQLite source's connection and on a sink's, once the sink has
    sent a message and the source has received and committed it."""
    transport = load("s", SqliteConnection(type="sqlite", path=str(tmp_path / "q.db")))
    assert isinstance(transport, SqlTransport)
    await transport.install(["q"])
    source, sink = transport.source("q"), transport.sink("q")
    show = f"PRAGMA {pragma}"
    try:
        await sink.send([message(1)])
        batch = await source.receive_batch(10, 5.0)
        assert ids(batch.messages) == ["id-1"]
        await batch.commit()
        return (
            await source._connection.run(lambda c: scalar(c, show)),
            await sink._connection.run(lambda c: scalar(c, show)),
        )
    finally:
        await transport.close()


@pytest.mark.tuning("a write-speed PRAGMA: no behaviour changes without it")
async def test_sqlite_connections_do_not_rewrite_the_pages_a_delete_frees(tmp_path: Path) -> None:
    """secure_delete FAST on every connection, whatever the build's default (Debian's is on)."""
    assert await sqlite_pragma_after_a_receive(tmp_path, "secure_delete") == (2, 2)


@pytest.mark.tuning("a cache size for receive speed: no behaviour changes with another")
async def test_a_sqlite_source_keeps_a_page_cache_for_the_id_index(tmp_path: Path) -> None:
    """A source's connection: 64 MiB of page cache (the index pages its deletes touch); a
    sink's keeps SQLite's default (a service may hold many)."""
    from bridge.transports.sql.dialects.sqlite import RECEIVING_CACHE_KIB

    source, sink = await sqlite_pragma_after_a_receive(tmp_path, "cache_size")
    assert source == -RECEIVING_CACHE_KIB
    assert sink == -2000


async def test_a_receive_past_the_batches_a_source_may_hold_is_refused(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: one more batch, received ahead on a second connection. SQLite (one writer):
    more batches in the transaction holding the first, up to CHAIN (test_sql_chained.py)."""
    monkeypatch.setattr(chain_module, "CHAIN_SECONDS", 60.0)  # a slow machine keeps its chain
    name = await queue(db)
    held = 2 if db.kind == "postgresql" else chain_module.CHAIN
    await send(db, name, [message(i) for i in range(1, held + 2)])
    source = db.transport.source(name)
    try:
        assert source.receives_ahead == (db.kind == "postgresql")  # SQLite: nothing held yet
        batches = [await source.receive_batch(1, 5.0)]
        while len(batches) < held:
            assert source.receives_ahead
            batches.append(await source.receive_batch(1, 5.0))
        assert source.receives_ahead == (db.kind == "postgresql")  # PostgreSQL: it could
        with pytest.raises(SettleError):
            await source.receive_batch(1, 0.1)
        assert [ids(b.messages) for b in batches] == [[f"id-{i}"] for i in range(1, held + 1)]
        await batches[-1].abort()  # the last returns; the ones before it stay taken
        for batch in batches[:-1]:
            await batch.commit()
        again = await source.receive_batch(10, 5.0)
        assert ids(again.messages) == [f"id-{held}", f"id-{held + 1}"]
        await again.commit()
        empty = await source.receive_batch(10, 0.05)
        assert not len(empty)
        await empty.commit()
    finally:
        await source.close()


async def test_interleaved_receivers_get_disjoint_rows_and_together_all(db: Db) -> None:
    name = await queue(db)
    await send(db, name, [message(i) for i in range(10)])
    first, second = db.transport.source(name), db.transport.source(name)
    try:
        held = await first.receive_batch(5, 5.0)
        # PostgreSQL skips the locked rows at once; SQLite waits for the writer to commit.
        other = asyncio.create_task(second.receive_batch(5, 5.0))
        await asyncio.sleep(0.05)
        await held.commit()
        late = await asyncio.wait_for(other, 10)
        await late.commit()
    finally:
        await first.close()
        await second.close()
    a, b = ids(list(held.messages)), ids(list(late.messages))
    assert len(a) == len(b) == 5
    assert not set(a) & set(b)
    assert sorted(a + b, key=lambda m: int((m or "").split("-")[1])) == ids(
        [message(i) for i in range(10)]
    )


async def test_concurrent_receivers_never_share_a_row(db: Db) -> None:
    name = await queue(db)
    total = 300
    await send(db, name, [message(i) for i in range(total)])
    sources = [db.transport.source(name) for _ in range(3)]
    got: list[list[str | None]] = [[] for _ in sources]

    async def consume(index: int) -> None:
        while sum(map(len, got)) < total:
            batch = await sources[index].receive_batch(7, 0.2)
            got[index].extend(ids(list(batch.messages)))
            await batch.commit()

    try:
        await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(3))), 60)
    finally:
        for source in sources:
            await source.close()
    everything = [m for part in got for m in part]
    assert len(everything) == total
    assert set(everything) == {f"id-{i}" for i in range(total)}
    for part in got:  # each receiver still sees FIFO order
        assert part == sorted(part, key=lambda m: int((m or "").split("-")[1]))


async def test_expired_rows_are_dropped_and_only_counted(db: Db) -> None:
    name = await queue(db)
    spent = [message(i) for i in range(3)]
    for envelope in spent:
        envelope.expires_at = time.time() - 1
    live = message(9)
    live.expires_at = time.time() + 600
    await send(db, name, [spent[0], message(3), spent[1], live, spent[2]])
    stats = await db.transport.peek(name)
    assert (stats.depth, stats.expired) == (5, 3)
    source = db.transport.source(name)
    try:
        batch = await source.receive_batch(10, 5.0)
        assert ids(list(batch.messages)) == ["id-3", "id-9"]
        assert batch.expired == 3 and not batch.poison
        await batch.commit()
    finally:
        await source.close()
    assert (await db.transport.peek(name)).depth == 0


async def test_a_lifetime_past_the_year_9999_never_expires(db: Db) -> None:
    name = await queue(db)
    now = time.time()
    lifetimes = ["999999999.00:00:00", "10675199.02:48:05.4775807", "2900000.00:00:00"]
    envelopes = []
    for i, ttbr in enumerate(lifetimes):
        envelope = message(i)
        envelope.headers.add("NServiceBus.TimeToBeReceived", ttbr)
        envelope.expires_at = now + parse_timespan(ttbr).total_seconds()
        envelopes.append(envelope)
    await send(db, name, envelopes)  # PostgreSQL refused the first (interval out of range)
    got = await drain(db, name)
    assert ids(got) == ["id-0", "id-1", "id-2"]
    assert [e.expires_at is None for e in got] == [True, True, False]  # 2900000 d: year 9966


async def test_error_and_audit_copies_are_written_and_read_without_a_lifetime(db: Db) -> None:
    """product.md, delivery semantics: a copy carrying NServiceBus.FailedQ or
    NServiceBus.ProcessingEnded never expires (NServiceBus@1d53488
    src/NServiceBus.Core/Recoverability/MoveToError.cs:45-57 sends error copies with no time to
    live); Expires decides for every other row."""
    name = await queue(db)
    live, failed, audited = message(0), message(1), message(2)
    failed.headers.add("NServiceBus.FailedQ", "Sales")
    audited.headers.add("NServiceBus.ProcessingEnded", "2026-04-29 21:56:55:590807 Z")
    for envelope in (live, failed, audited):
        envelope.expires_at = time.time() + 600
    await send(db, name, [live, failed, audited])
    assert db.expiring(name) == [True, False, False]
    db.expire_in_the_year_2999(name)
    got = await drain(db, name)
    assert ids(got) == ["id-0", "id-1", "id-2"]
    assert [e.expires_at is None for e in got] == [False, True, True]


POISON: list[str | bytes] = [
    '{"a":1}',
    "[1]",
    "not json",
    '{"a":"b"',
    '{"nested":{"x":"y"}}',
    '{"NServiceBus.MessageId":"s","k":"\\ud800"}',  # ASCII JSON for text UTF-8 cannot hold
]
#: TEXT that is not UTF-8, which only SQLite can hold: sqlite3 cannot even read it as text.
NOT_UTF8 = b'\xff{"NServiceBus.MessageId":"x"}'


def poison_rows(db: Db) -> list[str | bytes]:
    return [*POISON, NOT_UTF8] if db.kind == "sqlite" else POISON


async def test_poison_rows_surface_with_raw_headers_and_do_not_block(db: Db) -> None:
    name = await queue(db)
    db.insert(name, '{"NServiceBus.MessageId":"before"}', b"b0")
    poison = poison_rows(db)
    for i, raw in enumerate(poison):
        db.insert(name, raw, f"p{i}".encode())
    db.insert(name, '{"NServiceBus.MessageId":"after"}', b"b1")
    no_headers = db.insert(name, "", b"no headers")
    source = db.transport.source(name)
    try:
        batch = await source.receive_batch(20, 5.0)
        assert ids(list(batch.messages)) == ["before", "after", no_headers]
        assert [m.body for m in batch.messages] == [b"b0", b"b1", b"no headers"]
        assert [(p.raw_headers, p.body) for p in batch.poison] == [
            (raw, f"p{i}".encode()) for i, raw in enumerate(poison)
        ]
        assert all(p.native_id and p.reason for p in batch.poison)
        await batch.commit()
    finally:
        await source.close()
    assert db.rows(name) == []


async def test_a_row_without_a_message_id_takes_its_row_id(db: Db) -> None:
    """A native-integration insert may leave `NServiceBus.MessageId` out, or empty: an endpoint
    reading the row then uses the row's Id (NServiceBus src/NServiceBus.Core/Transports/
    IncomingMessage.cs:25-33 at 6e2ab22; the SQL transport passes the Id as the native id), and
    so does the bridge, so that a destination that requires one (RabbitMQ) takes the message."""
    name = await queue(db)
    missing = db.insert(name, '{"Shop.Kind":"native"}', b"m")
    empty = db.insert(name, '{"NServiceBus.MessageId":"","Shop.Kind":"native"}', b"e")
    kept = db.insert(name, '{"NServiceBus.MessageId":"own","Shop.Kind":"native"}', b"k")
    got = await drain(db, name)
    assert [(e.message_id, e.native_id) for e in got] == [
        (missing, missing),
        (empty, empty),
        ("own", kept),
    ]
    assert got[0].headers.items() == [("Shop.Kind", "native"), ("NServiceBus.MessageId", missing)]
    assert got[1].headers.items() == [("NServiceBus.MessageId", empty), ("Shop.Kind", "native")]


async def test_poison_moves_to_the_error_queue_in_the_same_transaction(db: Db) -> None:
    name, errors = unique("Sales"), unique("bridge.error")
    await db.transport.install([name, errors])
    poison: list[tuple[str | bytes, bytes]] = [
        ("not json", b"\x00raw"),
        ("[1]", b""),
        ('{"NServiceBus.MessageId":"s","k":"\\ud800"}', b"s"),
    ]
    if db.kind == "sqlite":
        poison.insert(1, (NOT_UTF8, b"\xfe"))
    db.insert(name, *poison[0])
    db.insert(name, '{"NServiceBus.MessageId":"ok"}', b"fine")
    for row in poison[1:]:
        db.insert(name, *row)
    source = db.transport.source(name, error_queue=errors)
    try:
        aborted = await source.receive_batch(10, 5.0)
        assert len(aborted.poison) == len(poison)
        await aborted.abort()
        assert db.rows(errors) == []  # nothing moves unless the batch commits
        batch = await source.receive_batch(10, 5.0)
        assert ids(list(batch.messages)) == ["ok"]
        native_ids = {p.native_id for p in batch.poison}
        await batch.commit()
    finally:
        await source.close()
    moved = db.rows(errors)
    assert not native_ids & {i for i, _, _ in moved}  # fresh ids
    copies = [json.loads(h) for _, h, _ in moved]
    # Bodies byte for byte; the raw Headers as text (bytes that are not UTF-8 replaced).
    assert [(c[RAW_HEADERS], b) for c, (_, _, b) in zip(copies, moved, strict=True)] == [
        (text_if_utf8(h) if isinstance(h, str) else h.decode("utf-8", "replace"), b)
        for h, b in poison
    ]
    for copy in copies:
        assert copy["NServiceBus.MessageId"] in native_ids  # as NServiceBus names it
        assert copy["NServiceBus.FailedQ"] == db.canonical(name)
        assert copy["NServiceBus.ExceptionInfo.ExceptionType"] == "HeadersFormatError"
        assert copy["NServiceBus.ExceptionInfo.Message"].startswith(("headers ", "header "))
        assert copy["NServiceBus.ExceptionInfo.StackTrace"]
        assert timestamp_seconds(copy["NServiceBus.TimeOfFailure"]) <= time.time()
        assert copy["NServiceBus.ProcessingEndpoint"] == "bridge"
    assert db.rows(name) == []


def servicepulse_retry(copy: dict[str, str]) -> str:
    """The headers ServiceControl's retry sends back to FailedQ: the error copy's, without
    the failure headers (its `HeaderFilter`), with its own retry headers."""
    stripped = ("NServiceBus.Retries", "NServiceBus.FailedQ", "NServiceBus.TimeOfFailure")
    headers = {
        k: v for k, v in copy.items() if not k.startswith(("NServiceBus.ExceptionInfo.", *stripped))
    }
    headers["ServiceControl.Retry.UniqueMessageId"] = "retry-1"
    return json.dumps(headers)


async def test_a_retried_poison_copy_is_poison_again_with_the_same_raw_headers(db: Db) -> None:
    name, errors = unique("Sales"), unique("bridge.error")
    await db.transport.install([name, errors])
    db.insert(name, '{"NServiceBus.MessageId": 1}', b"body")
    source = db.transport.source(name, error_queue=errors)
    try:
        for _ in range(2):  # the poison row, then its error copy sent back by a retry
            batch = await source.receive_batch(10, 5.0)
            assert not batch.messages and len(batch.poison) == 1
            await batch.commit()
            ((_, copy_text, body),) = db.rows(errors)
            copy = json.loads(copy_text)
            assert (copy[RAW_HEADERS], body) == ('{"NServiceBus.MessageId": 1}', b"body")
            assert copy["NServiceBus.FailedQ"] == db.canonical(name)
            db.delete(errors)
            db.insert(name, servicepulse_retry(copy), body)
    finally:
        await source.close()
    assert copy["ServiceControl.Retry.UniqueMessageId"] == "retry-1"  # the retry failed
    assert copy["NServiceBus.ExceptionInfo.ExceptionType"] == "HeadersFormatError"
    assert RAW_HEADERS in copy["NServiceBus.ExceptionInfo.Message"]


async def test_a_message_no_row_can_hold_is_rejected_alone_and_nothing_is_written(
    db: Db,
) -> None:
    name = await queue(db)
    bad = Envelope(Headers([("NServiceBus.MessageId", "s"), ("k", "\ud800")]), b"")
    sink = db.transport.sink(name)
    try:
        with pytest.raises(MessageRejected, match="UTF-8") as raised:
            await sink.send([message(0), bad, message(2)])
        assert raised.value.index == 1
        assert db.rows(name) == []
        await sink.send([message(0), message(2)])
    finally:
        await sink.close()
    assert ids(await drain(db, name)) == ["id-0", "id-2"]


async def test_a_rejected_send_in_the_source_transaction_keeps_the_batch(db: Db) -> None:
    """The sink of a same-database route writes in the source's transaction: a message it
    refuses must not roll back the rows the source took (the runner sends the rest)."""
    name, copy = await queue(db), await queue(db, "Copy")
    await send(db, name, [message(0), message(1)])
    source = db.transport.source(name)
    sink = source.sink_in_transaction(copy)
    bad = Envelope(Headers([("NServiceBus.MessageId", "s"), ("k", "\udfff")]), b"")
    try:
        batch = await source.receive_batch(10, 5.0)
        with pytest.raises(MessageRejected):
            await sink.send([*batch.messages, bad])
        await sink.send(list(batch.messages))
        await batch.commit()
    finally:
        await source.close()
    assert db.rows(name) == []
    assert [h for _, h, _ in db.rows(copy)] == [
        '{"NServiceBus.MessageId":"id-0"}',
        '{"NServiceBus.MessageId":"id-1"}',
    ]


async def test_peek_reports_depth_oldest_age_and_expired(db: Db) -> None:
    name = await queue(db)
    empty = await db.transport.peek(name)
    assert (empty.depth, empty.oldest_age_seconds, empty.expired) == (0, None, 0)
    sent = format_timestamp(datetime.now(UTC) - timedelta(minutes=2))
    db.insert(name, f'{{"NServiceBus.TimeSent":"{sent}"}}')
    spent = message(1)
    spent.expires_at = time.time() - 5
    await send(db, name, [spent, message(2)])
    stats = await db.transport.peek(name)
    assert stats.depth == 3 and stats.expired == 1
    assert stats.oldest_age_seconds is not None and 119 < stats.oldest_age_seconds < 135


async def test_peek_reads_past_headers_that_are_not_utf8(sqlite_path: str) -> None:
    transport = cast(SqlTransport, load("local", sqlite_config(sqlite_path)))
    db = Db("sqlite", transport, sqlite_path=sqlite_path)
    try:
        name = await queue(db)
        db.insert(name, NOT_UTF8)
        await send(db, name, [message(1)])
        stats = await transport.peek(name)
        assert (stats.depth, stats.oldest_age_seconds, stats.expired) == (2, None, 0)
    finally:
        await transport.close()


async def test_checkpoint_is_stored_with_the_rows_and_loaded_back(db: Db) -> None:
    name = await queue(db)
    sink = db.transport.sink(name)
    try:
        assert await sink.load_checkpoint("orders/") == {}
        await sink.send([message(1)], {"orders/0": 10, "orders/1": 4, "other/0": 99})
        await sink.send([], {"orders/0": 11})
        assert await sink.load_checkpoint("orders/") == {"orders/0": 11, "orders/1": 4}
        with pytest.raises(TransportError):  # the NULL name fails the whole transaction
            await sink.send([message(2)], {"orders/1": 5, cast(str, None): 1})
        assert await sink.load_checkpoint("orders/") == {"orders/0": 11, "orders/1": 4}
        await sink.send([message(3)], {"orders/1": 6})
    finally:
        await sink.close()
    assert ids(await drain(db, name)) == ["id-1", "id-3"]
    reader = db.transport.sink(name)
    try:
        assert await reader.load_checkpoint("") == {"orders/0": 11, "orders/1": 6, "other/0": 99}
    finally:
        await reader.close()


async def test_of_two_fenced_writers_of_one_checkpoint_only_one_commits(db: Db) -> None:
    name = await queue(db)
    first, second = db.transport.sink(name), db.transport.sink(name)
    try:
        first.fence_checkpoint({})
        second.fence_checkpoint({"orders/0": None})
        await first.send([message(1)], {"orders/0": 10})
        with pytest.raises(CheckpointConflict, match="another writer stored it first"):
            await second.send([message(2)], {"orders/0": 10})
        await first.send([message(3)], {"orders/0": 20, "orders/1": 5})
        second.fence_checkpoint({"orders/0": 10})  # what it read before `first` moved on
        with pytest.raises(CheckpointConflict):
            await second.send([message(4)], {"orders/0": 30})
        await first.send([], {"orders/1": 6})
        assert await first.load_checkpoint("orders/") == {"orders/0": 20, "orders/1": 6}
    finally:
        await first.close()
        await second.close()
    assert ids(await drain(db, name)) == ["id-1", "id-3"]


async def test_a_fenced_checkpoint_is_stored_over_the_position_its_batch_started_from(
    db: Db,
) -> None:
    name = await queue(db)
    sink = db.transport.sink(name)
    try:
        await sink.send([message(1)], FencedCheckpoint({"g/t/0": 10}, {"g/t/0": None}))
        with pytest.raises(PositionMoved, match="another writer stored it first") as moved:
            await sink.send(  # a stale batch: one more row, then a position over 0
                [message(2)], FencedCheckpoint({"g/t/0": 10, "g/t/1": 4}, {"g/t/0": None})
            )
        assert moved.value.retriable
        with pytest.raises(PositionMoved):
            await sink.send([message(3)], FencedCheckpoint({"g/t/0": 15}, {"g/t/0": 5}))
        await sink.send([message(4)], FencedCheckpoint({"g/t/0": 15, "g/t/1": 3}, {"g/t/0": 10}))
        assert await sink.load_checkpoint("g/") == {"g/t/0": 15, "g/t/1": 3}
    finally:
        await sink.close()
    assert ids(await drain(db, name)) == ["id-1", "id-4"]


async def test_one_moved_position_of_several_rolls_the_whole_send_back(db: Db) -> None:
    """Positions written in one call (PostgreSQL, SQLite) are checked together: one that
    another writer moved fails the send, and none of the others is stored."""
    name = await queue(db)
    sink = db.transport.sink(name)
    start = {"g/t/0": 10, "g/t/1": 20, "g/t/2": 30}
    try:
        await sink.send([message(1)], FencedCheckpoint(start, dict.fromkeys(start)))
        with pytest.raises(PositionMoved, match="'g/t/1' is no longer at 19"):
            await sink.send(
                [message(2)],
                FencedCheckpoint(
                    {"g/t/0": 11, "g/t/1": 21, "g/t/2": 31, "g/t/3": 1},
                    {"g/t/0": 10, "g/t/1": 19, "g/t/2": 30, "g/t/3": None},
                ),
            )
        assert await sink.load_checkpoint("g/") == start
        await sink.send([message(3)], FencedCheckpoint({"g/t/1": 21, "g/t/2": 31}, start))
        assert await sink.load_checkpoint("g/") == {"g/t/0": 10, "g/t/1": 21, "g/t/2": 31}
    finally:
        await sink.close()
    assert ids(await drain(db, name)) == ["id-1", "id-3"]


async def test_table_names_with_dots_spaces_and_quotes(db: Db) -> None:
    names = [unique("Sales.Delayed"), unique("my queue"), unique('say "hi".v2'), unique("50%")]
    await db.transport.install(names)
    for i, name in enumerate(names):
        await send(db, name, [message(i)])
    for i, name in enumerate(names):
        assert ids(await drain(db, name)) == [f"id-{i}"]
        assert db.rows(name) == []


async def test_an_empty_receive_holds_no_transaction(db: Db) -> None:
    transport = db.transport
    if db.kind == "sqlite":  # a held write lock would make the send below time out
        config = sqlite_config(path=db.sqlite_path, busy_timeout=1)
        transport = cast(SqlTransport, load("local", config))
    name = await queue(db)
    idle = transport.source(name)
    try:
        started = time.monotonic()
        batch = await idle.receive_batch(10, 0.3)
        assert not len(batch) and 0.3 <= time.monotonic() - started < 3
        sink = transport.sink(name)
        await sink.send([message(1)])
        await sink.close()
        assert ids(await drain(db, name)) == ["id-1"]
        await batch.commit()
    finally:
        await idle.close()
        await transport.close()


async def test_purge_expired_deletes_in_batches(db: Db) -> None:
    name = await queue(db)
    spent = [message(i) for i in range(5)]
    for envelope in spent:
        envelope.expires_at = time.time() - 1
    await send(db, name, [*spent, message(9)])
    assert await asyncio.to_thread(db.transport.purge_expired, name, 2) == 5
    assert ids(await drain(db, name)) == ["id-9"]


async def test_canonical_address(db: Db) -> None:
    schema = "main" if db.kind == "sqlite" else db.schema
    assert db.transport.canonical_address('Sales."x"') == f'"{schema}"."Sales.""x"""'


def test_postgresql_refuses_table_names_over_55_bytes(pg_dsn: str) -> None:
    config = postgres_config(dsn=pg_dsn)
    transport = cast(SqlTransport, load("shop", config))
    ok = "é" * 27  # 54 bytes
    assert transport.dialect.table(ok) == f'"public"."{ok}"'
    with pytest.raises(ConfigError, match="55"):
        transport.sink("é" * 28)
    with pytest.raises(ConfigError, match="55"):
        transport.source("Sales", error_queue="x" * 56)


def terminate_backends(pg_dsn: str, application_name: str) -> int:
    """Kill the server side of every connection of one application."""
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchall()
    return len(rows)


async def test_postgresql_connections_come_back_after_being_killed(
    pg_dsn: str, pg_schema: str
) -> None:
    connection = unique("shop")
    transport = cast(SqlTransport, load(connection, postgres_config(pg_dsn, pg_schema)))
    name = unique("Sales")
    await transport.install([name])
    sink, source = transport.sink(name), transport.source(name)
    try:
        await sink.send([message(1), message(2)])
        batch = await source.receive_batch(1, 5.0)
        assert ids(list(batch.messages)) == ["id-1"]
        # the pooled one (the sink gave it back after its send, the batch holds it now) and
        # the one install used
        assert terminate_backends(pg_dsn, f"bridge {connection}") == 2
        with pytest.raises(TransportUnavailable):
            await batch.commit()  # the server rolled the delete back
        assert transport.pool is not None and transport.pool.open == 0  # discarded
        await sink.send([message(3)])  # a fresh connection
        again = await source.receive_batch(10, 5.0)
        assert ids(list(again.messages)) == ["id-1", "id-2", "id-3"]
        await again.commit()
    finally:
        await transport.close()


def test_postgresql_errors_never_quote_message_content(pg_dsn: str) -> None:
    import psycopg

    from bridge.transports.sql.dialects import postgresql
    from bridge.transports.sql.errors import translate

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE guarded (body text CHECK (body <> 'SECRET-BODY'))")
        try:
            conn.execute("INSERT INTO guarded VALUES ('SECRET-BODY')")
        except psycopg.Error as exc:
            error = translate(exc, "postgresql connection 'shop'", postgresql.classify)
    assert error is not None and not error.retriable
    assert "SECRET-BODY" not in str(error)
    assert str(error).endswith("(SQLSTATE 23514)")


async def test_a_batch_with_a_rejection_cannot_commit_without_an_error_queue(db: Db) -> None:
    """Nowhere to put the refused message: the commit fails and every row stays."""
    name = await queue(db)
    await send(db, name, [message(1), message(2)])
    source = db.transport.source(name)  # no error_queue
    try:
        batch = await source.receive_batch(10, 5.0)
        batch.reject(batch.messages[0], MessageRejected("refused for good"))
        with pytest.raises(TransportError, match="no error queue"):
            await batch.commit()
    finally:
        await source.close()
    assert ids(await drain(db, name)) == ["id-1", "id-2"]
