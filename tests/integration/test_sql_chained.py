"""Chained batches: a SQLite source receives ahead in the transaction that holds its batch.

SQLite has one writer, so the batch received ahead cannot have a transaction of its own: it is
taken in the open one, after a savepoint. What must hold (the module docstring of
`bridge.transports.sql.chain`): nothing is committed while any batch of the
transaction is unsettled; aborting a batch returns its rows and those after it, never the
settled ones before it; a transaction rolled back under a held batch makes its commit fail.
Each is checked against the table through a second, plain sqlite3 connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator
from typing import cast

import pytest

from bridge.config.models import SqliteConnection
from bridge.envelope import Envelope, Headers
from bridge.errors import TransportError
from bridge.transports import load
from bridge.transports.sql import SqlSource
from bridge.transports.sql import Transport as SqlTransport
from bridge.transports.sql import chain as chain_module
from bridge.transports.sql.dialects.base import DbConnection

pytestmark = pytest.mark.integration

QUEUE, ERRORS = "Sales", "bridge.error"


@pytest.fixture
async def transport(
    sqlite_path: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SqlTransport]:
    monkeypatch.setattr(chain_module, "CHAIN_SECONDS", 60.0)  # a slow machine keeps its chain
    config = SqliteConnection.model_validate({"type": "sqlite", "path": sqlite_path})
    found = cast(SqlTransport, load("local", config))
    await found.install([QUEUE, ERRORS])
    try:
        yield found
    finally:
        await found.close()


@pytest.fixture
async def source(transport: SqlTransport) -> AsyncIterator[SqlSource]:
    found = transport.source(QUEUE)
    try:
        yield found
    finally:
        await found.close()


def message(i: int) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", f"id-{i}")]), f"body-{i}".encode())


async def fill(transport: SqlTransport, count: int) -> None:
    sink = transport.sink(QUEUE)
    try:
        await sink.send([message(i) for i in range(1, count + 1)])
    finally:
        await sink.close()


def in_table(path: str, table: str = QUEUE) -> list[str]:
    """What a second connection sees committed: the rows' message ids, oldest first."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(f'SELECT headers FROM "{table}" ORDER BY seq').fetchall()
    return [row[0].split('"NServiceBus.MessageId":"')[1].split('"')[0] for row in rows]


def ids(envelopes: list[Envelope]) -> list[str | None]:
    return [e.message_id for e in envelopes]


async def test_nothing_commits_until_every_batch_of_the_transaction_is_settled(
    transport: SqlTransport, source: SqlSource, sqlite_path: str
) -> None:
    await fill(transport, 3)
    first = await source.receive_batch(1, 5.0)
    assert source.receives_ahead
    second = await source.receive_batch(1, 5.0)
    assert (ids(first.messages), ids(second.messages)) == (["id-1"], ["id-2"])
    await first.commit()
    assert in_table(sqlite_path) == ["id-1", "id-2", "id-3"]  # the second holds it open
    await second.commit()
    assert in_table(sqlite_path) == ["id-3"]
    assert not source.receives_ahead  # nothing held: the next receive begins anew


async def test_a_receive_ahead_that_finds_nothing_leaves_the_batch_to_commit_alone(
    transport: SqlTransport, source: SqlSource, sqlite_path: str
) -> None:
    await fill(transport, 1)
    first = await source.receive_batch(10, 5.0)
    empty = await source.receive_batch(10, 5.0)
    assert not len(empty)
    await empty.commit()
    await first.commit()
    assert in_table(sqlite_path) == []


async def test_aborting_a_later_batch_returns_only_its_rows_and_commits_the_settled_ones(
    transport: SqlTransport, source: SqlSource, sqlite_path: str
) -> None:
    await fill(transport, 4)
    first = await source.receive_batch(1, 5.0)
    second = await source.receive_batch(2, 5.0)
    await first.commit()
    await second.abort()  # the send of the second failed
    assert in_table(sqlite_path) == ["id-2", "id-3", "id-4"]
    again = await source.receive_batch(10, 5.0)
    assert ids(again.messages) == ["id-2", "id-3", "id-4"]
    await again.commit()
    assert in_table(sqlite_path) == []


