"""`NGinnPublisher`: publishes events into NGinn.MessageBus queue tables as an NGinn publisher
does (`Notify`).

Guarantees
    For each event, the subscribers are looked up in the connection's NGinn subscription table
    (`nginn_subscriptions.py`) by the publisher's endpoint (`sql://<alias>/<table>`) and the
    NGinn names of the event's types: `NServiceBus.EnclosedMessageTypes`' full names, each
    through `nginn.types`, then `System.Object` (an event that names no type is its route's
    `event`). NGinn walks the classes of its type (Impl/MessageBus.cs:264-287 of
    lafar6502/nginn-messagebus @1fa4baf) and no interfaces; the names listed here are whatever
    the event lists, so a subscription to an interface an NServiceBus event lists matches too.
    One `I` row goes to each distinct subscriber endpoint, into that endpoint's table, with
    `from_endpoint` the publisher's endpoint and `to_endpoint` the subscriber's, as NGinn's
    `NotifyAndDistributeMessages` sends (MessageBus.cs:347-371): the first copy keeps the
    message's `unique_id` (`NServiceBus.MessageId`), each other copy gets a new one in NGinn's
    form (`CreateNewMessageUniqueId`, MessageBus.cs:213-217: a GUID's 32 digits and a counter).
    Every copy of a `send` in one transaction, which returns only after COMMIT. A lookup is
    kept `CACHE_FOR` seconds, as `SqlPublisher` keeps its own (NGinn keeps its for an hour,
    SqlSubscriptionService.cs:26). An event nobody subscribes to is dropped, as NGinn drops it.

Failures
    An event with a `deliver_at` still to come raises `MessageRejected` with its index (a
    publish is not delayed). A subscriber endpoint of another alias (another database; NGinn
    forwards there, the bridge does not) raises `MessageRejected` naming it, with the index;
    so does an event no NGinn row can hold (`nginn_rows.outgoing`). Database failures are the
    connection's (`errors.py`).

What is lossy
    What an NGinn row cannot hold (`nginn_rows`).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from functools import partial

from bridge.envelope import Envelope
from bridge.errors import ConfigError, HeadersFormatError, MessageRejected
from bridge.nservicebus.events import published, topics_of
from bridge.transports.sql.addresses import nginn_table
from bridge.transports.sql.config import NGINN_ENDPOINT_CHARS, SqlConnection
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.layouts.nginn_rows import OutgoingNGinnRow
from bridge.transports.sql.nginn_subscriptions import NGinnSubscriptionTable
from bridge.transports.sql.pool import Pool
from bridge.transports.sql.publish import Publisher

__all__ = ["NGinnPublisher"]


class NGinnPublisher(Publisher):
    """Publishes as NGinn endpoint `endpoint` (see the module docstring)."""

    def __init__(
        self,
        dialect: Dialect,
        config: SqlConnection,
        endpoint: str,
        pool: Pool | None = None,
        event: str | None = None,
    ) -> None:
        options = config.nginn
        if options is None or config.layout != "nginn":
            raise ConfigError(f"{dialect.describe()}: an NGinn publisher needs `layout: nginn`")
        if len(endpoint) > NGINN_ENDPOINT_CHARS:
            raise ConfigError(
                f"{dialect.describe()}: NGinn publisher endpoint {endpoint!r} is longer than "
                f"NGinn's from_endpoint column ({NGINN_ENDPOINT_CHARS} characters)"
            )
        super().__init__(dialect, pool)
        self._config = config
        self._options = options
        self._endpoint = endpoint
        self._event = event
        self._table = NGinnSubscriptionTable(dialect, options.subscriptions, self._connection)
        self._seed = uuid.uuid4().hex
        self._counter = itertools.count(1)

    def message_types(self, envelope: Envelope) -> tuple[str, ...]:
        """The NGinn names `envelope`'s subscribers are looked up by, most derived first."""
        names = [self._options.message_type(t) for t in topics_of(envelope.headers)]
        return tuple(dict.fromkeys(names))

    def _subscribers(self, db: DbConnection, types: tuple[str, ...], now: float) -> list[str]:
        return self._looked_up(
            types, now, partial(self._table.subscribers, db, self._endpoint, types)
        )

    def _unique_id(self) -> str:
        return f"{self._seed}{next(self._counter)}"

    def _copies(
        self, envelope: Envelope, subscribers: list[str], now: float, where: str, index: int
    ) -> list[tuple[str, OutgoingNGinnRow]] | MessageRejected:
        layout = self._dialect.layout
        out = []
        for n, subscriber in enumerate(subscribers):
            table = nginn_table(self._config, subscriber)
            if table is None:
                return MessageRejected(
                    f"{where}: subscriber endpoint {subscriber!r} is not a table of alias "
                    f"{self._options.alias!r} (this connection's database); NGinn forwards to "
                    "other databases, the bridge does not",
                    index=index,
                )
            try:
                row: OutgoingNGinnRow = layout.outgoing(envelope, now, address=table)
            except HeadersFormatError as exc:
                return MessageRejected(f"{where}: {exc}", index=index)
            unique_id = (row.unique_id if n == 0 else None) or self._unique_id()
            out.append(
                (
                    table,
                    row._replace(
                        from_endpoint=self._endpoint, to_endpoint=subscriber, unique_id=unique_id
                    ),
                )
            )
        return out

    def _publish(self, envelopes: list[Envelope], db: DbConnection) -> MessageRejected | None:
        """Look the subscribers up, then insert every copy in one transaction; a message that
        cannot be published is returned before anything is written."""
        now = time.time()
        where = f"{self._dialect.describe()}: publish as {self._endpoint}"
        rows: dict[str, list[Sequence[object]]] = {}
        for index, received in enumerate(envelopes):
            envelope = published(received, self._event)
            subscribers = self._subscribers(db, self.message_types(envelope), time.monotonic())
            copies = self._copies(envelope, subscribers, now, where, index)
            if isinstance(copies, MessageRejected):
                return copies
            for table, row in copies:
                rows.setdefault(table, []).append(self._dialect.layout.send_params(row))
        db.rollback()  # the lookups' transaction, where the driver opened one
        if rows:
            self._dialect.begin(db)
            cursor = db.cursor()
            for table, inserted in rows.items():
                cursor.executemany(self._dialect.send_statement(db, table), inserted)
            db.commit()
        return None
