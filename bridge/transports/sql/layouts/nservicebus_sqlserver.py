"""The NServiceBus SQL Server transport's queue table (wire-format §1), on SQL Server only.

Every statement is the transport's own text, verbatim (`bridge.transports.sql.dialects.tsql`),
with the dialect's quoted three-part names. What the layout adds to it: `Recoverable` is
written only when the table has that column (looked up once per table); `@TimeToBeReceivedMs`
is an Int32, so a remaining lifetime above ~24.8 days (`tsql.INT32_MAX` ms) is written as no
expiry at all; and `check` warns about a missing `Index_Expires` and a `varchar` Headers
column, with the transport's own queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge.errors import ConfigError
from bridge.transports.sql.dialects import tsql
from bridge.transports.sql.dialects.base import DbConnection, Dialect, scalar
from bridge.transports.sql.dialects.sqlserver import SqlServerDialect
from bridge.transports.sql.layouts.base import Layout, OutgoingRow, QueueStatements

__all__ = ["SqlServerLayout"]

_UNICODE_TYPES = {"nvarchar", "nchar", "ntext", "sysname"}


class SqlServerLayout(Layout):
    def __init__(self, dialect: Dialect) -> None:
        if not isinstance(dialect, SqlServerDialect):
            raise ConfigError(f"{dialect.describe()}: the NServiceBus SQL Server layout is T-SQL")
        super().__init__(dialect)
        self._catalog = dialect.catalog
        self._recoverable: dict[str, bool] = {}

    def queue_statements(self, name: str) -> QueueStatements:
        t = self.dialect.table(name)
        return QueueStatements(
            create=(tsql.create_queue(t, self._catalog),),
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

    def send_statement(self, db: DbConnection, name: str) -> str:
        t = self.dialect.table(name)
        recoverable = self._recoverable.get(name)
        if recoverable is None:
            found = scalar(db, tsql.has_recoverable(self._catalog), (t,))
            recoverable = self._recoverable[name] = bool(found)
        return tsql.send(t) if recoverable else tsql.send_without_recoverable(t)

    def send_params(self, row: Any) -> Sequence[Any]:
        assert isinstance(row, OutgoingRow)
        ttl_ms = row.ttl_ms if row.ttl_ms is None or row.ttl_ms <= tsql.INT32_MAX else None
        return (row.id, ttl_ms, row.headers, row.body)

    def warnings(self, db: DbConnection, name: str) -> list[str]:
        t = self.dialect.table(name)
        found: list[str] = []
        if not scalar(db, tsql.index_expires_count(t, self._catalog)):
            found.append(
                f"{t} has no Index_Expires index: purging and counting expired messages scans "
                "the whole table (see the NServiceBus SQL Server transport upgrade guide)"
            )
        cursor = db.cursor()
        cursor.execute(tsql.headers_type(t, self._catalog))
        types = {str(row[0]).lower() for row in cursor.fetchall()}
        if types and not types & _UNICODE_TYPES:
            found.append(
                f"{t}.Headers is {'/'.join(sorted(types))}, not nvarchar: header values outside "
                "the database code page are mangled; change the column to nvarchar(max)"
            )
        return found
