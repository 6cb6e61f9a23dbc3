"""Delayed messages in SQL queue tables, stored and moved as the NServiceBus SQL transports do.

NServiceBus layout
    A message the bridge is asked to delay to queue table `D` is a row of `D`'s delayed table,
    `<D>.<suffix>` (the connection's `delayed_suffix`, NServiceBus's `TableSuffix`, default
    `Delayed`: SqlServer/DelayedDelivery/DelayedDeliveryOptions.cs:15-24, the table named as
    a `QueueAddress` qualifier: PostgreSql/Addressing/QueueAddressTranslator.cs:69-80), with
    the header `NServiceBus.SqlServer.ForwardDestination` = `D`'s canonical address
    (Sql.Shared/DelayedDelivery/StoreDelayedMessageCommand.cs:18) and `Due` = the database's
    UTC clock + the delay, written by the transport's `StoreDelayedMessageText` (SQL Server:
    verbatim; PostgreSQL: the same expression; SQLite: the same columns in its types, `due`
    as ISO 8601 UTC text). A running NServiceBus endpoint `D` moves it into `D` itself, and so
    does every `bridge run` whose routes send to `D` (`bridge.service.movers`): the
    transport's `MoveDueDelayedMessageText`, which deletes up to a batch of due rows and
    inserts them into `D` in one statement and one transaction, so movers compete safely.

NGinn layout
    A delayed message is an `R` row whose `retry_time` is the database's local clock + the
    delay (nginn.md, "Mapping"), moved to `I` by NGinn or by the bridge (`nginn.retries`).

`DelayedStatements.next_due` gives the seconds until the earliest row is due (negative or zero:
some are due now), by the database clock, which the mover waits (with a cap) before it moves
again (Sql.Shared/DelayedDelivery/DelayedMessageTable.cs:57-74).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from bridge.envelope import Envelope
from bridge.transports.sql import headers as headers_codec
from bridge.transports.sql.dialects import tsql
from bridge.transports.sql.dialects.base import DbConnection, DbCursor, Dialect
from bridge.transports.sql.layouts.base import new_id
from bridge.transports.sql.layouts.nginn_sql import local_delay_ms

__all__ = [
    "FORWARD_DESTINATION",
    "MISSING_DELAYED_TABLE",
    "MOVE_BATCH",
    "DelayedStatements",
    "Moved",
    "delayed_statements",
    "last_rows",
    "move_due",
    "move_if_due",
    "seconds_to_next_due",
    "store_params",
]

FORWARD_DESTINATION = "NServiceBus.SqlServer.ForwardDestination"
#: Rows moved per transaction: NServiceBus's default `BatchSize` (DelayedDeliveryOptions.cs:38).
MOVE_BATCH = 100
#: What to do about a missing delayed table: the bridge creates those of the tables it
#: installs; an endpoint's own is its installer's.
MISSING_DELAYED_TABLE = (
    "`bridge install` creates the delayed tables of the proxies and event queues it creates "
    "(`proxies: {create: true}`); an endpoint's own queue gets its delayed table from the "
    "endpoint's installer (NServiceBus with native delayed delivery) or by hand"
)


@dataclass(frozen=True, slots=True)
class DelayedStatements:
    """The statements of one destination's delayed rows.

    table     the delayed table's (unquoted) name; "" where the rows wait in the queue table
    create    DDL, idempotent (none for NGinn: its `R` rows are in the queue table)
    store     params `store_params(...)`
    move      statements run in order in one transaction by `move_due`: up to a batch of due
              rows into the queue table (NGinn: its mover, due `R` rows back to `I`)
    next_due  -> at most one row: seconds until the earliest waiting row is due
    waiting   -> one row: how many rows wait
    """

    table: str
    create: tuple[str, ...]
    store: str
    move: tuple[str, ...]
    next_due: str
    waiting: str


def delayed_statements(dialect: Dialect, name: str, suffix: str) -> DelayedStatements:
    """The delayed statements for queue table `name` on `dialect`."""
    if dialect.layout_name == "nginn":
        return _nginn(dialect, name)
    if dialect.kind == "sqlserver":
        return _sqlserver(dialect, name, f"{name}.{suffix}")
    if dialect.kind == "postgresql":
        return _postgresql(dialect, name, f"{name}.{suffix}")
    return _sqlite(dialect, name, f"{name}.{suffix}")


def store_params(
    dialect: Dialect, envelope: Envelope, due_ms: int, address: str, now: float
) -> Sequence[Any]:
    """The parameters of `store` for `envelope`, due in `due_ms` milliseconds, to queue table
    `address`. HeadersFormatError where the row cannot hold its headers."""
    if dialect.layout_name == "nginn":
        row = dialect.layout.outgoing(envelope, now, address=address)
        if dialect.kind == "sqlserver":  # added to local getdate(): see `local_delay_ms`
            from bridge.transports.sql.layouts.nginn import NGinnLayout

            assert isinstance(dialect.layout, NGinnLayout)
            due_ms = local_delay_ms(due_ms, now, dialect.layout.mapping.zone)
        return (*row[:2], due_ms, *row[2:])
    headers = envelope.headers.copy()
    headers.set(FORWARD_DESTINATION, dialect.canonical_address(address))
    text = headers_codec.write(headers)
    body = bytes(envelope.body)
    if dialect.kind == "sqlite":
        return (new_id(), text, body, due_ms)
    span = timedelta(milliseconds=due_ms)  # TimeSpan's parts (StoreDelayedMessageCommand.cs)
    hours, rest = divmod(span.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = (span.days, hours, minutes, seconds, span.microseconds // 1000)
    return (*parts, text, body) if dialect.kind == "postgresql" else (text, body, *parts)


def last_rows(cursor: DbCursor) -> Sequence[Sequence[Any]]:
    """The rows of the last result set of a statement batch (T-SQL returns a count first)."""
    while cursor.description is None:
        if not getattr(cursor, "nextset", lambda: False)():
            return []
    return cursor.fetchall()


class Moved(NamedTuple):
    """What one move did: the rows it moved (None where the driver does not say) and the
    seconds until the earliest row left is due (None: none left)."""

    rows: int | None
    next_due: float | None

    @property
    def stalled(self) -> bool:
        """Nothing moved although a row is due: another transaction holds the due rows."""
        return self.rows == 0 and self.next_due is not None and self.next_due <= 0


def move_due(
    dialect: Dialect, statements: DelayedStatements, db: DbConnection, batch: int
) -> Moved:
    """Move up to `batch` due rows in one transaction, committed; then the seconds until the
    earliest row left is due, as `DelayedMessageTable.MoveDueMessages`."""
    dialect.begin(db)
    cursor = db.cursor()
    if dialect.kind == "sqlite":
        cut_off = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        cursor.execute(statements.move[0], (cut_off, batch))
        rows = cursor.rowcount  # the copy's: the delete takes the same rows
        for statement in statements.move[1:]:
            cursor.execute(statement, (cut_off, batch))
    elif dialect.layout_name == "nginn":
        cursor.execute(statements.move[0])
        rows = cursor.rowcount
    else:
        cursor.execute(statements.move[0], (batch,))
        rows = cursor.rowcount
    db.commit()
    try:
        return Moved(None if rows < 0 else rows, seconds_to_next_due(statements, db))
    finally:
        db.rollback()


def move_if_due(
    dialect: Dialect, statements: DelayedStatements, db: DbConnection, batch: int
) -> Moved:
    """`move_due` when a row is due, by a read first (an idle table costs no write
    transaction, which on SQLite would take the file's write lock)."""
    try:
        waiting = seconds_to_next_due(statements, db)
    finally:
        db.rollback()
    if waiting is None or waiting > 0:
        return Moved(0, waiting)
    return move_due(dialect, statements, db, batch)


def seconds_to_next_due(statements: DelayedStatements, db: DbConnection) -> float | None:
    """Seconds until the earliest waiting row is due (None: nothing waits)."""
    cursor = db.cursor()
    cursor.execute(statements.next_due)
    rows = last_rows(cursor)
    return None if not rows or rows[0][0] is None else float(rows[0][0])


# -- PostgreSQL (PostgreSqlConstants.cs:21-30, 46-53, 111-119) -------------------------------


def _postgresql(d: Dialect, name: str, delayed: str) -> DelayedStatements:
    t, q = d.table(delayed), d.table(name)
    tp, qp = d.param_safe(t), d.param_safe(q)
    utc = "now() AT TIME ZONE 'UTC'"
    return DelayedStatements(
        table=delayed,
        create=(
            f"CREATE TABLE IF NOT EXISTS {t} (\n"
            "    Id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY, \n"
            "    Headers text NOT NULL,\n"
            "    Body bytea,\n"
            "    Due timestamptz NOT NULL\n"
            ") WITH (fillfactor=100)",
            f"CREATE INDEX IF NOT EXISTS  {d.quote(delayed + '_Due')} on {t}(Due)",
        ),
        store=(
            "WITH params (DueDate) as (\n"
            f"   values (timestamptz ({utc}) + (%s || ' days ')::INTERVAL + "
            "(%s || ' hours ')::INTERVAL + (%s || ' mins ')::INTERVAL + "
            "(%s || ' s ')::INTERVAL + (%s || ' ms')::INTERVAL)\n"
            ")\n"
            f"INSERT INTO {tp} (\n    Headers,\n    Body,\n    Due)\n"
            "SELECT %s, %s, DueDate\nFROM params"
        ),
        move=(
            f"WITH message as (DELETE FROM {tp} WHERE id in (SELECT id from {tp} WHERE "
            f"{tp}.Due < {utc} LIMIT %s) \n"
            "RETURNING id, headers, body)\n"
            f"INSERT into {qp} (id, expires, headers, body) SELECT id, NULL, headers, body "
            "FROM message",
        ),
        next_due=f"SELECT EXTRACT(EPOCH FROM Due - ({utc})) FROM {t} ORDER BY Due LIMIT 1",
        waiting=f"SELECT count(*) FROM {t}",
    )


# -- SQL Server (SqlServerConstants.cs:59-82, 109-125, 222-258), verbatim --------------------


def _sqlserver(d: Dialect, name: str, delayed: str) -> DelayedStatements:
    t, q = d.table(delayed), d.table(name)
    catalog: str | None = getattr(d, "catalog", None)
    return DelayedStatements(
        table=delayed,
        create=(tsql.create_delayed_store(t, catalog),),
        store=tsql.store_delayed(t),
        move=(tsql.move_due_delayed(t, q),),
        next_due=(
            "SELECT TOP 1 CAST(ROUND((CAST(Due AS float) - CAST(GETUTCDATE() AS float)) "
            f"* 86400, 3) AS float)\nFROM {t} WITH (READPAST)\nORDER BY Due"
        ),
        waiting=f"SELECT count(*) FROM {t} WITH (READPAST)",
    )


# -- SQLite: the PostgreSQL columns in SQLite's types ----------------------------------------


def _sqlite(d: Dialect, name: str, delayed: str) -> DelayedStatements:
    t, q = d.table(delayed), d.table(name)
    due = "due < ?"
    return DelayedStatements(
        table=delayed,
        create=(
            f"CREATE TABLE IF NOT EXISTS {t} (\n"
            "  id TEXT NOT NULL UNIQUE,\n"
            "  headers TEXT NOT NULL,\n"
            "  body BLOB,\n"
            "  due TEXT NOT NULL,\n"
            "  seq INTEGER PRIMARY KEY AUTOINCREMENT\n"
            ")",
            f"CREATE INDEX IF NOT EXISTS {d.quote(delayed + '_due')} ON {t} (due)",
        ),
        store=(
            f"INSERT INTO {t} (id, headers, body, due)\n"
            "VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', (? / 1000.0) || ' seconds'))"
        ),
        # One writer, and SQLite's clock is this process's: a cut-off passed to both
        # statements makes the delete take exactly the rows the insert copied.
        move=(
            f"INSERT INTO {q} (id, expires, headers, body)\n"
            f"SELECT id, NULL, headers, body FROM {t} WHERE {due} ORDER BY due, seq LIMIT ?",
            f"DELETE FROM {t} WHERE seq IN "
            f"(SELECT seq FROM {t} WHERE {due} ORDER BY due, seq LIMIT ?)",
        ),
        next_due=(
            f"SELECT (julianday(due) - julianday('now')) * 86400.0 FROM {t} ORDER BY due LIMIT 1"
        ),
        waiting=f"SELECT count(*) FROM {t}",
    )


# -- NGinn: `R` rows in the queue table --------------------------------------------------------


def _nginn(d: Dialect, name: str) -> DelayedStatements:
    from bridge.transports.sql.layouts.nginn import NGinnLayout

    layout = d.layout
    assert isinstance(layout, NGinnLayout)
    s = layout.nginn_statements(name)
    return DelayedStatements(
        table="",
        create=(),
        store=s.send_delayed,
        move=(s.mover,),
        next_due=s.next_due,
        waiting=s.scheduled,
    )
