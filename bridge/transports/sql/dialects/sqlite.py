"""SQLite queue tables (wire-format §3): the embedded default, through the stdlib `sqlite3`.

Features
    Queue tables follow the connection's layout; `nservicebus` is the NServiceBus PostgreSQL
    layout (`bridge.transports.sql.layouts.nservicebus_postgresql`) in one file: `id TEXT` (uuid),
    `expires TEXT` (UTC ISO 8601, `2026-04-29T21:56:55.590Z`, NULL = never), `headers TEXT`,
    `body BLOB`, `seq INTEGER PRIMARY KEY AUTOINCREMENT` (FIFO). Expiry is computed by
    SQLite's clock (`julianday('now')`); a time to live that would end after the year 9999 makes
    SQLite's date functions return NULL: never expires, as NServiceBus treats
    `TimeSpan.MaxValue`. A receive is `BEGIN IMMEDIATE` + `DELETE ...
    RETURNING`, sorted by `seq` (RETURNING order is unspecified). The file is switched to WAL
    so readers (peek) never wait for the writer. Headers and body are read as BLOBs, so a
    foreign row whose Headers TEXT is not UTF-8 becomes a poison message, moved to the error
    queue with the same bytes. Every connection sets `secure_delete=FAST` (below); a source's
    also `synchronous=NORMAL` (see `SqliteDialect.receiving_session`).

Connection
    `{type: sqlite, path: ./bridge.db, busy_timeout: 30}`; the file is created when missing
    (by `install`, and by any other command that writes), but `check` (`bridge check
    --connect`, a route's readiness probe) reports a missing file instead of creating an
    empty one. The canonical address is the PostgreSQL form with SQLite's schema:
    `"main"."Sales"`.

Limits
    SQLite has one writer at a time: a received batch holds the write lock until it is settled,
    so other receivers and senders on the same file wait (up to `busy_timeout`). A route whose
    source and destination are tables of the same file writes inside the receive transaction
    (`SqlSource.sink_in_transaction`), so it never waits on its own lock.

Errors
    Busy/locked, I/O, disk-full and cannot-open are retriable; the rest are not. A file that
    cannot be opened is named, with why where it can be told (`cannot_open`): a missing
    directory, a directory in its place or a read-only file are `TransportError`, missing
    permissions `AccessRefused` (none of them goes away by retrying); otherwise it stays
    retriable.
"""

from __future__ import annotations

import os
import sqlite3
from typing import cast

from bridge.errors import AccessRefused, BridgeError, TransportError, TransportUnavailable
from bridge.transports.sql.config import SqliteConnection
from bridge.transports.sql.dialects.base import DbConnection, Dialect, double_quote, scalar
from bridge.transports.sql.errors import Failure
from bridge.transports.sql.layouts.base import CheckpointStatements

__all__ = ["SqliteDialect", "cannot_open", "classify", "set_up"]

# SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_PROTOCOL
RETRIABLE_CODES = {5, 6, 10, 13, 14, 15}
# SQLITE_TOOBIG, SQLITE_MISMATCH, SQLITE_CONSTRAINT_DATATYPE (a STRICT table's column type)
REJECTED_CODES = {18, 20, 3091}


#: The page cache of a source's connection, in KiB (SQLite's default is 2,000).
RECEIVING_CACHE_KIB = 65_536


