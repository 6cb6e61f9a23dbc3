"""Rows that still carry `NServiceBus.SqlServer.ForwardDestination`, taken as NServiceBus does.

A delayed message moved out of an endpoint's delayed table lands in that endpoint's input queue
with the header naming where it was sent (`bridge.transports.sql.delayed`). The receiver
strips it; when it names the input queue itself the message is handled there, and when it
names another queue it is sent there, on the same connection and in the receive's transaction,
instead of being handled (Sql.Shared/Receiving/ProcessStrategy.cs:75-124). A source does the
same: the message goes on over its route in the first case, and into the named table in its
batch's transaction in the second. The named queue may be in another schema (SQL Server: or
another catalog of the server): the receiver sends to `tableBasedQueueCache.Get(destination)`
(ProcessStrategy.cs:101-104), the address translated with its schema and catalog, so the
message goes to that schema's table (`reach.QueueTables`, as a publisher's copies). A table
that does not exist, or a schema SQLite does not reach (anything but `main`), makes the
message a poison message (NServiceBus fails it and, after its retries, moves it to the error
queue: ProcessStrategy.cs:104-121).
"""

from __future__ import annotations

import time
from typing import cast

from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import HeadersFormatError
from bridge.transports.sql.addresses import address_key, nginn_table
from bridge.transports.sql.config import SqlConnection
from bridge.transports.sql.delayed import FORWARD_DESTINATION
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.reach import QueueTables

__all__ = ["Forwards"]


class Forwards:
    """The forwarding of one source's rows (queue table `address` on `dialect`)."""

    def __init__(self, dialect: Dialect, address: str) -> None:
        self._dialect = dialect
        self._config = cast(SqlConnection, getattr(dialect, "config"))  # noqa: B009
        self._address = address
        self._tables = QueueTables(dialect, self._config)
        self._exists: set[tuple[Dialect, str]] = set()

    def take(self, envelope: Envelope, db: DbConnection) -> Envelope | PoisonMessage | None:
        """`envelope` with the header stripped when it is this queue's; None when it was sent
        on to another table in `db`'s open transaction; a poison message when it cannot be."""
        if FORWARD_DESTINATION not in envelope.headers:  # one look for nearly every message
            return envelope
        target = envelope.headers.get(FORWARD_DESTINATION)
        envelope.headers.remove(FORWARD_DESTINATION)
        if not target:
            return envelope
        # SQL Server: the canonical address names the database, which the config may leave
        # to the DSN; the dialect knows it once connected (as the source has).
        database: str | None = getattr(self._dialect, "database", None)
        own = address_key(self._config, self._address, database)
        if address_key(self._config, target, database) == own:
            return envelope
        place = self._tables.find(nginn_table(self._config, target) or target)
        if place is None:
            return self._poison(
                envelope,
                f"{FORWARD_DESTINATION} {target!r} is not a queue table this connection reaches "
                "(SQLite: only `main`'s)",
            )
        dialect, table = place
        if place not in self._exists:
            if not dialect.table_exists(db, table):
                return self._poison(envelope, f"{FORWARD_DESTINATION} {target!r} does not exist")
            self._exists.add(place)
        try:
            row = dialect.layout.outgoing(envelope, time.time(), address=table)
        except HeadersFormatError as exc:
            return self._poison(envelope, str(exc))
        db.cursor().execute(dialect.send_statement(db, table), dialect.send_params(row))
        return None

    def _poison(self, envelope: Envelope, reason: str) -> PoisonMessage:
        # Its headers are readable: the error copy carries them as headers, not as raw text
        # (which would make a retry from the error queue a poison message again).
        return PoisonMessage(
            raw_headers=None,
            body=bytes(envelope.body),
            reason=f"{self._dialect.describe()}: {reason}",
            exception_type="QueueNotFoundException",
            native_id=envelope.native_id,
            headers=envelope.headers,
        )
