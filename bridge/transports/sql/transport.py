"""SQL queue tables: the `Transport` of one `sqlite`, `postgresql` or `sqlserver` connection.

Features
    NServiceBus SQL transport queue tables, read and written as its endpoints do. A receive
    deletes a batch of the oldest rows in a transaction held until the batch is settled
    (`source`); a send inserts its rows in one transaction, with the source positions when it
    carries a checkpoint (`sink`, `checkpoints`: Kafka -> SQL exactly-once); poison and
    rejected messages are copied to the error queue in the receive's transaction
    (`deadletter`). A route between two tables of one database moves each batch in one
    transaction (`SqlSource.sink_in_transaction`). PostgreSQL and SQL Server receive ahead on a
    second connection, SQLite in the transaction it holds (`chain`).

Connection
    The connection's `type` picks the dialect (`dialects/`: driver, names, errors, SQL
    primitives), imported when the transport is built; the driver (psycopg, pyodbc; sqlite3 is
    the standard library's) is imported when a dialect first connects. Every source, sink and
    the transport itself drive their database work from a thread of their own (`connection`).
    On PostgreSQL and SQL Server the sources and sinks of every route of the process lease
    their database connections from the transport's one pool of at most `pool_size`, each for
    a transaction (`pool`); the transport's own work (`check`, `peek`, `install`, the range
    reads) has one connection of its own besides, so a busy pool never holds up a readiness
    probe. SQLite's are not pooled: each source and sink keeps its own (a source receiving
    ahead: two), and a file has no connection limit.

Options
    `layout` (default `nservicebus`) picks what a queue table holds and the statements run on
    it (`layouts/`): `nginn` is NGinn.MessageBus's table, with its `nginn` settings
    (`layouts/nginn`); each dialect documents its own keys (`path`, `dsn`, `schema`,
    `catalog`).

Addresses
    A queue is a table name. The canonical address is the one NServiceBus writes in headers:
    `"public"."Sales"` (PostgreSQL), `"main"."Sales"` (SQLite), `Sales@[dbo]@[catalog]`
    (SQL Server).

Administration
    `install` creates the queue tables and `BridgeCheckpoints` (idempotent; `print_only`
    returns the DDL as the database's own client runs it), with each table's delayed table
    (`delayed`), `check` reports missing tables and warnings, `peek` the depth, the oldest
    message's age, the expired rows, and the delayed messages waiting with the next due
    time. Bulk jobs read sequence ranges through `bounds`, `count_range`, `scan_range` and
    `purge_expired` (`ranges`).

Limits
    SQLite has one writer at a time; PostgreSQL table names are at most 55 bytes, SQL Server's
    128 characters (`config`). Each poll is a write transaction (see `source`, "Polling").
    `connections_needed` and `connections_allowed` compare what the routes of one process could
    hold with what the server has left (`bridge check --connect` warns).

Errors (which are retriable)
    `errors`: unreachable server, broken connection, timeouts, deadlocks, serialization
    failures, a busy SQLite file are `TransportUnavailable`; a value the table refuses for good
    is `MessageRejected`; a refused login or access is `AccessRefused`; the rest is
    `TransportError`. A fenced checkpoint another writer moved
    is `CheckpointConflict` (`PositionMoved`, retriable, for a Kafka source's batch).

What is lossy
    Nothing in the message: headers keep their order; a repeated header name collapses to its
    last value when the headers are written afresh (the Headers column is a JSON object); a
    row forwarded to another queue table with its headers unchanged keeps its Headers text. A
    time to live beyond what the column holds is written as never expiring (SQL Server: above
    ~24.8 days; PostgreSQL and SQLite: past the year 9999), and SQL Server keeps `Expires` to
    1/300 s.
"""

from __future__ import annotations

import asyncio
import importlib
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

from bridge.errors import TransportError
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE
from bridge.protocols import CheckpointStore, QueueStats, ServerConnections
from bridge.transports.sql.config import SqlConnection, SqliteConnection
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.delay_table import TABLE as DELAY_TABLE
from bridge.transports.sql.delay_table import DelayTable
from bridge.transports.sql.delayed import MISSING_DELAYED_TABLE, seconds_to_next_due
from bridge.transports.sql.dialects.base import DbConnection, Dialect, scalar
from bridge.transports.sql.pool import Pool
from bridge.transports.sql.ranges import RangeReads
from bridge.transports.sql.sink import SqlSink
from bridge.transports.sql.source import SqlSource

__all__ = ["DIALECTS", "Transport"]

