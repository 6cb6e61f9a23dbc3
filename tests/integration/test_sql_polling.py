"""How often a SQL source polls its table, counted on real SQLite and PostgreSQL by the
transactions it opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config.models import PostgresConnection, SqliteConnection
from bridge.envelope import Envelope, Headers
from bridge.transports.sql import SqlSink, SqlSource
from bridge.transports.sql import Transport as SqlTransport
from bridge.transports.sql import source as source_module
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.dialects.postgresql import PostgresDialect
from bridge.transports.sql.dialects.sqlite import SqliteDialect

pytestmark = pytest.mark.integration


class Counting(Dialect):
    """Counts the transactions begun: every poll of a source begins one (a sink's write too)."""

    polls = 0

    def begin(self, db: DbConnection) -> None:
        self.polls += 1
        super().begin(db)


class CountingDialect(Counting, SqliteDialect):
    """SQLite, counting the transactions begun."""


class CountingPostgres(Counting, PostgresDialect):
    """PostgreSQL, counting the transactions begun."""


def counting_dialect(kind: str, request: pytest.FixtureRequest) -> Counting:
    if kind == "sqlite":
        path = str(request.getfixturevalue("tmp_path") / "q.db")
        return CountingDialect("db", SqliteConnection(type="sqlite", path=path))
    config = PostgresConnection.model_validate(
        {
            "type": "postgresql",
            "dsn": request.getfixturevalue("pg_dsn"),
            "schema": request.getfixturevalue("pg_schema"),
        }
    )
    return CountingPostgres("db", config)


async def test_an_idle_source_polls_less_and_less_and_a_busy_one_at_once(tmp_path: Path) -> None:
    dialect = CountingDialect("db", SqliteConnection(type="sqlite", path=str(tmp_path / "q.db")))
    transport = SqlTransport("db", dialect.config)
    await transport.install(["Idle"])
    source, sink = SqlSource(dialect, "Idle"), SqlSink(dialect, "Idle")
    try:
        calls = 8
        for _ in range(calls):  # 4 idle seconds as the runner spends them, 0.5 s a receive
            assert not (await source.receive_batch(10, 0.5)).messages
        # 10 ms, 20 ms, ... doubling to 1 s between polls: 10 in 4 s (a backoff restarted by
        # every receive would poll about 6 times a receive: 48)
        idle_polls = dialect.polls
        assert idle_polls <= 12
        await sink.send(
            [Envelope(Headers([("NServiceBus.MessageId", f"m-{i}")]), b"x") for i in range(3)]
        )
        for i in range(3):
            before = dialect.polls
            batch = await source.receive_batch(1, 5.0)  # the first waits for the due poll
            assert [e.message_id for e in batch.messages] == [f"m-{i}"]
            await batch.commit()
            if i:  # rows were found last time: polled at once, once
                assert dialect.polls == before + 1
    finally:
        await source.close()
        await sink.close()
        await transport.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_a_source_that_caught_up_waits_before_polling_again(
    kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that was not full: the next poll waits MIN_POLL (here 2 s, to see it), so what
    comes in meanwhile is taken in one batch (and on SQLite, the lock is free for writers in
    between); a full batch: polled again at once."""
    monkeypatch.setattr(source_module, "MIN_POLL", 2.0)
    dialect = counting_dialect(kind, request)
    transport = SqlTransport("db", dialect.config)
    await transport.install(["Q"])
    source, sink = SqlSource(dialect, "Q"), SqlSink(dialect, "Q")
    message = [Envelope(Headers([("NServiceBus.MessageId", "m")]), b"x")]
    try:
        await sink.send(message * 3)
        full = await source.receive_batch(2, 5.0)
        await full.commit()
        before = dialect.polls
        partial = await source.receive_batch(2, 5.0)  # a full batch before: polled at once
        assert (len(partial.messages), dialect.polls) == (1, before + 1)
        await partial.commit()
        await sink.send(message)  # on SQLite, the lock was free: the writer got in
        await sink.send(message)
        before = dialect.polls  # the sink's transactions counted too
        assert not len(await source.receive_batch(3, 0.0))  # not due yet: no poll
        assert dialect.polls == before
        last = await source.receive_batch(3, 5.0)  # both writes in one batch, one poll
        assert len(last.messages) == 2
        assert dialect.polls == before + 1
        await last.abort()  # its row is back: the source is not caught up, polls at once
        again = await source.receive_batch(3, 0.0)
        assert len(again.messages) == 2
        await again.commit()
    finally:
        await source.close()
        await sink.close()
        await transport.close()
