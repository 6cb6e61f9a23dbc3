"""The native pub/sub table of the NServiceBus SQL transports: `SubscriptionRouting`.

Facts (Particular/NServiceBus.SqlServer@214c4e8f):

- the table: `QueueAddress, Endpoint, Topic`, NVARCHAR(200) on SQL Server (created behind the
  transport's usual guard, SqlServerConstants.cs:291-331), VARCHAR(200) on PostgreSQL
  (PostgreSqlConstants.cs:122-133), primary key (Endpoint, Topic); named per connection
  (`SubscriptionTableName`, default `SubscriptionRouting`: SubscriptionOptions.cs:14), in the
  connection's schema (and catalog), quoted (QualifiedSubscriptionTableName.cs);
- subscribe is an upsert by (Endpoint, Topic) setting QueueAddress: `MERGE ... WITH (HOLDLOCK,
  TABLOCK)` on SQL Server (SqlServerConstants.cs:333-352), `INSERT ... ON CONFLICT (Endpoint,
  Topic) DO UPDATE` on PostgreSQL (PostgreSqlConstants.cs:134-148); unsubscribe deletes the row
  of (Endpoint, Topic) (SqlServerConstants.cs:360-364, PostgreSqlConstants.cs:154-158);
- a publisher reads `SELECT DISTINCT QueueAddress FROM <table> WHERE Topic IN (...)` with one
  parameter per topic of the event's type hierarchy (SqlServerConstants.cs:354-358,
  SubscriptionTable.cs:61-90) and sends one copy to each address (MulticastToUnicastConverter.cs).

NServiceBus names its parameters (`@Endpoint`); the drivers here take positional ones. SQL Server
keeps the transport's text word for word behind one `DECLARE` that binds the names; PostgreSQL and
SQLite (no NServiceBus transport; the same table and upsert, SQLite 3.24's `ON CONFLICT`) put the
driver's placeholder where the name was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from bridge.transports.sql.connection import Connection
from bridge.transports.sql.dialects import tsql
from bridge.transports.sql.dialects.base import DbConnection, Dialect

__all__ = [
    "OwnConnectionTable",
    "Row",
    "SubscriptionStatements",
    "SubscriptionTable",
    "statements",
]

#: (QueueAddress, Endpoint, Topic)
Row = tuple[str, str, str]


@dataclass(frozen=True)
class SubscriptionStatements:
    create: str
    #: params: `subscribe_order` of endpoint, address, topic.
    subscribe: str
    subscribe_order: tuple[str, ...]
    #: params (endpoint, topic)
    unsubscribe: str
    #: -> (QueueAddress, Endpoint, Topic) rows, in (Endpoint, Topic) order
    rows: str
    #: `{0}`: the parameters of the topics.
    subscribers_template: str
    placeholder: str

    def subscribers(self, count: int) -> str:
        """The lookup of the addresses subscribed to any of `count` topics."""
        return self.subscribers_template.format(", ".join([self.placeholder] * count))


def _sqlserver(table: str, catalog: str | None) -> SubscriptionStatements:
    create = tsql.guarded_create(
        table,
        catalog,
        f"CREATE TABLE {table} (\n"
        "    QueueAddress NVARCHAR(200) NOT NULL,\n"
        "    Endpoint NVARCHAR(200) NOT NULL,\n"
        "    Topic NVARCHAR(200) NOT NULL,\n"
        "    PRIMARY KEY CLUSTERED\n"
        "    (\n"
        "        Endpoint,\n"
        "        Topic\n"
        "    )\n"
        ")",
    )
    declare = (
        "DECLARE @Endpoint nvarchar(200) = ?, @QueueAddress nvarchar(200) = ?, "
        "@Topic nvarchar(200) = ?;\n"
    )
    subscribe = (
        f"{declare}"
        f"MERGE {table} WITH (HOLDLOCK, TABLOCK) AS target\n"
        "USING(SELECT @Endpoint AS Endpoint, @QueueAddress AS QueueAddress, @Topic AS Topic) "
        "AS source\n"
        "ON target.Endpoint = source.Endpoint\n"
        "AND target.Topic = source.Topic\n"
        "WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN\n"
        "UPDATE SET QueueAddress = @QueueAddress\n"
        "WHEN NOT MATCHED THEN\n"
        "INSERT\n"
        "(\n"
        "    QueueAddress,\n"
        "    Topic,\n"
        "    Endpoint\n"
        ")\n"
        "VALUES\n"
        "(\n"
        "    @QueueAddress,\n"
        "    @Topic,\n"
        "    @Endpoint\n"
        ");"
    )
    unsubscribe = (
        "DECLARE @Endpoint nvarchar(200) = ?, @Topic nvarchar(200) = ?;\n"
        f"DELETE FROM {table}\n"
        "WHERE\n"
        "    Endpoint = @Endpoint and\n"
        "    Topic = @Topic"
    )
    return SubscriptionStatements(
        create=create,
        subscribe=subscribe,
        subscribe_order=("endpoint", "address", "topic"),
        unsubscribe=unsubscribe,
        rows=f"SELECT QueueAddress, Endpoint, Topic FROM {table} ORDER BY Endpoint, Topic",
        subscribers_template=f"SELECT DISTINCT QueueAddress\nFROM {table}\nWHERE Topic IN ({{0}})",
        placeholder="?",
    )


def _standard(table: str, placeholder: str, postgresql: bool) -> SubscriptionStatements:
    p = placeholder
    text = "VARCHAR(200)" if postgresql else "TEXT"
    create = (
        f"CREATE TABLE IF NOT EXISTS {table} (\n"
        f"    QueueAddress {text} NOT NULL,\n"
        f"    Endpoint {text} NOT NULL,\n"
        f"    Topic {text} NOT NULL,\n"
        "    PRIMARY KEY\n"
        "    (\n"
        "        Endpoint,\n"
        "        Topic\n"
        "    )\n"
        f"){' WITH (fillfactor=100)' if postgresql else ''}"
    )
    subscribe = (
        f"INSERT INTO {table}\n"
        "(\n"
        "    QueueAddress,\n"
        "    Topic,\n"
        "    Endpoint\n"
        ")\n"
        "VALUES\n"
        "(\n"
        f"    {p},\n"
        f"    {p},\n"
        f"    {p}\n"
        ")\n"
        f"ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = {p}"
    )
    return SubscriptionStatements(
        create=create,
        subscribe=subscribe,
        subscribe_order=("address", "topic", "endpoint", "address"),
        unsubscribe=f"DELETE FROM {table}\nWHERE\n    Endpoint = {p} and\n    Topic = {p}",
        rows=f"SELECT QueueAddress, Endpoint, Topic FROM {table} ORDER BY Endpoint, Topic",
        subscribers_template=f"SELECT DISTINCT QueueAddress\nFROM {table}\nWHERE Topic IN ({{0}})",
        placeholder=p,
    )


def statements(dialect: Dialect, name: str) -> SubscriptionStatements:
    """The statements of subscription table `name` on `dialect`'s connection."""
    table = dialect.table(name)
    if dialect.kind == "sqlserver":
        return _sqlserver(table, getattr(dialect, "catalog", None))
    return _standard(dialect.param_safe(table), dialect.placeholder, dialect.kind == "postgresql")


