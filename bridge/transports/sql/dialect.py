"""What differs between SQL databases: driver, quoting, parameter style, error translation.

A `Dialect` is synchronous and driver-bound; `bridge.transports.sql.queue` runs it on one
dedicated thread per connection. It renders the statement sets of the table layout
(`bridge.transports.sql.layout`) in its own SQL: quoted names, its parameter placeholder, its
clock expressions. Nothing here knows about asyncio, envelopes or batches.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Protocol

from bridge.errors import ConfigError, TransportError
from bridge.transports.sql.layout import CheckpointStatements, OutgoingRow, QueueStatements

__all__ = ["DbConnection", "DbCursor", "Dialect", "double_quote", "scalar"]


class DbCursor(Protocol):
    """The DB-API 2 cursor subset the transports use (sqlite3, psycopg, pyodbc)."""

    @property
    def description(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> object: ...

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> object: ...

    def fetchall(self) -> Sequence[Sequence[Any]]: ...

    def fetchone(self) -> Sequence[Any] | None: ...

    def close(self) -> None: ...


class DbConnection(Protocol):
    """The DB-API 2 connection subset the transports use, never in autocommit mode."""

    def cursor(self) -> DbCursor: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


class Dialect(ABC):
    """One database flavour, bound to one connection's settings (`connection_name` for messages)."""

    kind: ClassVar[str]

    def __init__(self, connection_name: str) -> None:
        self.connection_name = connection_name

    # -- driver --------------------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> DbConnection:
        """Open a connection in manual-commit mode (called on the connection's own thread)."""

    @abstractmethod
    def translate(self, exc: Exception) -> TransportError | None:
        """The bridge error for a driver exception; None when `exc` is not the driver's."""

    def begin(self, db: DbConnection) -> None:  # noqa: B027 - most drivers begin implicitly
        """Start a write transaction explicitly where the driver does not do it implicitly."""

    def alive(self, db: DbConnection) -> bool:
        """False once the connection is known to be broken (it is then reopened)."""
        return True

    def fetch(self, cursor: DbCursor) -> Sequence[Sequence[Any]]:
        """All rows of the statement just executed."""
        return cursor.fetchall()

    # -- names ---------------------------------------------------------------------------------

    @abstractmethod
    def table(self, name: str) -> str:
        """The fully qualified, quoted table name; raises ConfigError for impossible names."""

    @abstractmethod
    def canonical_address(self, name: str) -> str:
        """The queue's address as NServiceBus writes it in headers (wire-format §6)."""

    # -- statements ----------------------------------------------------------------------------

    @abstractmethod
    def queue_statements(self, name: str) -> QueueStatements:
        """Every statement the transport runs against queue table `name`."""

    @abstractmethod
    def checkpoint_statements(self) -> CheckpointStatements:
        """Statements of the `BridgeCheckpoints` table next to the queue tables."""

    @abstractmethod
    def table_exists(self, db: DbConnection, name: str) -> bool:
        """Whether table `name` (unquoted, in the configured schema) exists."""

    def send_statement(self, db: DbConnection, name: str) -> str:
        """The insert for table `name`; a dialect may look at the table first (and cache)."""
        return self.queue_statements(name).send

    def send_params(self, row: OutgoingRow) -> Sequence[Any]:
        """Parameters of `send`: (id, ttl_ms, headers, body), which is the row itself."""
        return row

    def warnings(self, db: DbConnection, name: str) -> list[str]:
        """Human-readable problems of an existing table that still works."""
        return []

    def describe(self) -> str:
        return f"{self.kind} connection {self.connection_name!r}"


def double_quote(identifier: str) -> str:
    """A standard SQL quoted identifier, `"name"` with `"` doubled (PostgreSQL, SQLite)."""
    if not identifier or "\x00" in identifier:
        raise ConfigError(f"invalid SQL identifier {identifier!r}")
    return '"' + identifier.replace('"', '""') + '"'


def scalar(db: DbConnection, statement: str, params: Sequence[Any] = ()) -> Any:
    """The first column of the first row of `statement`, or None when it returns no row."""
    cursor = db.cursor()
    if params:
        cursor.execute(statement, params)
    else:
        cursor.execute(statement)
    row = cursor.fetchone()
    return None if row is None else row[0]
