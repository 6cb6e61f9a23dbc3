"""`SqlPublisher`: publishes events into queue tables as an NServiceBus SQL publisher does.

Guarantees
    For each event, the topics of its type (`NServiceBus.EnclosedMessageTypes`' full names, then
    `System.Object`; for an event that names no type, the type its route carries, `event`, which
    its copies then name) are looked up in the connection's subscription table (`SELECT DISTINCT
    QueueAddress ... WHERE Topic IN`, `subscriptions.py`), and one copy is inserted into each
    address's queue table; every copy of every event of a `send` in one transaction, which
    returns only after COMMIT. A lookup is kept `CACHE_FOR` seconds, as the transport caches it
    (CachedSubscriptionStore.cs:11-107 of Particular/NServiceBus.SqlServer@214c4e8f; 5 s by
    default, SqlServer/PubSub/SubscriptionOptions.cs:19-28). An event nobody subscribes to is
    dropped, as a publisher drops it.

    An address in another schema (`"sales"."Billing"`, `Billing@[sales]`), or on SQL Server in
    another catalog of the same server (`Billing@[sales]@[other]`), gets its copy there, as the
    transport sends to a schema-qualified address (`reach.py`), in the same transaction.

Failures
    An event with a `deliver_at` still to come raises `MessageRejected` with its index:
    NServiceBus does not delay a publish. On SQLite, an address in a schema other than `main`
    (an attached database the bridge's connection does not have) raises `MessageRejected` with
    its index; an event no row can hold, the same. Database failures are the connection's
    (`errors.py`).

What is lossy
    Nothing: every copy is the event as it came, with its own row id.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

from bridge.envelope import Envelope
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.nservicebus.delays import refuse_delays
from bridge.nservicebus.events import published, topics_of
from bridge.protocols import Checkpoint
from bridge.transports.sql.config import SqlConnection
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.layouts.base import new_ids
from bridge.transports.sql.pool import Pool
from bridge.transports.sql.reach import QueueTables
from bridge.transports.sql.subscriptions import SubscriptionTable

__all__ = ["CACHE_FOR", "Publisher", "SqlPublisher"]

#: Seconds a subscriber lookup is reused.
CACHE_FOR = 5.0


class Publisher:
    """What every SQL publisher does around its own `_publish`: refuse a delayed event, run the
    publish on the connection, keep subscriber lookups `CACHE_FOR` seconds."""

    def __init__(self, dialect: Dialect, pool: Pool | None) -> None:
        self._dialect = dialect
        self._connection = Connection(dialect, pool=pool)
        self._cache: dict[tuple[str, ...], tuple[float, list[str]]] = {}

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        if not envelopes:
            return
        # NServiceBus does not delay a publish: an event to be delivered later is refused.
        refuse_delays(envelopes, time.time(), f"{self._dialect.describe()}: publish")
        rejected = await self._connection.run(partial(self._publish, list(envelopes)))
        if rejected is not None:
            raise rejected

    def _publish(self, envelopes: list[Envelope], db: DbConnection) -> MessageRejected | None:
        raise NotImplementedError

    def _looked_up(
        self, topics: tuple[str, ...], now: float, look: Callable[[], list[str]]
    ) -> list[str]:
        """The subscribers of `topics`: `look`'s answer, or the one kept from less than
        `CACHE_FOR` seconds before `now` (a monotonic clock)."""
        cached = self._cache.get(topics)
        if cached is not None and now - cached[0] < CACHE_FOR:
            return cached[1]
        found = look()
        self._cache[topics] = (now, found)
        return found

    async def close(self) -> None:
        await self._connection.close()


class SqlPublisher(Publisher):
    def __init__(
        self,
        dialect: Dialect,
        config: SqlConnection,
        pool: Pool | None = None,
        event: str | None = None,
    ) -> None:
        super().__init__(dialect, pool)
        self._event = event
        self._config = config
        self._table = SubscriptionTable(dialect, config.subscription_table, self._connection)
        self._tables = QueueTables(dialect, config)

    def _subscribers(self, db: DbConnection, topics: tuple[str, ...], now: float) -> list[str]:
        return self._looked_up(topics, now, partial(self._table.subscribers, db, topics))

    def _publish(self, envelopes: list[Envelope], db: DbConnection) -> MessageRejected | None:
        """Look the subscribers up, then insert every copy in one transaction; a message that
        cannot be published is returned before anything is written."""
        now = time.time()
        where = f"{self._dialect.describe()}: publish"
        outgoing, send_params = self._dialect.layout.outgoing, self._dialect.send_params
        rows: dict[tuple[Dialect, str], list[Sequence[object]]] = {}
        for index, received in enumerate(envelopes):
            envelope = published(received, self._event)
            topics = tuple(topics_of(envelope.headers))
            addresses = self._subscribers(db, topics, time.monotonic())
            for address, native_id in zip(addresses, new_ids(len(addresses)), strict=True):
                place = self._tables.find(address)
                if place is None:
                    return MessageRejected(
                        f"{where}: subscriber address {address!r} of {topics[0]!r} is not a "
                        "queue table this connection reaches (SQLite: only `main`'s)",
                        index=index,
                    )
                try:
                    row = send_params(outgoing(envelope, now, native_id))
                except HeadersFormatError as exc:
                    return MessageRejected(f"{where}: {exc}", index=index)
                rows.setdefault(place, []).append(row)
        db.rollback()  # the lookups' transaction, where the driver opened one
        if rows:
            self._dialect.begin(db)
            cursor = db.cursor()
            for (dialect, name), inserted in rows.items():
                cursor.executemany(dialect.send_statement(db, name), inserted)
            db.commit()
        return None
