"""SQL Server through pyodbc: connection, names, errors (wire-format §1).

Features
    Queue tables follow the connection's layout; `nservicebus` is the NServiceBus SQL Server
    transport's own table, creation script and statements (`layouts/nservicebus_sqlserver`,
    text in `tsql`). A receive deletes `TOP(@n)` rows with `UPDLOCK, READPAST, ROWLOCK`, so
    concurrent receivers skip each other's rows, and outputs their `RowVersion`, by which the
    batch is sorted (OUTPUT order is not guaranteed). Tables with a clustered `RowVersion`
    index or a `varchar` Headers column work too; `check` warns about the latter and about a
    missing `Index_Expires`. `install --print-sql` prints each creation script as its own batch
    for sqlcmd or SSMS, with the SET options the filtered `Index_Expires` needs.

Connection
    `{type: sqlserver, dsn: "Driver={ODBC Driver 18 for SQL Server};Server=...", schema: dbo,
    catalog: nservicebus, pool_size: 10}` (FreeTDS with TDS 7.4 works too). The routes share
    a pool of connections (`bridge.transports.sql.pool`), which gives a connection back when
    its transaction has ended; ODBC does not say whether one is open, so each connection is
    wrapped to count one as open from its first cursor to its commit or rollback
    (`TrackedConnection`). A pooled connection is used by several threads one after another:
    the ODBC specification requires drivers to be thread-safe. Queue names are
    `[catalog].[schema].[table]`, `[schema].[table]` without a catalog. The canonical address
    is `table@[schema]@[catalog]` (§6) and always carries a catalog, as the transport's does
    (NServiceBus.SqlServer@214c4e8, src/NServiceBus.Transport.SqlServer/Addressing/
    CanonicalQueueAddress.cs:7-11, 29-32): without one configured, the connection's database,
    read with `SELECT DB_NAME()` when the dialect first connects.

What is lossy
    `@TimeToBeReceivedMs` is an Int32: a remaining lifetime above ~24.8 days
    (`tsql.INT32_MAX` ms) is written as no expiry at all (`Expires` NULL), so such a message
    outlives its TimeToBeReceived rather than expiring early. Expires is a `datetime`
    (1/300 s).

Errors
    SQLSTATE 08xxx (connection), HYT00/HYT01 (timeouts), 40001 and errors 1205 (deadlock),
    1222 (lock timeout), -2, 10054, 10060, 40613 are retriable; the rest are not. A refused
    login or access is `AccessRefused`, also when the driver adds an 08001 "unable to connect"
    record to it: SQLSTATE 28000, and errors 18456 (login failed), 18452 (untrusted domain),
    18486-18488 (account locked, password expired, must be changed), 4060 and 4064 (cannot
    open the database the login asks for), 916 (no access to the database), 229, 230, 262,
    297 (permission denied), 40615 and 40532 (Azure SQL's firewall and login refusals).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from bridge.errors import ConfigError, TransportError
from bridge.protocols import ServerConnections
from bridge.transports.sql.config import SqlServerConnection
from bridge.transports.sql.dialects import tsql
from bridge.transports.sql.dialects.base import (
    DbConnection,
    DbCursor,
    Dialect,
    scalar,
)
from bridge.transports.sql.errors import Failure
from bridge.transports.sql.layouts.base import CheckpointStatements

__all__ = ["SqlServerDialect", "TrackedConnection", "classify"]

# ODBC: 08xxx connection, HYT00/HYT01 timeouts, 40001 deadlock victim (1205)
RETRIABLE_STATES = {"HYT00", "HYT01", "40001"}
RETRIABLE_NUMBERS = ("(1205)", "(1222)", "(-2)", "(10054)", "(10060)", "(40613)")
#: Invalid authorization specification: what ODBC drivers report for a refused login.
REFUSED_STATES = {"28000"}
#: SQL Server error numbers of a refused login or access, as pyodbc writes them after the text:
#: `Login failed for user 'x'. (18456) (SQLDriverConnect)`.
REFUSED_NUMBERS = (
    "(18456)",
    "(18452)",
    "(18486)",
    "(18487)",
    "(18488)",
    "(4060)",
    "(4064)",
    "(916)",
    "(229)",
    "(230)",
    "(262)",
    "(297)",
    "(40615)",
    "(40532)",
)


def classify(exc: BaseException) -> Failure | None:
    """pyodbc errors by SQLSTATE and SQL Server error number (`bridge.transports.sql.errors`)."""
    import pyodbc

    if not isinstance(exc, pyodbc.Error):
        return None
    state = str(exc.args[0]) if exc.args else ""
    message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    retriable = (
        state.startswith("08")
        or state in RETRIABLE_STATES
        or any(number in message for number in RETRIABLE_NUMBERS)
    )
    refused = state in REFUSED_STATES or any(number in message for number in REFUSED_NUMBERS)
    return Failure(retriable, rejected=state.startswith("22"), refused=refused)


class TrackedConnection:
    """A DB-API connection that knows whether it may be inside a transaction.

    In manual-commit mode a statement begins a transaction and ODBC does not report one, so a
    transaction counts as open from the first cursor taken to the next commit or rollback; a
    cursor taken for a statement that began none only keeps the connection a little longer.
    Everything else is the wrapped connection's.
    """

    __slots__ = ("_db", "in_transaction")

    def __init__(self, db: DbConnection) -> None:
        self._db = db
        self.in_transaction = False

    def cursor(self) -> DbCursor:
        self.in_transaction = True
        return self._db.cursor()

    def commit(self) -> None:
        self._db.commit()
        self.in_transaction = False

    def rollback(self) -> None:
        self._db.rollback()
        self.in_transaction = False

    def close(self) -> None:
        self._db.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class SqlServerDialect(Dialect):
    kind = "sqlserver"
    placeholder = "?"
    utc_now = "GETUTCDATE()"

    def __init__(self, connection_name: str, config: SqlServerConnection) -> None:
        self.config = config
        self.schema = config.schema_
        self.catalog = config.catalog
        #: The catalog of canonical addresses: the configured one, else the connection's
        #: database once the dialect has connected.
        self.database = config.catalog
        super().__init__(connection_name, config.layout, config.nginn)
        self.delayed_suffix = config.delayed_suffix

    def connect(self) -> DbConnection:
        import pyodbc

        db = cast(DbConnection, pyodbc.connect(self.config.dsn, autocommit=False))
        if self.database is None:
            try:
                self.database = self._database_name(db)
                db.rollback()
            except BaseException:
                db.close()
                raise
        tracked = TrackedConnection(db)
        self.layout.on_connect(tracked)
        return tracked

    def transaction_open(self, db: DbConnection) -> bool:
        return not isinstance(db, TrackedConnection) or db.in_transaction

    def server_connections(self, db: DbConnection) -> ServerConnections:
        # Other sessions are listed in sys.dm_exec_sessions, which needs VIEW SERVER STATE.
        return ServerConnections(int(scalar(db, tsql.MAX_CONNECTIONS)))

    def _database_name(self, db: DbConnection) -> str:
        name = scalar(db, tsql.DATABASE_NAME)
        if not isinstance(name, str) or not name:
            raise TransportError(f"{self.describe()}: DB_NAME() returned {name!r}, no database")
        return name

    classify = staticmethod(classify)

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
        if self.database is None:
            raise TransportError(
                f"{self.describe()}: the address of {name!r} carries the connection's database, "
                "which is read when it first connects; no connection was opened yet"
            )
        return f"{name}@{tsql.bracket(self.schema)}@{tsql.bracket(self.database)}"

    def quote(self, identifier: str) -> str:
        return tsql.bracket(identifier)

    def expires_after(self, ms: str) -> str:
        return f"DATEADD(ms, {ms}, {self.utc_now})"

    def is_expired(self, column: str) -> str:
        return f"{column} <= {self.utc_now}"

    def remaining_ms(self, column: str) -> str:
        return tsql.remaining_ms(column)

    def take(self, n: str) -> str:
        # T-SQL skips locked rows with table hints (READPAST), never in this clause.
        return f"OFFSET 0 ROWS FETCH NEXT {n} ROWS ONLY"

    def byte_length(self, column: str) -> str:
        return f"DATALENGTH({column})"

    def checkpoint_statements(self) -> CheckpointStatements:
        t = self.table(tsql.CHECKPOINT_TABLE)
        return CheckpointStatements(
            table=tsql.CHECKPOINT_TABLE,
            create=(tsql.checkpoint_create(t, self.catalog),),
            upsert=tsql.checkpoint_upsert(t),
            load=tsql.checkpoint_load(t),
            insert_new=tsql.checkpoint_insert_new(t),
            advance=tsql.checkpoint_advance(t),
        )

    def table_exists(self, db: DbConnection, name: str) -> bool:
        return scalar(db, tsql.EXISTS, (self.table(name),)) is not None

    def printable(self, statements: Sequence[str]) -> list[str]:
        return [tsql.standalone_batch(statement) for statement in statements]
