"""The NServiceBus PostgreSQL transport's queue table (wire-format §2), on PostgreSQL and SQLite.

SQLite has no NServiceBus transport of its own: its queue files hold this layout's columns, so
this module is the `nservicebus` layout of both databases (`LAYOUTS` in `base`).

Columns `id, expires, headers, body, seq`: `seq` is the FIFO order and `expires` the UTC expiry
by the database clock. PostgreSQL gets the transport's own `CREATE TABLE` plus a partial index
on `expires`; SQLite (§3) the same columns in its own types (`expires` as ISO 8601 text,
`seq` its rowid). Every other statement is written once, here, from the dialect's primitives.
A receive deletes the oldest rows and returns them with `seq`, since RETURNING keeps no order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.transports.sql.dialects.base import Dialect
from bridge.transports.sql.dialects.postgresql import LAST_EXPIRES
from bridge.transports.sql.layouts.base import Layout, OutgoingRow, QueueStatements

__all__ = ["PostgresLayout"]


@dataclass(frozen=True, slots=True)
class _Table:
    """The table as one database holds it."""

    create: Callable[[Dialect, str, str], tuple[str, ...]]  # (dialect, quoted table, name)
    columns: str  # of a send, as the table's creator spelled them
    key: str  # the column a delete finds its rows by: the primary key
    alias: str  # of a receive's target, where the statement names one
    staged_id: str = ""  # the id column's value from the send stage's text `id`, if staged


def _postgresql(dialect: Dialect, t: str, name: str) -> tuple[str, ...]:
    return (
        f"CREATE TABLE IF NOT EXISTS {t} (\n"
        "  Id uuid NOT NULL PRIMARY KEY, Expires TIMESTAMP, Headers TEXT NOT NULL, "
        "Body BYTEA,\n"
        "  Seq serial NOT NULL UNIQUE)",
        f"CREATE INDEX IF NOT EXISTS {dialect.quote(name + '_expires')} ON {t} (expires)"
        " WHERE expires IS NOT NULL",
    )


def _sqlite(dialect: Dialect, t: str, name: str) -> tuple[str, ...]:
    return (
        f"CREATE TABLE IF NOT EXISTS {t} (\n"
        "  id TEXT NOT NULL UNIQUE,\n"
        "  expires TEXT,\n"
        "  headers TEXT NOT NULL,\n"
        "  body BLOB,\n"
        "  seq INTEGER PRIMARY KEY AUTOINCREMENT\n"
        ")",
    )


_TABLES = {
    "postgresql": _Table(
        _postgresql, "Id, Expires, Headers, Body", key="id", alias="rs", staged_id="id::uuid"
    ),
    "sqlite": _Table(_sqlite, "id, expires, headers, body", key="seq", alias=""),
}


class PostgresLayout(Layout):
    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        self._table = _TABLES[dialect.kind]

    def send_params(self, row: Any) -> Sequence[Any]:
        sent: OutgoingRow = row
        if (
            self.dialect.kind == "postgresql"
            and sent.ttl_ms is not None
            and sent.ttl_ms > (LAST_EXPIRES - time.time()) * 1000
        ):
            sent = sent._replace(ttl_ms=None)  # past 9999-12-31: never expires (see postgresql)
        return sent

    def queue_statements(self, name: str) -> QueueStatements:
        d, shape = self.dialect, self._table
        t = d.table(name)
        tp = d.param_safe(t)
        p = d.placeholder
        key = shape.key
        expired = d.is_expired("expires")
        target, a = (f"{tp} {shape.alias}", f"{shape.alias}.") if shape.alias else (tp, "")
        returning = (
            f"RETURNING {d.uuid_text(a + 'id')}, {d.expired_flag(a + 'expires')}, "
            f"{d.read_text(a + 'headers')}, {d.read_bytes(a + 'body')},\n"
            f"  {d.remaining_ms(a + 'expires')}, {a}seq"
        )
        return QueueStatements(
            create=shape.create(d, t, name),
            send=(
                f"INSERT INTO {tp} ({shape.columns}) VALUES "
                f"({p}, {d.expires_after(p)}, {d.write_text(p)}, {p})"
            ),
            receive=(
                f"DELETE FROM {target} WHERE {a}{key} IN "
                f"(SELECT {key} FROM {tp} ORDER BY seq {d.take(p)})\n{returning}"
            ),
            depth=f"SELECT count(*) FROM {t}",
            oldest=f"SELECT {d.read_text('headers')} FROM {t} ORDER BY seq LIMIT 1",
            expired=f"SELECT count(*) FROM {t} WHERE {expired}",
            purge_expired=(
                f"DELETE FROM {tp} WHERE {key} IN "
                f"(SELECT {key} FROM {tp} WHERE {expired} {d.take(p)})"
            ),
            bounds=f"SELECT min(seq), max(seq) FROM {t}",
            receive_range=(
                f"DELETE FROM {target} WHERE {a}{key} IN "
                f"(SELECT {key} FROM {tp} WHERE seq BETWEEN {p} AND {p} ORDER BY seq {d.take(p)})"
                f"\n{returning}"
            ),
            count_range=f"SELECT count(*) FROM {tp} WHERE seq BETWEEN {p} AND {p}",
            scan_range=(
                f"SELECT id, CASE WHEN {expired} THEN 1 ELSE 0 END, {d.read_text('headers')}, "
                f"{d.byte_length('body')}, seq FROM {tp}\n"
                f"WHERE seq > {p} AND seq <= {p} ORDER BY seq LIMIT {p}"
            ),
            send_staged=(
                f"INSERT INTO {t} ({shape.columns})\n"
                f"SELECT {shape.staged_id}, {d.expires_after('ttl')}, {d.write_text('headers')}, "
                f"body FROM {d.send_stage} ORDER BY n"
                if d.send_stage and shape.staged_id
                else ""
            ),
        )