def classify(exc: BaseException) -> Failure | None:
    """`sqlite3` errors by their extended result code (see `bridge.transports.sql.errors`)."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    retriable = code is not None and code & 0xFF in RETRIABLE_CODES
    rejected = isinstance(exc, sqlite3.DataError) or code in REJECTED_CODES
    return Failure(retriable, rejected)


#: Paths that are no file: an in-memory database, a temporary one.
_NO_FILE = ("", ":memory:")
SQLITE_CANTOPEN, SQLITE_READONLY = 14, 8


def cannot_open(where: str, path: str, exc: sqlite3.Error) -> BridgeError:
    """The error for a database file SQLite could not open (or write: WAL mode creates
    `<file>-wal` and `<file>-shm` next to it), naming the file and, where the file system
    tells, why."""
    file = os.path.abspath(path)
    folder = os.path.dirname(file)
    uid = os.geteuid()
    text = f"{where}: cannot open database file {file!r}"
    if not os.path.isdir(folder):
        return TransportError(f"{text}: directory {folder!r} does not exist")
    if os.path.isdir(file):
        return TransportError(f"{text}: it is a directory")
    if os.path.exists(file) and not os.access(file, os.R_OK | os.W_OK):
        return AccessRefused(f"{text}: permission denied: user {uid} cannot read and write it")
    if not os.access(folder, os.W_OK | os.X_OK):
        return AccessRefused(
            f"{text}: permission denied: user {uid} cannot create files in {folder!r} (SQLite "
            "creates the database there, and its -wal and -shm files next to it)"
        )
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code == SQLITE_READONLY:
        return TransportError(f"{text}: {exc} (a read-only file or file system)")
    return TransportUnavailable(f"{where} unavailable: {exc}: {file!r}")


def set_up(db: sqlite3.Connection) -> None:
    """What every connection to a queue file sets, right after it opened."""
    db.execute("PRAGMA journal_mode=WAL")
    # Debian's and others' builds turn secure_delete on, which rewrites every page a delete
    # frees with zeros: a received batch then writes its rows a second time (1.5-2x the cost
    # of a receive). FAST zeroes deleted content only on the pages a write touches anyway, so
    # no I/O is added (upstream's default is off).
    db.execute("PRAGMA secure_delete=FAST")


class SqliteDialect(Dialect):
    kind = "sqlite"
    placeholder = "?"
    utc_now = "julianday('now')"
    summed_rowcount = True
    concurrent_writers = False

    def __init__(self, connection_name: str, config: SqliteConnection) -> None:
        self.config = config
        super().__init__(connection_name, config.layout, config.nginn)
        self.delayed_suffix = config.delayed_suffix

    def connect(self) -> DbConnection:
        try:
            # isolation_level=None: no implicit BEGIN; `begin` takes the write lock up front.
            db = sqlite3.connect(
                self.config.path, timeout=self.config.busy_timeout, isolation_level=None
            )
        except sqlite3.OperationalError as exc:
            raise cannot_open(self.describe(), self.config.path, exc) from exc
        try:
            set_up(db)
            self.layout.on_connect(cast(DbConnection, db))
        except sqlite3.OperationalError as exc:
            db.close()
            code = (exc.sqlite_errorcode or 0) & 0xFF
            if code in (SQLITE_CANTOPEN, SQLITE_READONLY):
                raise cannot_open(self.describe(), self.config.path, exc) from exc
            raise
        except BaseException:
            db.close()
            raise
        return cast(DbConnection, db)

    def before_check(self) -> None:
        path = self.config.path
        if path not in _NO_FILE and not os.path.exists(path):
            raise TransportError(
                f"{self.describe()}: database file {os.path.abspath(path)!r} does not exist "
                "(`bridge install` creates it)"
            )

    classify = staticmethod(classify)

    def receiving_session(self, db: DbConnection) -> None:
        # In WAL mode, NORMAL syncs at checkpoints rather than at each commit: a power loss can
        # roll the last receives back (never corrupts), which only brings their rows back.
        db.cursor().execute("PRAGMA synchronous=NORMAL")
        # A receive deletes each row's entry from the unique index on `id` too, at a random
        # place in it: with SQLite's default 2 MB page cache those index pages are read again
        # from the OS for most batches. 64 MiB (allocated as pages are read) holds them for a
        # backlog of about a million rows, which the receive statement then finds in memory.
        db.cursor().execute(f"PRAGMA cache_size=-{RECEIVING_CACHE_KIB}")

    def begin(self, db: DbConnection) -> None:
        db.cursor().execute("BEGIN IMMEDIATE")

    def table(self, name: str) -> str:
        return double_quote(name)

    def canonical_address(self, name: str) -> str:
        return f'"main".{double_quote(name)}'

    def quote(self, identifier: str) -> str:
        return double_quote(identifier)

    def expires_after(self, ms: str) -> str:
        # Expires is ISO 8601 text; a NULL ms makes the modifier NULL and so the whole value.
        return f"strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ({ms} / 1000.0) || ' seconds')"

    def is_expired(self, column: str) -> str:
        return f"{column} IS NOT NULL AND julianday({column}) <= {self.utc_now}"

    def remaining_ms(self, column: str) -> str:
        return f"CAST(round((julianday({column}) - {self.utc_now}) * 86400000.0) AS INTEGER)"

    def take(self, n: str) -> str:
        return f"LIMIT {n}"  # one writer at a time: no rows held by others to skip

    def byte_length(self, column: str) -> str:
        # length() of a BLOB counts bytes; the cast covers bodies stored as TEXT by others
        return f"length(CAST({column} AS BLOB))"

    # sqlite3 fails a whole statement on TEXT that is not UTF-8, which would block the queue:
    # read as bytes, such a row becomes a poison message instead.
    def read_text(self, column: str) -> str:
        return f"CAST({column} AS BLOB)"

    def read_bytes(self, column: str) -> str:
        return f"CAST({column} AS BLOB)"

    def write_text(self, param: str) -> str:
        # A poison row's undecodable Headers bytes are stored as TEXT, as the source held them.
        return f"CAST({param} AS TEXT)"

    def checkpoint_statements(self) -> CheckpointStatements:
        t = double_quote("BridgeCheckpoints")
        return CheckpointStatements(
            table="BridgeCheckpoints",
            create=(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "  name TEXT NOT NULL PRIMARY KEY,\n"
                "  position INTEGER NOT NULL\n"
                ")",
            ),
            upsert=(
                f"INSERT INTO {t} (name, position) VALUES (?, ?)\n"
                "ON CONFLICT (name) DO UPDATE SET position = excluded.position"
            ),
            load=f"SELECT name, position FROM {t}",
            insert_new=(
                f"INSERT INTO {t} (name, position) VALUES (?, ?)\nON CONFLICT (name) DO NOTHING"
            ),
            advance=f"UPDATE {t} SET position = ? WHERE name = ? AND position = ?",
        )

    def table_exists(self, db: DbConnection, name: str) -> bool:
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return scalar(db, query, (name,)) is not None
