"""SQL queue tables: SQL Server (pyodbc), PostgreSQL (psycopg 3) and SQLite (sqlite3).

`transport` is the `Transport` of every SQL connection type; it picks its dialect (`dialects/`:
the database flavour: driver, names, error classification, SQL primitives, and `tsql`, the text
of every SQL Server statement) by the connection's `type`, and the dialect its layout
(`layouts/`: what a queue table holds, its statements, rows <-> envelopes) by the connection's
`layout` key. Neither dialects nor layouts know the transport. The transport's parts: `source`
(receive; `chain`, SQLite's savepoint chains), `sink` (send; `checkpoints`), `deadletter`
(error-queue copies), `ranges` (reads of bulk jobs), `headers` (the Headers column codec;
`headers_escapes`: what NServiceBus writes as escapes), `connection` (one database connection
on its own thread), `pool` (the database connections a transport's routes share), `errors`,
`config`.

Importing the package (or its `config`) imports no driver; the names below load their modules
on first use, and psycopg or pyodbc is imported only when a dialect connects.
"""

from typing import TYPE_CHECKING

from bridge.transports import lazy_exports

if TYPE_CHECKING:
    from bridge.transports.sql.checkpoints import CheckpointConflict, PositionMoved
    from bridge.transports.sql.layouts.base import ScannedRow
    from bridge.transports.sql.sink import SqlSink
    from bridge.transports.sql.source import SqlSource
    from bridge.transports.sql.transport import Transport

__all__ = [
    "CheckpointConflict",
    "PositionMoved",
    "ScannedRow",
    "SqlSink",
    "SqlSource",
    "Transport",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "CheckpointConflict": "checkpoints",
        "PositionMoved": "checkpoints",
        "ScannedRow": "layouts.base",
        "SqlSink": "sink",
        "SqlSource": "source",
        "Transport": "transport",
    },
)
