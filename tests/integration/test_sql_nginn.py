"""NGinn.MessageBus queue tables on real PostgreSQL and SQLite, against NGinn's own statements.

`tests.support.nginn` replays NGinn's insert, two-step receive and mover verbatim (translated
only where T-SQL differs), on a session whose clock is in the server's time zone, Asia/Tokyo
(UTC+9) here, so a time column read or written as UTC would be nine hours off.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from bridge.batch import Batch
from bridge.commands import describe_stats
from bridge.envelope import Envelope, Headers
from bridge.nservicebus.wireformat import parse_timestamp
from bridge.protocols import QueueStats
from bridge.transports.sql.config import PostgresConnection, SqliteConnection
from bridge.transports.sql.layouts.nginn import NGinnLayout
from bridge.transports.sql.source import SqlSource
from bridge.transports.sql.transport import Transport
from tests.conftest import unique
from tests.support.nginn import NGinn, nginn_headers

pytestmark = pytest.mark.integration

ZONE = "Asia/Tokyo"
ORDER_TYPE = "Sales.Messages.OrderPlaced, Sales.Messages"
TYPES = {"Sales.OrderPlaced": ORDER_TYPE}


class OrderPlaced:
    """The handler's message class, which NGinn picks by `$type` (JsonMessageSerializer.cs:63)."""

    def __init__(self, OrderId: int) -> None:
        self.order_id = OrderId


def deserialize(text: str) -> object:
    """Newtonsoft with TypeNameHandling.Objects: `$type` must be the first property."""
    members = json.loads(text)
    type_name = next(iter(members))
    assert type_name == "$type", "NGinn would hand the handler an untyped object"
    cls = {ORDER_TYPE: OrderPlaced}[members.pop("$type")]
    return cls(**members)


class Db:
    """One NGinn database (a PostgreSQL schema or a SQLite file) and the bridge's view of it."""

    def __init__(self, kind: str, config: dict[str, Any], where: str) -> None:
        self.kind = kind
        self.config = config
        self.where = where
        self.table = unique("Orders")

    def transport(self, **nginn: Any) -> Transport:
        settings = {"layout": "nginn", "nginn": {"timezone": ZONE, "alias": "db"} | nginn}
        if self.kind == "sqlite":
            return Transport("shop", SqliteConnection.model_validate(self.config | settings))
        return Transport("shop", PostgresConnection.model_validate(self.config | settings))

    def nginn(self, table: str | None = None) -> NGinn:
        return NGinn(self.kind, self.where, table or self.table, ZONE)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    if request.param == "sqlite":
        path = str(tmp_path / "nginn.db")
        yield Db("sqlite", {"type": "sqlite", "path": path}, path)
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = request.getfixturevalue("pg_schema")
    yield Db("postgresql", {"type": "postgresql", "dsn": dsn, "schema": schema}, f"{dsn}|{schema}")


@pytest.fixture
async def bridge(db: Db) -> AsyncIterator[Transport]:
    transport = db.transport(types=TYPES)
    await transport.install([db.table])
    yield transport
    await transport.close()


async def receive(source: SqlSource, n: int = 100) -> Batch:
    return await source.receive_batch(n, 2.0)


