"""How often a SQL source polls its table, counted on real SQLite by the transactions it opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config.models import SqliteConnection
from bridge.envelope import Envelope, Headers
from bridge.transports.sql.dialect import DbConnection
from bridge.transports.sql.queue import SqlSink, SqlSource, SqlTransport
from bridge.transports.sql.sqlite import SqliteDialect

pytestmark = pytest.mark.integration


class CountingDialect(SqliteDialect):
    """SQLite, counting the transactions opened: every poll of a source opens one."""

    polls = 0

    def begin(self, db: DbConnection) -> None:
        self.polls += 1
        super().begin(db)


async def test_an_idle_source_polls_less_and_less_and_a_busy_one_at_once(tmp_path: Path) -> None:
    dialect = CountingDialect("db", SqliteConnection(type="sqlite", path=str(tmp_path / "q.db")))
    transport = SqlTransport("db", dialect)
    await transport.install(["Idle"])
    source, sink = SqlSource(dialect, "Idle"), SqlSink(dialect, "Idle")
    try:
        calls = 8
        for _ in range(calls):  # 4 idle seconds as the runner spends them, 0.5 s a receive
            assert not (await source.receive_batch(10, 0.5)).messages
        # 10 ms, 20 ms, ... doubling to 1 s between polls: 10 in 4 s (the old 10..250 ms
        # backoff, restarted by every receive, polled ~6 times a receive: 48)
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
