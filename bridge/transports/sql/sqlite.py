"""SQLite queue tables (wire-format §3): the embedded default, through the stdlib `sqlite3`.

Features
    The NServiceBus PostgreSQL layout in one file: `id TEXT` (uuid), `expires TEXT` (UTC ISO
    8601, `2026-04-29T21:56:55.590Z`, NULL = never), `headers TEXT`, `body BLOB`,
    `seq INTEGER PRIMARY KEY AUTOINCREMENT` (FIFO). Expiry is computed by SQLite's clock
    (`julianday('now')`). A receive is `BEGIN IMMEDIATE` + `DELETE ... RETURNING`, sorted by
    `seq` (RETURNING order is unspecified). The file is switched to WAL so readers (peek) never
    wait for the writer.

Connection
    `{type: sqlite, path: ./bridge.db, busy_timeout: 30}`; the file is created when missing.
    The canonical address is the PostgreSQL form with SQLite's schema: `"main"."Sales"`.

Limits
    SQLite has one writer at a time: a received batch holds the write lock until it is settled,
    so other receivers and senders on the same file wait (up to `busy_timeout`). A route whose
    source and destination are tables of the same file writes inside the receive transaction
    (`SqlSource.sink_in_transaction`), so it never waits on its own lock.

Errors
    Busy/locked, I/O, disk-full and cannot-open are retriable; the rest are not.
"""

from __future__ import annotations

import sqlite3
from typing import cast

from bridge.config.models import SqliteConnection
from bridge.errors import TransportError
from bridge.transports.sql.dialect import DbConnection, Dialect, double_quote, scalar
from bridge.transports.sql.errors import sqlite_error
from bridge.transports.sql.layout import CheckpointStatements, QueueStatements
from bridge.transports.sql.queue import SqlTransport

__all__ = ["SqliteDialect", "Transport"]

_NOW = "julianday('now')"
_EXPIRED = f"expires IS NOT NULL AND julianday(expires) <= {_NOW}"
_RETURNING = (
    f"RETURNING id, CASE WHEN {_EXPIRED} THEN 1 ELSE 0 END, headers, body,\n"
    f"  CAST(round((julianday(expires) - {_NOW}) * 86400000.0) AS INTEGER), seq"
)


class SqliteDialect(Dialect):
    kind = "sqlite"

    def __init__(self, connection_name: str, config: SqliteConnection) -> None:
        super().__init__(connection_name)
        self.config = config

    def connect(self) -> DbConnection:
        # isolation_level=None: no implicit BEGIN; `begin` takes the write lock up front.
        db = sqlite3.connect(
            self.config.path, timeout=self.config.busy_timeout, isolation_level=None
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
        except BaseException:
            db.close()
            raise
        return cast(DbConnection, db)

    def translate(self, exc: Exception) -> TransportError | None:
        return sqlite_error(self.describe(), exc)

    def begin(self, db: DbConnection) -> None:
        db.cursor().execute("BEGIN IMMEDIATE")

    def table(self, name: str) -> str:
        return double_quote(name)

    def canonical_address(self, name: str) -> str:
        return f'"main".{double_quote(name)}'

    def queue_statements(self, name: str) -> QueueStatements:
        t = double_quote(name)
        return QueueStatements(
            create=(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "  id TEXT NOT NULL UNIQUE,\n"
                "  expires TEXT,\n"
                "  headers TEXT NOT NULL,\n"
                "  body BLOB,\n"
                "  seq INTEGER PRIMARY KEY AUTOINCREMENT\n"
                ")",
            ),
            # A NULL ttl makes the modifier NULL and so the whole strftime(): no expiry.
            send=(
                f"INSERT INTO {t} (id, expires, headers, body) VALUES "
                "(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', (? / 1000.0) || ' seconds'), ?, ?)"
            ),
            receive=(
                f"DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} ORDER BY seq LIMIT ?)\n"
                f"{_RETURNING}"
            ),
            depth=f"SELECT count(*) FROM {t}",
            oldest=f"SELECT headers FROM {t} ORDER BY seq LIMIT 1",
            expired=f"SELECT count(*) FROM {t} WHERE {_EXPIRED}",
            purge_expired=(
                f"DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE {_EXPIRED} LIMIT ?)"
            ),
            bounds=f"SELECT min(seq), max(seq) FROM {t}",
            receive_range=(
                f"DELETE FROM {t} WHERE seq IN "
                f"(SELECT seq FROM {t} WHERE seq BETWEEN ? AND ? ORDER BY seq LIMIT ?)\n"
                f"{_RETURNING}"
            ),
            count_range=f"SELECT count(*) FROM {t} WHERE seq BETWEEN ? AND ?",
            # length() of a BLOB counts bytes; the cast covers bodies stored as TEXT by others
            scan_range=(
                f"SELECT id, CASE WHEN {_EXPIRED} THEN 1 ELSE 0 END, headers, "
                f"length(CAST(body AS BLOB)), seq FROM {t}\n"
                "WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?"
            ),
        )

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
        )

    def table_exists(self, db: DbConnection, name: str) -> bool:
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return scalar(db, query, (name,)) is not None


class Transport(SqlTransport):
    def __init__(self, name: str, config: SqliteConnection) -> None:
        super().__init__(name, SqliteDialect(name, config))
