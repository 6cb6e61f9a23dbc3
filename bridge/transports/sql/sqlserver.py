"""SQL Server queue tables exactly as the NServiceBus SQL Server transport uses them (§1), pyodbc.

Features
    The transport's own table, creation script and statements (`bridge.transports.sql.tsql`
    holds all of their text). A receive deletes `TOP(@n)` rows with
    `UPDLOCK, READPAST, ROWLOCK`, so concurrent receivers skip each other's rows; rows come back
    in OUTPUT order, which follows the CTE's `ORDER BY RowVersion` in the plans SQL Server uses
    for it but is not guaranteed by the language. `Recoverable` is written only when the table
    has that column (looked up once per table). Tables with a clustered `RowVersion` index or
    a `varchar` Headers column work too; `check` warns about the latter and about a missing
    `Index_Expires`, with the transport's own queries.

Connection
    `{type: sqlserver, dsn: "Driver={ODBC Driver 18 for SQL Server};Server=...", schema: dbo,
    catalog: nservicebus}` (FreeTDS with TDS 7.4 works too). Queue names are
    `[catalog].[schema].[table]`; the canonical address is `table@[schema]@[catalog]` (§6).

What is lossy
    `@TimeToBeReceivedMs` is an Int32: a remaining lifetime above ~24.8 days
    (`tsql.INT32_MAX` ms) is written as no expiry at all (`Expires` NULL), so such a message
    outlives its TimeToBeReceived rather than expiring early. Expires is a `datetime`
    (1/300 s).

Errors
    SQLSTATE 08xxx (connection), HYT00/HYT01 (timeouts), 40001 and errors 1205 (deadlock),
    1222 (lock timeout), -2, 10054, 10060, 40613 are retriable; the rest are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from bridge.config.models import SqlServerConnection
from bridge.errors import ConfigError, TransportError
from bridge.transports.sql import tsql
from bridge.transports.sql.dialect import DbConnection, DbCursor, Dialect, scalar
from bridge.transports.sql.errors import sqlserver_error
from bridge.transports.sql.layout import CheckpointStatements, OutgoingRow, QueueStatements
from bridge.transports.sql.queue import SqlTransport

__all__ = ["SqlServerDialect", "Transport"]

_UNICODE_TYPES = {"nvarchar", "nchar", "ntext", "sysname"}


class SqlServerDialect(Dialect):
    kind = "sqlserver"

    def __init__(self, connection_name: str, config: SqlServerConnection) -> None:
        super().__init__(connection_name)
        self.config = config
        self.schema = config.schema_
        self.catalog = config.catalog
        self._recoverable: dict[str, bool] = {}

    def connect(self) -> DbConnection:
        import pyodbc

        return cast(DbConnection, pyodbc.connect(self.config.dsn, autocommit=False))

    def translate(self, exc: Exception) -> TransportError | None:
        return sqlserver_error(self.describe(), exc)

    def fetch(self, cursor: DbCursor) -> Sequence[Sequence[Any]]:
        # Skip row counts in front of the first result set of a multi-statement batch.
        while cursor.description is None:
            if not cast(Any, cursor).nextset():
                return []
        return cursor.fetchall()

    def table(self, name: str) -> str:
        if not name:
            raise ConfigError("empty SQL Server table name")
        return tsql.table_name(name, self.schema, self.catalog)

    def canonical_address(self, name: str) -> str:
        address = f"{name}@{tsql.bracket(self.schema)}"
        return f"{address}@{tsql.bracket(self.catalog)}" if self.catalog else address

    def queue_statements(self, name: str) -> QueueStatements:
        t = self.table(name)
        return QueueStatements(
            create=(tsql.create_queue(t, self.catalog),),
            send=tsql.send(t),
            receive=tsql.receive(t),
            depth=tsql.depth(t),
            oldest=tsql.oldest(t),
            expired=tsql.expired(t),
            purge_expired=tsql.purge_expired(t),
            bounds=tsql.bounds(t),
            receive_range=tsql.receive_range(t),
            count_range=tsql.count_range(t),
            scan_range=tsql.scan_range(t),
        )

    def checkpoint_statements(self) -> CheckpointStatements:
        t = self.table(tsql.CHECKPOINT_TABLE)
        return CheckpointStatements(
            table=tsql.CHECKPOINT_TABLE,
            create=(tsql.checkpoint_create(t, self.catalog),),
            upsert=tsql.checkpoint_upsert(t),
            load=tsql.checkpoint_load(t),
        )

    def table_exists(self, db: DbConnection, name: str) -> bool:
        return scalar(db, tsql.EXISTS, (self.table(name),)) is not None

    def send_statement(self, db: DbConnection, name: str) -> str:
        t = self.table(name)
        recoverable = self._recoverable.get(name)
        if recoverable is None:
            found = scalar(db, tsql.has_recoverable(self.catalog), (t,))
            recoverable = self._recoverable[name] = bool(found)
        return tsql.send(t) if recoverable else tsql.send_without_recoverable(t)

    def send_params(self, row: OutgoingRow) -> Sequence[Any]:
        ttl_ms = row.ttl_ms if row.ttl_ms is None or row.ttl_ms <= tsql.INT32_MAX else None
        return (row.id, ttl_ms, row.headers, row.body)

    def warnings(self, db: DbConnection, name: str) -> list[str]:
        t = self.table(name)
        found: list[str] = []
        if not scalar(db, tsql.index_expires_count(t, self.catalog)):
            found.append(
                f"{t} has no Index_Expires index: purging and counting expired messages scans "
                "the whole table (see the NServiceBus SQL Server transport upgrade guide)"
            )
        cursor = db.cursor()
        cursor.execute(tsql.headers_type(t, self.catalog))
        types = {str(row[0]).lower() for row in cursor.fetchall()}
        if types and not types & _UNICODE_TYPES:
            found.append(
                f"{t}.Headers is {'/'.join(sorted(types))}, not nvarchar: header values outside "
                "the database code page are mangled; change the column to nvarchar(max)"
            )
        return found


class Transport(SqlTransport):
    def __init__(self, name: str, config: SqlServerConnection) -> None:
        super().__init__(name, SqlServerDialect(name, config))