async def test_aborting_the_first_batch_returns_every_batch_and_the_later_cannot_commit(
    transport: SqlTransport, source: SqlSource, sqlite_path: str
) -> None:
    await fill(transport, 3)
    first = await source.receive_batch(1, 5.0)
    second = await source.receive_batch(1, 5.0)
    await first.abort()
    assert in_table(sqlite_path) == ["id-1", "id-2", "id-3"]
    with pytest.raises(TransportError, match="rolled back"):
        await second.commit()
    assert in_table(sqlite_path) == ["id-1", "id-2", "id-3"]


async def test_a_settled_batch_keeps_its_error_copies_when_a_later_batch_aborts(
    transport: SqlTransport, sqlite_path: str
) -> None:
    with contextlib.closing(sqlite3.connect(sqlite_path)) as db, db:
        db.execute(
            f'INSERT INTO "{QUEUE}" (id, headers, body) VALUES (?, ?, ?)',
            ("bad-row", "not json", b"poison body"),
        )
    await fill(transport, 1)
    source = transport.source(QUEUE, error_queue=ERRORS)
    try:
        first = await source.receive_batch(1, 5.0)
        assert len(first.poison) == 1
        second = await source.receive_batch(1, 5.0)
        await first.commit()  # its error copy is written in the transaction
        await second.abort()
        assert in_table(sqlite_path) == ["id-1"]
        with contextlib.closing(sqlite3.connect(sqlite_path)) as db:
            bodies = db.execute(f'SELECT body FROM "{ERRORS}"').fetchall()
        assert bodies == [(b"poison body",)]
    finally:
        await source.close()


async def test_a_transaction_rolled_back_under_a_held_batch_fails_its_commit(
    transport: SqlTransport, source: SqlSource, sqlite_path: str
) -> None:
    await fill(transport, 2)
    first = await source.receive_batch(1, 5.0)
    second = await source.receive_batch(1, 5.0)
    await first.commit()
    source._connection.rollback_later()  # what a failed or cancelled call does
    with pytest.raises(TransportError, match="rolled back"):
        await second.commit()
    assert in_table(sqlite_path) == ["id-1", "id-2"]  # back, settled one too: duplicates
    again = await source.receive_batch(10, 5.0)  # and the source goes on
    assert ids(again.messages) == ["id-1", "id-2"]
    await again.commit()


async def test_a_receive_ahead_cancelled_mid_statement_returns_only_what_it_took(
    transport: SqlTransport, source: SqlSource, sqlite_path: str
) -> None:
    """The runner cancels the receive ahead when it stops: the batch it took in the thread
    after the cancel goes back, and the settled batch before it commits (no duplicates)."""
    await fill(transport, 3)
    inside, release = threading.Event(), threading.Event()

    def stall(db: DbConnection) -> None:  # the next statement waits inside SQLite
        def handler() -> int:
            inside.set()
            release.wait(10)
            cast(sqlite3.Connection, db).set_progress_handler(None, 0)
            return 0

        cast(sqlite3.Connection, db).set_progress_handler(handler, 1)

    first = await source.receive_batch(1, 5.0)
    await source._connection.run(stall)
    ahead = asyncio.create_task(source.receive_batch(1, 5.0))
    assert await asyncio.to_thread(inside.wait, 10)
    ahead.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await ahead
    await first.commit()
    await source._connection.run(lambda db: None)  # behind the tidy-up of the cancel
    assert in_table(sqlite_path) == ["id-2", "id-3"]
    again = await source.receive_batch(10, 5.0)
    assert ids(again.messages) == ["id-2", "id-3"]
    await again.commit()


async def test_a_transaction_takes_no_more_batches_once_open_chain_seconds(
    transport: SqlTransport, source: SqlSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chain_module, "CHAIN_SECONDS", 0.0)
    await fill(transport, 2)
    first = await source.receive_batch(1, 5.0)
    assert not source.receives_ahead
    await first.commit()
