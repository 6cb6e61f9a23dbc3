"""NGinn.MessageBus's subscription table (`nginn.subscriptions`, default
`NGinnMessageBus_Subscriptions`), written and read as NGinn's `SqlSubscriptionService` does.

Facts (lafar6502/nginn-messagebus @1fa4baf, `NGinnBPM.MessageBus/`):

- the table: `publisher_endpoint varchar(200), subscriber_endpoint varchar(200), message_type
  varchar(300), created_date datetime not null, expiration_date datetime null`, primary key
  (publisher_endpoint, message_type, subscriber_endpoint), created behind `IF not exists`
  (create_subscribertable.sqlserver.sql);
- Subscribe is an UPDATE of the row's `expiration_date` and, when it changed no row, an INSERT
  with `created_date` the server's `getdate()` (Impl/SqlSubscriptionService.cs:104-134, the texts
  at Impl/SqlQueue/NamedQueries.sqlserver.json:28-29); Unsubscribe deletes the row (:30, whose
  SQL Server text has `:pub`, which SqlClient does not bind: `@pub` here);
- a publisher reads `select subscriber_endpoint, message_type from {0} where
  publisher_endpoint=@pub and (expiration_date is null or expiration_date >= getdate())` (:27)
  and sends to the subscribers of each class of its event's chain up to System.Object
  (Impl/MessageBus.cs:264-287).

An endpoint is `sql://<alias>/<table>`; a message type is the .NET full name (`Ns.Type`), the
part of `nginn.types`' `Ns.Type, Assembly` before the comma (`NGinnOptions.message_type`).

SQL Server gets NGinn's text with the dialect's quoted name and a `DECLARE` binding the names
(as `tsql` does). PostgreSQL and SQLite (NGinn ships no script for either) get the same columns
in their types (`timestamp`; SQLite's `YYYY-MM-DD HH:MM:SS.fff` text) and the same statements,
`getdate()` being the local time of `nginn.timezone` as in the queue tables (`nginn_sql`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from bridge.transports.sql.connection import Connection
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.layouts.nginn_formats import parse_local
from bridge.transports.sql.layouts.nginn_sql import local_now
from bridge.transports.sql.subscriptions import OwnConnectionTable

__all__ = [
    "NGinnSubscriptionRow",
    "NGinnSubscriptionStatements",
    "NGinnSubscriptionTable",
    "statements",
]

#: (publisher_endpoint, subscriber_endpoint, message_type, created_date, expiration_date)
NGinnSubscriptionRow = tuple[str, str, str, Any, Any]


@dataclass(frozen=True)
class NGinnSubscriptionStatements:
    """create: DDL, idempotent. update: params `update_order` of pub, sub, mtype, expiration
    (changes the row's expiration; its row count says whether the row is there). insert:
    params (pub, sub, mtype, expiration). delete: params (pub, sub, mtype). rows: every row
    (`NGinnSubscriptionRow`), ordered. subscribers: `{0}` the message types' parameters, after
    the publisher's -> distinct subscriber endpoints whose rows have not expired. clock: the
    local time `expiration_date` is compared with (NGinn's `getdate()`)."""

    create: str
    update: str
    update_order: tuple[str, ...]
    insert: str
    delete: str
    rows: str
    subscribers_template: str
    placeholder: str
    clock: str

    def subscribers(self, count: int) -> str:
        return self.subscribers_template.format(", ".join([self.placeholder] * count))


_COLUMNS = "publisher_endpoint, subscriber_endpoint, message_type, created_date, expiration_date"
_ORDER = "order by publisher_endpoint, message_type, subscriber_endpoint"


def _sqlserver(d: Dialect, name: str) -> NGinnSubscriptionStatements:
    from bridge.transports.sql.dialects import tsql

    t = d.table(name)
    catalog: str | None = getattr(d, "catalog", None)
    objects = f"{tsql.bracket(catalog)}.sys.objects" if catalog else "sys.objects"
    literal = t.replace("'", "''")
    create = (
        f"IF  not exists (SELECT * FROM {objects} WHERE object_id = OBJECT_ID(N'{literal}') "
        "AND type in (N'U'))\n"
        "BEGIN\n"
        f"create table {t} (\n"
        "\tpublisher_endpoint varchar(200) not null,\n"
        "\tsubscriber_endpoint varchar(200) not null,\n"
        "\tmessage_type varchar(300) not null,\n"
        "\tcreated_date datetime not null,\n"
        "\texpiration_date datetime null,\n"
        f"\tCONSTRAINT {tsql.bracket('PK_' + name)} PRIMARY KEY CLUSTERED \n"
        "\t(\n"
        "\t\tpublisher_endpoint,\n"
        "\t\tmessage_type,\n"
        "\t\tsubscriber_endpoint\n"
        "\t) \n"
        ")\n"
        "END"
    )
    names = "@pub varchar(200) = ?, @sub varchar(200) = ?, @mtype varchar(300) = ?"
    return NGinnSubscriptionStatements(
        create=create,
        update=(
            f"DECLARE {names}, @expiration datetime = ?;\n"
            f"update {t} set expiration_date=@expiration where publisher_endpoint=@pub and "
            "subscriber_endpoint=@sub and message_type=@mtype"
        ),
        update_order=("pub", "sub", "mtype", "expiration"),
        insert=(
            f"DECLARE {names}, @expiration datetime = ?;\n"
            f"insert into {t} ({_COLUMNS}) values(@pub, @sub, @mtype, getdate(), @expiration)"
        ),
        delete=(
            f"DECLARE {names};\n"
            f"delete {t} where publisher_endpoint=@pub and subscriber_endpoint=@sub and "
            "message_type=@mtype"
        ),
        rows=f"select {_COLUMNS} from {t} {_ORDER}",
        subscribers_template=(
            "DECLARE @pub varchar(200) = ?;\n"
            f"select distinct subscriber_endpoint from {t} where publisher_endpoint=@pub and "
            "(expiration_date is null or expiration_date >= getdate()) "
            "and message_type in ({0})"
        ),
        placeholder="?",
        clock="select getdate()",
    )


def _portable(d: Dialect, name: str, zone: str) -> NGinnSubscriptionStatements:
    """PostgreSQL and SQLite: NGinn's statements, each database's types and local clock."""
    pg = d.kind == "postgresql"
    t = d.table(name)
    tp = d.param_safe(t)
    p = d.placeholder
    now = local_now(d, zone)
    time = "timestamp" if pg else "datetime"
    create = (
        f"CREATE TABLE IF NOT EXISTS {t} (\n"
        "  publisher_endpoint varchar(200) NOT NULL,\n"
        "  subscriber_endpoint varchar(200) NOT NULL,\n"
        "  message_type varchar(300) NOT NULL,\n"
        f"  created_date {time} NOT NULL,\n"
        f"  expiration_date {time} NULL,\n"
        f"  CONSTRAINT {d.quote('PK_' + name)} PRIMARY KEY "
        "(publisher_endpoint, message_type, subscriber_endpoint))"
    )
    return NGinnSubscriptionStatements(
        create=create,
        update=(
            f"update {tp} set expiration_date={p} where publisher_endpoint={p} and "
            f"subscriber_endpoint={p} and message_type={p}"
        ),
        update_order=("expiration", "pub", "sub", "mtype"),
        insert=f"insert into {tp} ({_COLUMNS}) values({p}, {p}, {p}, {now}, {p})",
        delete=(
            f"delete from {tp} where publisher_endpoint={p} and subscriber_endpoint={p} and "
            f"message_type={p}"
        ),
        rows=f"select {_COLUMNS} from {t} {_ORDER}",
        subscribers_template=(
            f"select distinct subscriber_endpoint from {tp} where publisher_endpoint={p} and "
            f"(expiration_date is null or expiration_date >= {now}) "
            "and message_type in ({0})"
        ),
        placeholder=p,
        clock=f"select {now}",
    )


def statements(dialect: Dialect, name: str) -> NGinnSubscriptionStatements:
    """The statements of NGinn subscription table `name` on `dialect`'s (`layout: nginn`)
    connection."""
    if dialect.kind == "sqlserver":
        return _sqlserver(dialect, name)
    zone = dialect.nginn.timezone if dialect.nginn is not None else "UTC"
    return _portable(dialect, name, zone)


class NGinnSubscriptionTable(OwnConnectionTable):
    """One connection's NGinn subscription table, run on a connection of its own (or the
    caller's transaction: `subscribers`)."""

    def __init__(self, dialect: Dialect, name: str, connection: Connection | None = None) -> None:
        super().__init__(dialect, name, connection)
        self.statements = statements(dialect, name)

    async def create(self) -> None:
        await self._connection.run(partial(self._execute, self.statements.create, ()))

    async def subscribe(self, publisher: str, subscriber: str, message_type: str) -> None:
        """NGinn's Subscribe with no expiration: the row's `expiration_date` set to NULL, or a
        new row with `created_date` now; one transaction."""
        await self._connection.run(partial(self._subscribe, publisher, subscriber, message_type))

    async def unsubscribe(self, publisher: str, subscriber: str, message_type: str) -> None:
        params = (publisher, subscriber, message_type)
        await self._connection.run(partial(self._execute, self.statements.delete, params))

    async def rows(self) -> list[NGinnSubscriptionRow]:
        return await self._connection.run(self._rows)

    async def missing(self, tables: Sequence[str]) -> list[str]:
        """The tables of `tables` (unquoted, in the connection's schema) that do not exist: a
        subscriber endpoint whose table is missing makes NGinn's Notify fail, in the
        publisher's transaction (Impl/MessageBus.cs:347-371 inserts into it)."""
        return await self._connection.run(partial(self._missing, list(tables)))

    async def rows_and_clock(self) -> tuple[list[NGinnSubscriptionRow], datetime]:
        """Every row, and the database's local time then (naive), which a row's
        `expiration_date` is compared with: a row whose expiration is before it is expired, and
        NGinn's publisher no longer reads it (NamedQueries.sqlserver.json:27)."""
        return await self._connection.run(self._rows_and_clock)

    def subscribers(
        self, db: DbConnection, publisher: str, message_types: Sequence[str]
    ) -> list[str]:
        """The endpoints subscribed to `publisher`'s messages of any of `message_types`, in
        the caller's transaction."""
        cursor = db.cursor()
        statement = self.statements.subscribers(len(message_types))
        cursor.execute(statement, [publisher, *message_types])
        return sorted(str(row[0]) for row in self.dialect.fetch(cursor))

    def _subscribe(self, pub: str, sub: str, mtype: str, db: DbConnection) -> None:
        values: dict[str, str | None] = {"pub": pub, "sub": sub, "mtype": mtype, "expiration": None}
        self.dialect.begin(db)
        cursor = db.cursor()
        cursor.execute(self.statements.update, [values[k] for k in self.statements.update_order])
        if cursor.rowcount == 0:
            cursor.execute(self.statements.insert, [pub, sub, mtype, None])
        db.commit()

    def _missing(self, tables: list[str], db: DbConnection) -> list[str]:
        try:
            return [t for t in tables if not self.dialect.table_exists(db, t)]
        finally:
            db.rollback()

    def _rows_and_clock(self, db: DbConnection) -> tuple[list[NGinnSubscriptionRow], datetime]:
        rows = self._rows(db)
        try:
            cursor = db.cursor()
            cursor.execute(self.statements.clock)
            ((now,),) = self.dialect.fetch(cursor)
            return rows, parse_local(now)
        finally:
            db.rollback()

    def _rows(self, db: DbConnection) -> list[NGinnSubscriptionRow]:
        try:
            cursor = db.cursor()
            cursor.execute(self.statements.rows)
            return [
                (str(p), str(s), str(m), created, expires)
                for p, s, m, created, expires in self.dialect.fetch(cursor)
            ]
        finally:
            db.rollback()