def local(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


async def test_rows_nginn_inserts_are_taken_many_per_transaction_and_kept_as_x(
    db: Db, bridge: Transport
) -> None:
    nginn = db.nginn()
    body = '{"$type":"%s","OrderId":%d}'
    for n in range(3):
        nginn.send(body % (ORDER_TYPE, n), f"Custom=v{n}", unique_id=f"u-{n}", correlation_id="c")
    nginn.send(body % (ORDER_TYPE, 9), to="sql://db/Elsewhere")  # NGinn's to forward: stays
    later = nginn.now() + timedelta(hours=1)
    nginn.send(body % (ORDER_TYPE, 8), deliver_at=later)  # scheduled: R until due
    before = datetime.now(UTC)
    source = bridge.source(db.table)
    batch = await receive(source)
    assert [json.loads(m.body)["OrderId"] for m in batch.messages] == [0, 1, 2]
    first = batch.messages[0].headers
    assert first.get("NServiceBus.MessageId") == "u-0" and first.get("Custom") == "v0"
    assert first.get("NServiceBus.EnclosedMessageTypes") == "Sales.OrderPlaced"
    assert first.get("NServiceBus.OriginatingEndpoint") == "sql://db/Sender"
    assert first.get("NServiceBus.ReplyToAddress") == "sql://db/Sender"
    sent = parse_timestamp(first.get("NServiceBus.TimeSent") or "")
    assert abs((sent - before).total_seconds()) < 5, "insert_time is Tokyo time, TimeSent UTC"
    await batch.commit()
    await source.close()
    rows = nginn.rows()
    assert [r["subqueue"] for r in rows] == ["X", "X", "X", "I", "R"]
    assert all(r["last_processed"] is not None for r in rows[:3])
    processed = datetime.fromisoformat(str(rows[0]["last_processed"]))
    assert abs((processed - nginn.now()).total_seconds()) < 5, "last_processed in local time"
    # the row for another endpoint is not in the depth, but shown apart, and warned of; the
    # `R` row waits (tests/integration/test_sql_delayed.py)
    peeked = await bridge.peek(db.table)
    assert peeked == QueueStats(0, None, 0, elsewhere=1, delayed=1, next_due_seconds=ANY)
    [warning] = await bridge.check([db.table])
    assert "1 ready row(s) for other endpoints than 'sql://db/" in warning
    stats = describe_stats("shop", db.table, await bridge.peek(db.table), as_json=False)
    assert "for other endpoints: 1" in stats


async def test_an_aborted_batch_leaves_its_rows_ready(db: Db, bridge: Transport) -> None:
    db.nginn().send(f'{{"$type":"{ORDER_TYPE}","OrderId":1}}')
    source = bridge.source(db.table)
    batch = await receive(source)
    await batch.abort()
    await source.close()
    assert [r["subqueue"] for r in db.nginn().rows()] == ["I"]


async def test_expired_rows_are_dropped_as_x_and_unreadable_rows_go_to_f(
    db: Db, bridge: Transport
) -> None:
    nginn = db.nginn()
    past = (nginn.now() - timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M:%S")
    soon = (nginn.now() + timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M:%S")
    good = f'{{"$type":"{ORDER_TYPE}","OrderId":1}}'
    nginn.send(good, f"_NG-TTL={past}")
    nginn.send(good, f"_NG-TTL={soon}")
    nginn.send(good, "a=b=c")  # NGinn's own reader throws on it
    nginn.send("<not json/>")
    assert (await bridge.peek(db.table)).expired == 1
    source = bridge.source(db.table)
    batch = await receive(source)
    assert batch.expired == 1 and len(batch.messages) == 1 and len(batch.poison) == 2
    lifetime = (batch.messages[0].expires_at or 0) - datetime.now(UTC).timestamp()
    assert 50 < lifetime <= 60, "the TTL is Tokyo time, compared with the database's"
    await batch.commit()
    await source.close()
    rows = nginn.rows()
    assert [r["subqueue"] for r in rows] == ["X", "X", "F", "F"]
    assert "invalid NGinn header string" in rows[2]["error_info"]
    assert "cannot be read" in rows[3]["error_info"] and rows[3]["retry_count"] == 1


async def test_unreadable_rows_go_to_the_routes_error_queue_when_it_names_one(
    db: Db, bridge: Transport
) -> None:
    errors = unique("errors")
    await bridge.install([errors])
    raw = "a=b=c|Tenant=acme"
    nginn = db.nginn()
    nginn.send("{}", raw, unique_id="bad-1", correlation_id="c-9", from_endpoint="sql://db/Ship")
    (original,) = nginn.rows()
    source = bridge.source(db.table, error_queue=errors)
    batch = await receive(source)
    assert len(batch.poison) == 1
    await batch.commit()
    await source.close()
    assert [r["subqueue"] for r in nginn.rows()] == ["X"]
    (copy,) = db.nginn(errors).rows()
    assert copy["subqueue"] == "I" and copy["error_info"].startswith("NGinn row ")
    assert copy["to_endpoint"] == f"sql://db/{errors}" and copy["msg_text"] == "{}"
    # its identity, from the row's columns
    assert copy["unique_id"] == "bad-1" and copy["correlation_id"] == "c-9"
    assert copy["from_endpoint"] == "sql://db/Ship"
    headers = nginn_headers(copy["msg_headers"])
    assert headers["NServiceBus.MessageId"] == "bad-1"
    assert headers["NGinn.Id"] == str(original["id"]) and headers["NGinn.To"] == nginn.endpoint
    assert headers["NServiceBus.FailedQ"]
    # what NGinn cannot carry in msg_headers (the raw headers, `=` in them) is in error_info
    left_out = json.loads(copy["error_info"].split("NGinn.HeadersLeftOut: ", 1)[1])
    assert left_out["NServiceBus.Bridge.RawHeaders"] == raw
    assert "invalid NGinn header string" in left_out["NServiceBus.ExceptionInfo.Message"]
    assert int(headers["NGinn.HeadersLeftOut"]) == len(left_out)


async def test_rows_the_bridge_writes_are_nginns_own(db: Db, bridge: Transport) -> None:
    """An NServiceBus message reaches NGinn's two-step receive and deserializes by `$type`."""
    message_id = "6b1e0cbe-0b4a-4fd1-b1a4-1f7c0f9f6f01"
    headers = Headers(
        [
            ("NServiceBus.MessageId", message_id),
            ("NServiceBus.EnclosedMessageTypes", "Sales.OrderPlaced, Sales, Version=1.0.0.0"),
            ("NServiceBus.ReplyToAddress", "Billing@[dbo]@[shop]"),
            ("NServiceBus.CorrelationId", message_id),
            ("NServiceBus.TimeSent", "2026-11-26 07:47:04:123456 Z"),
        ]
    )
    sink = bridge.sink(db.table)
    await sink.send([Envelope(headers, b'{"OrderId": 41}')])
    await sink.close()
    nginn = db.nginn()
    got = nginn.receive()
    assert got is not None
    assert got.to_endpoint == nginn.endpoint and got.from_endpoint == "sql://db/Billing"
    assert got.unique_id == message_id and got.correlation_id == message_id
    message = deserialize(got.body)
    assert isinstance(message, OrderPlaced) and message.order_id == 41
    assert got.headers["NServiceBus.MessageId"] == message_id
    assert "NServiceBus.EnclosedMessageTypes" not in got.headers  # `Version=`: left out
    assert got.headers["NGinn.HeadersLeftOut"] == "1"
    (row,) = nginn.rows()
    assert row["subqueue"] == "X" and row["label"] == "Sales.OrderPlaced"
    inserted = datetime.fromisoformat(str(row["insert_time"]))
    assert abs((inserted - nginn.now()).total_seconds()) < 5, "insert_time in Tokyo time"
    assert row["retry_time"] == row["insert_time"] and row["retry_count"] == 0
    assert nginn.receive() is None


async def test_a_message_nginn_could_not_take_is_refused_before_anything_is_written(
    db: Db, bridge: Transport
) -> None:
    from bridge.errors import MessageRejected

    sink = bridge.sink(db.table)
    unmapped = Headers([("NServiceBus.EnclosedMessageTypes", "Other.Event, Other")])
    good = Headers([("NServiceBus.EnclosedMessageTypes", "Sales.OrderPlaced")])
    with pytest.raises(MessageRejected, match=r"nginn\.types") as info:
        await sink.send([Envelope(good, b"{}"), Envelope(unmapped, b"{}")])
    assert info.value.index == 1
    await sink.close()
    assert db.nginn().rows() == []


async def test_with_retries_the_bridge_moves_due_r_rows_and_cleans_up_old_x_rows(
    db: Db,
) -> None:
    transport = db.transport(retries=True)
    await transport.install([db.table])
    nginn = db.nginn()
    due = nginn.now() - timedelta(seconds=1)
    nginn.send("{}", deliver_at=due)  # NGinn's retry of a failure, due now
    nginn.send("{}", deliver_at=nginn.now() + timedelta(hours=1))  # not yet
    nginn.send("{}", deliver_at=nginn.now() - timedelta(hours=13))
    nginn.execute("UPDATE {0} SET subqueue = 'X' WHERE id = 3")  # done 13 hours ago
    source = transport.source(db.table)
    batch = await receive(source)
    assert [m.headers.get("NGinn.Id") for m in batch.messages] == ["1"]
    await batch.commit()
    await source.close()
    await transport.close()
    assert [(r["id"], r["subqueue"]) for r in nginn.rows()] == [(1, "X"), (2, "R")]


async def test_a_failing_cleanup_is_logged_and_the_rows_are_received_still(
    db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    """NGinn logs its cleanup's and mover's errors and goes on receiving
    (SqlMessageTransport2.cs:936-940, 1007-1011): so does the bridge."""
    transport = db.transport(retries=True)
    await transport.install([db.table])
    nginn = db.nginn()
    if db.kind == "postgresql":  # a login without DELETE on the table
        schema = db.where.split("|")[1]
        nginn.execute(
            f'CREATE FUNCTION "{schema}".deny() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            "RAISE EXCEPTION 'permission denied' USING ERRCODE = '42501'; END $$"
        )
        nginn.execute(
            "CREATE TRIGGER deny BEFORE DELETE ON {0} FOR EACH ROW "
            f'EXECUTE FUNCTION "{schema}".deny()'
        )
    else:
        nginn.execute(
            "CREATE TRIGGER deny BEFORE DELETE ON {0} BEGIN SELECT RAISE(ABORT, 'no'); END"
        )
    nginn.send("{}", deliver_at=nginn.now() - timedelta(hours=13))
    nginn.execute("UPDATE {0} SET subqueue = 'X' WHERE id = 1")  # done 13 hours ago
    nginn.send("{}")
    source = transport.source(db.table)
    with caplog.at_level(logging.WARNING):
        batch = await receive(source)
    assert [m.headers.get("NGinn.Id") for m in batch.messages] == ["2"]
    await batch.commit()
    await source.close()
    await transport.close()
    assert [(r["id"], r["subqueue"]) for r in nginn.rows()] == [(1, "X"), (2, "X")]
    [warning] = [r for r in caplog.records if "housekeeping" in r.getMessage()]
    assert warning.levelno == logging.WARNING and db.table in warning.getMessage()


async def test_without_retries_r_rows_wait_for_nginns_own_mover(db: Db, bridge: Transport) -> None:
    nginn = db.nginn()
    nginn.send(f'{{"$type":"{ORDER_TYPE}","OrderId":5}}', deliver_at=nginn.now())
    source = bridge.source(db.table)
    assert not (await receive(source)).messages
    assert nginn.move_scheduled() == 1  # NamedQueries.sqlserver.json:16, replayed
    batch = await receive(source)
    assert [json.loads(m.body)["OrderId"] for m in batch.messages] == [5]
    await batch.commit()
    await source.close()


async def test_competing_receivers_never_take_the_same_row(db: Db, bridge: Transport) -> None:
    """PostgreSQL: each skips the rows another holds (SKIP LOCKED), NGinn's receive too;
    SQLite: one writer, so the second (its own connection) waits while the first holds its
    write transaction, and then finds only the rest."""
    nginn = db.nginn()
    for n in range(6):
        nginn.send(f'{{"$type":"{ORDER_TYPE}","OrderId":{n}}}')
    first, second = bridge.source(db.table), bridge.source(db.table)
    held = await receive(first, 2)
    if db.kind == "postgresql":
        other = await receive(second, 3)
        by_nginn = await asyncio.to_thread(nginn.receive)
        assert by_nginn is not None
        ids = [m.native_id for m in [*held.messages, *other.messages]] + [str(by_nginn.id)]
        await other.commit()
        await held.commit()
    else:
        waiting = asyncio.create_task(receive(second, 3))
        done, _ = await asyncio.wait([waiting], timeout=0.5)
        assert not done, "a second writer took rows while the first held its transaction"
        await held.commit()
        other = await waiting
        ids = [m.native_id for m in [*held.messages, *other.messages]]
        await other.commit()
    assert len(held.messages) == 2 and len(other.messages) == 3
    assert len(ids) == len(set(ids)) == (6 if db.kind == "postgresql" else 5)
    await first.close()
    await second.close()


async def test_install_prints_the_table_and_its_index(db: Db, bridge: Transport) -> None:
    printed = await bridge.install([db.table], print_only=True)
    assert "subqueue char(1) NOT NULL" in printed[0]
    assert f"IDX_{db.table}_subqueue_retry_time" in printed[1]
    assert await bridge.check([db.table]) == []
    assert isinstance(bridge.dialect.layout, NGinnLayout)


async def test_names_with_quotes_and_percent_signs_work_in_every_statement(db: Db) -> None:
    table = 'Or"d%ers'
    transport = db.transport(types=TYPES, retries=True)
    await transport.install([table])
    nginn = db.nginn(table)
    nginn.send("{}", deliver_at=nginn.now())
    sink = transport.sink(table)
    await sink.send(
        [Envelope(Headers([("NServiceBus.EnclosedMessageTypes", "Sales.OrderPlaced")]), b"{}")]
    )
    await sink.close()
    assert (await transport.peek(table)).depth == 1
    source = transport.source(table)
    batch = await receive(source)  # after the mover: the R row is due
    assert len(batch.messages) == 2
    await batch.commit()
    await source.close()
    await transport.close()
    assert [r["subqueue"] for r in nginn.rows()] == ["X", "X"]


async def test_a_move_between_two_nginn_tables_of_one_database_is_one_transaction(
    db: Db, bridge: Transport
) -> None:
    inbox = unique("Inbox")
    await bridge.install([inbox])
    db.nginn().send(
        order := f'{{"$type":"{ORDER_TYPE}","OrderId":3}}', "Tenant=acme", unique_id="u"
    )
    source = bridge.source(db.table)
    sink = source.sink_in_transaction(inbox)
    batch = await receive(source)
    await sink.send(batch.messages)
    if db.kind == "postgresql":  # SQLite's one writer: nobody else looks before the commit
        assert [r["subqueue"] for r in db.nginn().rows()] == ["I"]
        assert db.nginn(inbox).rows() == []
    await batch.commit()
    await source.close()
    got = db.nginn(inbox).receive()
    assert got is not None and got.to_endpoint == f"sql://db/{inbox}" and got.body == order
    assert got.unique_id == "u" and got.headers["Tenant"] == "acme"
    assert [r["subqueue"] for r in db.nginn().rows()] == ["X"]


def test_a_delay_across_a_daylight_saving_change_is_due_when_asked(pg_dsn: str) -> None:
    """A delayed message's `retry_time` is the UTC clock plus the delay, made local: a local
    time plus the delay would be due an hour early or late across a change. Europe/Berlin,
    2026-03-29 00:30 UTC (01:30 CET) plus one hour is 01:30 UTC, 03:30 CEST (02:30 local does
    not exist that day)."""
    import psycopg

    from bridge.transports.sql.dialects.postgresql import PostgresDialect
    from bridge.transports.sql.layouts.nginn_sql import statements

    config = PostgresConnection.model_validate(
        {
            "type": "postgresql",
            "dsn": pg_dsn,
            "layout": "nginn",
            "nginn": {"alias": "db", "timezone": "Europe/Berlin"},
        }
    )
    insert = statements(PostgresDialect("pg", config), "Q", "Europe/Berlin").send_delayed
    due = insert[insert.index("((now()") :].split(", %s", 1)[0]
    fixed = due.replace("now()", "timestamptz '2026-03-29 00:30:00+00'")
    with psycopg.connect(pg_dsn) as db:
        (local,) = db.execute(f"SELECT {fixed}", (3_600_000,)).fetchone()  # type: ignore[misc]
    assert local == datetime(2026, 3, 29, 3, 30)
