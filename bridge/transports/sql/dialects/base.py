"""What differs between SQL databases: driver, quoting, parameter style, error translation.

A `Dialect` is synchronous and driver-bound; `bridge.transports.sql.connection` runs it on one
dedicated thread per connection. Its queue tables follow the connection's layout
(`bridge.transports.sql.layouts`), which writes its statements from the dialect's primitives:
quoted names, the parameter placeholder, the UTC clock, expiry and the batch limit. The
dialect hands those statements out; nothing here knows about asyncio, envelopes, batches or the
transport that uses it. `bridge.transports.sql.transport` picks the dialect by connection type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from bridge.errors import BridgeError, ConfigError
from bridge.protocols import ServerConnections
from bridge.transports.sql.config import NGinnOptions
from bridge.transports.sql.errors import Failure, translate
from bridge.transports.sql.layouts.base import (
    CheckpointStatements,
    Layout,
    QueueStatements,
    load_layout,
)

if TYPE_CHECKING:
    from bridge.transports.sql.delayed import DelayedStatements

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
    #: The parameter placeholder of the driver (its DB-API paramstyle).
    placeholder: ClassVar[str]
    #: The database clock's current UTC time, in the type its layouts store `Expires` as.
    utc_now: ClassVar[str]
    #: Whether `executemany` leaves the sum of every statement's affected rows in `rowcount`
    #: (psycopg, sqlite3); a fenced checkpoint write is then one call instead of one per position.
    summed_rowcount: ClassVar[bool] = False
    #: Whether two transactions can delete rows of one table at once (not SQLite: one writer).
    concurrent_writers: ClassVar[bool] = True
    #: The suffix of each queue table's delayed table (`bridge.transports.sql.delayed`).
    delayed_suffix = "Delayed"

    def __init__(
        self, connection_name: str, layout: str, nginn: NGinnOptions | None = None
    ) -> None:
        self.connection_name = connection_name
        self.layout_name = layout
        #: The connection's `nginn` settings (for `layout: nginn`).
        self.nginn = nginn
        self.layout: Layout = load_layout(layout, self)
        self._delayed: dict[str, DelayedStatements] = {}

    # -- driver --------------------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> DbConnection:
        """Open a connection in manual-commit mode (called on the connection's own thread)."""

    @staticmethod
    @abstractmethod
    def classify(exc: BaseException) -> Failure | None:
        """Whether a driver exception is retriable or a refused value; None when `exc` is not
        the driver's (the dialect module's `classify`, see `bridge.transports.sql.errors`)."""

    def translate(self, exc: BaseException) -> BridgeError | None:
        """The bridge error for a driver exception; None when `exc` is not the driver's."""
        return translate(exc, self.describe(), self.classify)

    def receiving_session(self, db: DbConnection) -> None:  # noqa: B027 - not every database
        """Set up a source's own (unpooled) connection, right after it opened.

        A source's transactions only delete what was already sent (and insert error-queue copies
        of what is deleted, in the same transaction): a commit the database loses in a crash
        brings those rows back, so they are sent again (duplicates), and nothing is lost. Where
        the database allows it per session, such commits do not wait for the log flush (SQLite).
        """

    def receiving_transaction(self, db: DbConnection) -> None:  # noqa: B027 - not every database
        """The same for one source transaction that took rows, where the database allows it per
        transaction (PostgreSQL): pooled connections serve sources and sinks in turn, and a
        sink's commit must wait for the flush, or a crash could lose what its source let go of.
        """

    def transaction_open(self, db: DbConnection) -> bool:
        """Whether `db` is inside a transaction (a pooled connection is given back only when
        not); True where the driver cannot tell."""
        return True

    def begin(self, db: DbConnection) -> None:  # noqa: B027 - most drivers begin implicitly
        """Start a write transaction explicitly where the driver does not do it implicitly."""

    def server_connections(self, db: DbConnection) -> ServerConnections | None:
        """The server's connection limit and use; None where there is no server (SQLite)."""
        return None

    def alive(self, db: DbConnection) -> bool:
        """False once the connection is known to be broken (it is then reopened)."""
        return True

    #: Seconds a route's call may wait for the server before `interrupt` ends it; None: no
    #: deadline (the database has no network between it and the bridge, or no setting for it).
    response_timeout: float | None = None

    def interrupt(self, db: DbConnection) -> None:  # noqa: B027 - only where `response_timeout`
        """From another thread, make the call blocked on `db` fail at once (a connection
        error), and `db` broken: its server has not answered within `response_timeout`."""

    def before_check(self) -> None:  # noqa: B027 - only a database a connect can create
        """Raise what `check` should report without connecting: a connect that would create
        the database (SQLite's file) must not happen as a side effect of looking at it."""

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

    # -- primitives layouts write statements with -----------------------------------------------

    @abstractmethod
    def quote(self, identifier: str) -> str:
        """One quoted identifier; raises ConfigError for impossible ones."""

    def param_safe(self, sql: str) -> str:
        """`sql` (a quoted name) fit for a statement with parameters."""
        return sql

    @abstractmethod
    def expires_after(self, ms: str) -> str:
        """The `Expires` value `ms` milliseconds from now (NULL when `ms` is NULL)."""

    @abstractmethod
    def is_expired(self, column: str) -> str:
        """The condition that the expiry time in `column` has passed (false for NULL)."""

    def expired_flag(self, column: str) -> str:
        """1 when the expiry time in `column` has passed, else 0."""
        return f"CASE WHEN {self.is_expired(column)} THEN 1 ELSE 0 END"

    @abstractmethod
    def remaining_ms(self, column: str) -> str:
        """Milliseconds until the expiry time in `column` (NULL for NULL)."""

    @abstractmethod
    def take(self, n: str) -> str:
        """The batch-limit form after `ORDER BY`: the first `n` rows, skipping rows other
        transactions hold where the database locks rows in that clause."""

    @abstractmethod
    def byte_length(self, column: str) -> str:
        """Bytes in binary `column`."""

    def read_text(self, column: str) -> str:
        """Text `column` as the driver can always read it."""
        return column

    def read_bytes(self, column: str) -> str:
        """Binary `column` as the driver returns bytes for it."""
        return column

    def write_text(self, param: str) -> str:
        """The value of a text column from parameter `param` (str, or a poison row's bytes)."""
        return param

    def uuid_text(self, column: str) -> str:
        """Uuid `column` as text."""
        return column

    # -- statements ----------------------------------------------------------------------------

    def queue_statements(self, name: str) -> QueueStatements:
        """Every statement the transport runs against queue table `name` (its layout's)."""
        return self.layout.queue_statements(name)

    @abstractmethod
    def checkpoint_statements(self) -> CheckpointStatements:
        """Statements of the `BridgeCheckpoints` table next to the queue tables: this
        project's own table, the same under every layout."""

    @abstractmethod
    def table_exists(self, db: DbConnection, name: str) -> bool:
        """Whether table `name` (unquoted, in the configured schema) exists."""

    def send_statement(self, db: DbConnection, name: str) -> str:
        return self.layout.send_statement(db, name)

    def delayed_statements(self, name: str) -> DelayedStatements:
        """The statements of queue table `name`'s delayed messages."""
        from bridge.transports.sql.delayed import delayed_statements

        found = self._delayed.get(name)
        if found is None:
            found = self._delayed[name] = delayed_statements(self, name, self.delayed_suffix)
        return found

    #: The table a send of many rows is staged in, where the dialect has one (`stage_rows`).
    send_stage = ""

    def stage_rows(self, db: DbConnection, rows: Sequence[Sequence[Any]]) -> None:
        """Put `rows` (each `send_params`) into the send stage, in order, in the open
        transaction, creating the stage there unless the session has it; the layout's
        `send_staged` then inserts them."""
        raise NotImplementedError(f"{self.kind} has no send stage")

    def send_params(self, row: Any) -> Sequence[Any]:
        """The send statement's parameters for a row the layout's `outgoing` made."""
        return self.layout.send_params(row)

    def warnings(self, db: DbConnection, name: str) -> list[str]:
        return self.layout.warnings(db, name)

    def printable(self, statements: Sequence[str]) -> list[str]:
        """`statements` as text the database's own client runs as printed (psql, sqlite3)."""
        return [statement.rstrip().rstrip(";") + ";" for statement in statements]

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
