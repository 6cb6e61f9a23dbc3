"""The NGinn.MessageBus queue table (`layout: nginn`), on SQL Server, PostgreSQL and SQLite.

Features
    One table per queue with subqueues (`I` ready, `R` scheduled, `X` done, `F` failed), read
    and written as NGinn's own process does (`nginn_sql`: its statements; `nginn_formats`:
    its headers, body and times; `nginn_rows`: the NServiceBus mapping, `nginn_incoming` and
    `nginn_outgoing` its two directions). A receive marks up to n `I` rows
    whose `to_endpoint` is the table's own endpoint (`sql://<alias>/<table>`) `X` with
    `last_processed`, in the source's transaction, and keeps them as NGinn does; rows for
    other endpoints are NGinn's to forward and stay. A row whose `_NG-TTL` has passed (by the
    database's local time) is taken as expired. A row NGinn could not read either goes to
    `F` with `error_info` in the same transaction, unless the route names an error queue.
    A send inserts an `I` row NGinn takes as its own.

Concurrency
    Competing receivers never take the same row: SQL Server `UPDLOCK, READPAST`, PostgreSQL
    `FOR UPDATE SKIP LOCKED`, SQLite one writer.

Retries
    With `nginn.retries` a source runs NGinn's mover (due `R` rows back to `I`) and cleanup
    (`X` rows older than 12 h deleted) about every 8 seconds, as NGinn's cleanup thread does
    (SqlMessageTransport2.cs:525-545): only for tables no NGinn process owns.

Limits
    No sequence ranges (`bridge migrate`, `bridge report`). `peek` counts expired rows by
    `_NG-TTL` as NGinn writes it (`yyyy-MM-dd HH:mm:ss`), and `I` rows for other endpoints
    apart (`elsewhere`; `bridge check --connect` warns of them).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import ConfigError
from bridge.transports.sql.config import NGINN_ENDPOINT_CHARS
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.layouts.base import Layout, QueueStatements, TakenRow
from bridge.transports.sql.layouts.nginn_formats import local_text, utc_to_local
from bridge.transports.sql.layouts.nginn_incoming import NGinnRow
from bridge.transports.sql.layouts.nginn_outgoing import OutgoingNGinnRow
from bridge.transports.sql.layouts.nginn_rows import RowMapping
from bridge.transports.sql.layouts.nginn_sql import SQLITE_LOCAL, NGinnStatements, statements

__all__ = ["NGinnLayout"]


class NGinnLayout(Layout):
    keeps_failed = True

    def __init__(self, dialect: Dialect) -> None:
        options = dialect.nginn
        if options is None:
            raise ConfigError(f"{dialect.describe()}: `layout: nginn` needs `nginn` settings")
        super().__init__(dialect)
        self.options = options
        self.mapping = RowMapping(options.alias, options.timezone, options.types)
        self._statements: dict[str, NGinnStatements] = {}

    def nginn_statements(self, name: str) -> NGinnStatements:
        found = self._statements.get(name)
        if found is None:
            endpoint = self.mapping.endpoint(name)
            if len(endpoint) > NGINN_ENDPOINT_CHARS:
                raise ConfigError(
                    f"{self.dialect.describe()}: NGinn endpoint {endpoint!r} is longer than "
                    f"its to_endpoint column ({NGINN_ENDPOINT_CHARS} characters)"
                )
            found = statements(self.dialect, name, self.options.timezone)
            self._statements[name] = found
        return found

    def queue_statements(self, name: str) -> QueueStatements:
        s = self.nginn_statements(name)
        return QueueStatements(
            create=s.create,
            send=s.send,
            receive=s.receive,
            depth=s.depth,
            oldest=s.oldest,
            expired=s.expired,
            purge_expired="",
            bounds="",
            receive_range="",
            count_range="",
            scan_range="",
        )

    def receive_params(self, name: str) -> tuple[Any, ...]:
        self.nginn_statements(name)  # an endpoint too long for NGinn fails here
        return (self.mapping.endpoint(name),)

    def on_connect(self, db: DbConnection) -> None:
        if isinstance(db, sqlite3.Connection):
            zone = self.mapping.zone
            db.create_function(
                SQLITE_LOCAL, 1, lambda utc: local_text(utc_to_local(utc, zone)), deterministic=True
            )

    def housekeeping(self, name: str) -> tuple[str, ...]:
        if not self.options.retries:
            return ()
        s = self.nginn_statements(name)
        return (s.mover, s.cleanup)

    def keep_failed(self, db: DbConnection, name: str, failed: Sequence[tuple[str, str]]) -> None:
        rows = [(why, int(native_id)) for native_id, why in failed if native_id]
        if rows:
            db.cursor().executemany(self.nginn_statements(name).fail, rows)

    def elsewhere(self, db: DbConnection, name: str) -> int:
        cursor = db.cursor()
        cursor.execute(self.nginn_statements(name).elsewhere, self.receive_params(name))
        row = cursor.fetchone()
        return int(row[0] or 0) if row else 0

    def warnings(self, db: DbConnection, name: str) -> list[str]:
        count = self.elsewhere(db, name)
        if not count:
            return []
        return [
            f"{self.dialect.describe()}: NGinn table {name!r} holds {count} ready row(s) for "
            f"other endpoints than {self.mapping.endpoint(name)!r}: NGinn forwards them, the "
            "bridge does not take them (a wrong `nginn.alias`, or no NGinn process reading "
            "this table, strands them)"
        ]

    def oldest_age(self, value: Any, now: float) -> float | None:
        return None if value is None else max(0.0, float(value))

    # -- the mapping ------------------------------------------------------------------------------

    def outgoing(
        self, envelope: Envelope, now: float, native_id: str | None = None, *, address: str = ""
    ) -> OutgoingNGinnRow:
        return self.mapping.outgoing(envelope, now, address)

    def send_params(self, row: Any) -> Sequence[Any]:
        sent: OutgoingNGinnRow = row
        return sent

    def received_rows(self, rows: Sequence[Sequence[Any]]) -> Sequence[TakenRow]:
        return self.mapping.received(rows)

    def incoming(self, row: Any, now: float) -> Envelope | PoisonMessage:
        taken: NGinnRow = row
        return self.mapping.incoming(taken, now, self._table_of(taken))

    def _table_of(self, row: NGinnRow) -> str:
        return row.to_endpoint.rsplit("/", 1)[-1]