#: Connection `type` -> "module:class" of its dialect; imported when a transport is built.
DIALECTS = {
    "sqlite": "bridge.transports.sql.dialects.sqlite:SqliteDialect",
    "postgresql": "bridge.transports.sql.dialects.postgresql:PostgresDialect",
    "sqlserver": "bridge.transports.sql.dialects.sqlserver:SqlServerDialect",
}

T = TypeVar("T")


def dialect_for(name: str, config: SqlConnection) -> Dialect:
    """The dialect of connection `name`, by its `type`."""
    module, _, cls = DIALECTS[config.type].partition(":")
    dialect: Dialect = getattr(importlib.import_module(module), cls)(name, config)
    return dialect


class Transport(RangeReads):
    """The `Transport` of one SQL connection; see the module docstring."""

    def __init__(self, name: str, config: SqlConnection) -> None:
        self.name = name
        self.config = config
        self.dialect = dialect_for(name, config)
        self.pool = (  # SQLite: none (see `pool`)
            None
            if isinstance(config, SqliteConnection)
            else Pool(
                self.dialect.connect, config.pool_size, config.pool_timeout, self.dialect.describe()
            )
        )
        self._admin: Connection | None = None
        self._opened: weakref.WeakSet[SqlSource | SqlSink] = weakref.WeakSet()

    @property
    def kind(self) -> str:
        """The database: `sqlite`, `postgresql` or `sqlserver` (the connection's `type`)."""
        return self.dialect.kind

    @property
    def layout_name(self) -> str:
        """The queue-table layout: the connection's `layout` (`nservicebus`)."""
        return self.config.layout

    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        seq_range: tuple[int, int] | None = None,
    ) -> SqlSource:
        """`group` and `checkpoint_store` mean nothing to a queue table and are ignored;
        `seq_range` restricts the source to a range of the table (`source`, "Sequence
        ranges")."""
        source = SqlSource(self.dialect, address, error_queue, seq_range=seq_range, pool=self.pool)
        self._opened.add(source)
        return source

    def sink(self, address: str, *, key: str | None = None) -> SqlSink:
        """`key` (a Kafka record key) means nothing to a queue table and is ignored."""
        sink = SqlSink(self.dialect, address, pool=self.pool)
        self._opened.add(sink)
        return sink

    def install_statements(self, addresses: Sequence[str]) -> list[str]:
        """The DDL `install` runs: each queue table and its delayed table (`delayed`: none
        for NGinn, whose delayed rows are `R` rows), then the checkpoint table."""
        statements = [
            statement
            for address in dict.fromkeys(addresses)
            for statement in (
                *self.dialect.queue_statements(address).create,
                *self.dialect.delayed_statements(address).create,
            )
        ]
        return statements + list(self.dialect.checkpoint_statements().create)

    async def install(self, addresses: Sequence[str], *, print_only: bool = False) -> list[str]:
        """Create the queue tables (idempotent) and return the DDL run; with `print_only` run
        nothing and return that DDL as the database's own client would run it, as printed."""
        statements = self.install_statements(addresses)
        if print_only:
            return self.dialect.printable(statements)
        await self._run(partial(_execute_each, statements))
        return statements

    async def install_delay_table(
        self, error_queue: str = DEFAULT_ERROR_QUEUE, *, print_only: bool = False
    ) -> list[str]:
        """Create `BridgeDelays` (`delay_table`: this is the `delays:` connection) and the
        queue table of its rows that can never be sent, as `install` creates queue tables."""
        statements = [*DelayTable(self.dialect).create, *self.install_statements([error_queue])]
        if print_only:
            return self.dialect.printable(statements)
        await self._run(partial(_execute_each, statements))
        return statements

    async def check_delay_table(self, error_queue: str = DEFAULT_ERROR_QUEUE) -> None:
        """Raise when `BridgeDelays` or its error queue does not exist (this is the `delays:`
        connection)."""
        self.dialect.before_check()
        await self._run(partial(self._check_delay_table, error_queue))

    def _check_delay_table(self, error_queue: str, db: DbConnection) -> None:
        tables = (
            (DELAY_TABLE, "where delays wait for destinations that cannot delay"),
            (error_queue, "where delayed messages that can never be sent go"),
        )
        try:
            for table, what in tables:
                if not self.dialect.table_exists(db, table):
                    raise TransportError(
                        f"{self.dialect.describe()}: table {self.dialect.table(table)}, {what}, "
                        "does not exist (run `bridge install`)"
                    )
        finally:
            db.rollback()

    async def check(self, addresses: Sequence[str]) -> list[str]:
        """Reach the database (never creating it); raise when a table is missing; return
        warnings."""
        self.dialect.before_check()
        return await self._run(partial(self._check, list(dict.fromkeys(addresses))))

    async def check_delayed(self, addresses: Sequence[str]) -> list[str]:
        """Warnings for the queue tables in `addresses` (destinations that may be sent delayed
        messages) whose delayed table does not exist; NGinn layout: none is needed."""
        return await self._run(partial(self._check_delayed, list(dict.fromkeys(addresses))))

    def _check_delayed(self, addresses: list[str], db: DbConnection) -> list[str]:
        try:
            tables = [self.dialect.delayed_statements(a).table for a in addresses]
            missing = [t for t in tables if t and not self.dialect.table_exists(db, t)]
        finally:
            db.rollback()
        if not missing:
            return []
        names = ", ".join(self.dialect.table(t) for t in missing)
        return [
            f"delayed table {names}, where delayed messages to its queue would wait (its routes "
            f"come from Kafka, whose records may ask for a delay), does not exist: such a "
            f"message goes to the error queue. {MISSING_DELAYED_TABLE}"
        ]

    async def peek(self, address: str) -> QueueStats:
        return await self._run(partial(self._peek, address))

    def canonical_address(self, address: str) -> str:
        return self.dialect.canonical_address(address)

    def connections_needed(self, receiving: int, sending: int, moving: int) -> int:
        """The most database connections one process could hold on this connection for route
        loops that receive here and send elsewhere (`receiving`), send here (`sending`), and
        move between two tables here (`moving`), with the administration connection: a loop
        receiving ahead holds two, one moving in its source's transaction one, a sink one;
        the pool caps their sum."""
        ahead = 2 if self.dialect.concurrent_writers else 1
        loops = receiving * ahead + sending + moving
        return min(loops, self.pool.size if self.pool is not None else loops) + 1

    async def connections_allowed(self) -> ServerConnections | None:
        """How many connections the server has left for this one, by its own counts (None:
        no server, SQLite)."""
        return await self._run(self._server_connections)

    def _server_connections(self, db: DbConnection) -> ServerConnections | None:
        try:
            return self.dialect.server_connections(db)
        finally:
            db.rollback()

    async def close(self) -> None:
        """Close every source and sink (giving back what they hold), the pool, and the
        administration connection; the pool first, so that no lease waits out its timeout."""
        if self.pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.pool.close)
        for opened in list(self._opened):
            await opened.close()
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    async def _run(self, work: Callable[[DbConnection], T]) -> T:
        if self._admin is None:
            self._admin = Connection(self.dialect)
        return await self._admin.run(work)

    def _check(self, addresses: list[str], db: DbConnection) -> list[str]:
        try:
            missing = [a for a in addresses if not self.dialect.table_exists(db, a)]
            if missing:
                names = ", ".join(self.dialect.table(a) for a in missing)
                raise TransportError(
                    f"{self.dialect.describe()}: queue table {names} does not exist "
                    "(run `bridge install`)"
                )
            return [warning for a in addresses for warning in self.dialect.warnings(db, a)]
        finally:
            db.rollback()

    def _peek(self, address: str, db: DbConnection) -> QueueStats:
        statements = self.dialect.queue_statements(address)
        layout = self.dialect.layout
        params = layout.receive_params(address)
        try:
            depth = int(scalar(db, statements.depth, params) or 0)
            oldest = scalar(db, statements.oldest, params)
            expired = int(scalar(db, statements.expired, params) or 0)
            elsewhere = layout.elsewhere(db, address)
            delayed, next_due = self._delayed(address, db)
        finally:
            db.rollback()
        age = layout.oldest_age(oldest, time.time())
        return QueueStats(
            depth=depth,
            oldest_age_seconds=age,
            expired=expired,
            elsewhere=elsewhere,
            delayed=delayed,
            next_due_seconds=next_due,
        )

    def _delayed(self, address: str, db: DbConnection) -> tuple[int | None, float | None]:
        """Delayed messages waiting for `address` and seconds until the next is due; (None,
        None) when its delayed table does not exist."""
        statements = self.dialect.delayed_statements(address)
        if statements.table and not self.dialect.table_exists(db, statements.table):
            return None, None
        waiting = int(scalar(db, statements.waiting) or 0)
        return waiting, seconds_to_next_due(statements, db) if waiting else None


def _execute_each(statements: Sequence[str], db: DbConnection) -> None:
    cursor = db.cursor()
    for statement in statements:
        cursor.execute(statement)
        db.commit()