class OwnConnectionTable:
    """A table run on a connection of its own (or a publisher's): what every subscription
    table does besides its own statements."""

    def __init__(self, dialect: Dialect, name: str, connection: Connection | None) -> None:
        self.dialect = dialect
        self.name = name
        self._connection = connection or Connection(dialect)

    async def exists(self) -> bool:
        return await self._connection.run(self._exists)

    async def close(self) -> None:
        await self._connection.close()

    def _execute(self, statement: str, params: Sequence[object], db: DbConnection) -> None:
        """`statement` in a transaction of its own."""
        self.dialect.begin(db)
        cursor = db.cursor()
        if params:
            cursor.execute(statement, list(params))
        else:
            cursor.execute(statement)
        db.commit()

    def _exists(self, db: DbConnection) -> bool:
        try:
            return self.dialect.table_exists(db, self.name)
        finally:
            db.rollback()


class SubscriptionTable(OwnConnectionTable):
    """One connection's subscription table, run on a connection of its own."""

    def __init__(self, dialect: Dialect, name: str, connection: Connection | None = None) -> None:
        super().__init__(dialect, name, connection)
        self.statements = statements(dialect, name)

    async def create(self) -> None:
        await self._connection.run(partial(self._execute, self.statements.create, ()))

    async def subscribe(self, endpoint: str, address: str, topic: str) -> None:
        values = {"endpoint": endpoint, "address": address, "topic": topic}
        params = [values[name] for name in self.statements.subscribe_order]
        await self._connection.run(partial(self._execute, self.statements.subscribe, params))

    async def unsubscribe(self, endpoint: str, topic: str) -> None:
        params = (endpoint, topic)
        await self._connection.run(partial(self._execute, self.statements.unsubscribe, params))

    async def rows(self) -> list[Row]:
        return await self._connection.run(self._rows)

    def subscribers(self, db: DbConnection, topics: Sequence[str]) -> list[str]:
        """The addresses subscribed to any of `topics`, in the caller's transaction."""
        cursor = db.cursor()
        cursor.execute(self.statements.subscribers(len(topics)), list(topics))
        return [str(row[0]) for row in self.dialect.fetch(cursor)]

    def _rows(self, db: DbConnection) -> list[Row]:
        try:
            cursor = db.cursor()
            cursor.execute(self.statements.rows)
            return [(str(a), str(e), str(t)) for a, e, t in self.dialect.fetch(cursor)]
        finally:
            db.rollback()
