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
    One `I` row goes to each distinct subscriber endpoint this connection's tables hold (see
    What is lossy for the others), into that endpoint's table, with
    `from_endpoint` the publisher's endpoint and `to_endpoint` the subscriber's, as NGinn's
    `NotifyAndDistributeMessages` sends (MessageBus.cs:347-371): the first copy keeps the
    message's `unique_id` (`NServiceBus.MessageId`, MessageBus.cs:360-361) and each other copy
    gets one of its own (:364-366). NGinn makes that one afresh (`CreateNewMessageUniqueId`,
    MessageBus.cs:213-217: a GUID per process and a counter); the bridge derives it from the
    message id and the subscriber endpoint (`copy_id`: a name-based UUID's 32 hex digits, within
    `unique_id`'s 40 characters), so that an event delivered again (after a crash before the
    source's commit) reaches every subscriber with the unique id it had the first time, and
    each can recognise it as a duplicate. That holds while the set of subscribers stays the
    same between the deliveries: the first copy goes to the first subscriber endpoint in
    order, so a subscriber added or removed in between can move the message's own id to
    another subscriber, and the one that had it gets a derived id. A message without an id
    gets NGinn's form for each copy (nothing to derive from).
    Every copy of a `send` in one transaction, which returns only after COMMIT. A lookup is
    kept `CACHE_FOR` seconds, as `SqlPublisher` keeps its own (NGinn keeps its for an hour,
    SqlSubscriptionService.cs:26). An event nobody subscribes to is dropped, as NGinn drops it.

Failures
    An event with a `deliver_at` still to come raises `MessageRejected` with its index (a
    publish is not delayed); so does an event no NGinn row can hold (`nginn_outgoing.outgoing`).
    Database failures are the connection's (`errors.py`).

What is lossy
    What an NGinn row cannot hold (`nginn_outgoing`). Two kinds of subscriber rows get no copy,
    the others theirs: each skipped copy is counted once its batch is committed (`skipped`,
    and `on_skipped`, which the service turns into the `bridge_nginn_copies_skipped_total`
    metric) and each such endpoint logged once as a warning:
    - an endpoint of another alias (another database), which NGinn reaches by forwarding and
      the bridge does not (`other_database`);
    - the publisher itself (`publisher`): NGinn's special subscriber `local`, which NGinn maps
      to the publishing endpoint (MessageBus.cs:274), or that endpoint by name. The bridge is
      not that endpoint's process but its stand-in: for an event from Kafka the endpoint is the
      publisher's proxy table, whose route would carry the copy back to the publisher, and no
      NGinn process's own handlers (`HasHandlerFor`, MessageBus.cs:279-285) are behind it.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial

from bridge.envelope import Envelope
from bridge.errors import ConfigError, HeadersFormatError, MessageRejected
from bridge.nservicebus.events import published, topics_of
from bridge.transports.sql.addresses import nginn_table
from bridge.transports.sql.config import NGINN_ENDPOINT_CHARS, SqlConnection
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.layouts.nginn_outgoing import OutgoingNGinnRow
from bridge.transports.sql.nginn_subscriptions import NGinnSubscriptionTable
from bridge.transports.sql.pool import Pool
from bridge.transports.sql.publish import Publisher

__all__ = ["LOCAL", "NGinnPublisher", "Skipped", "copy_id"]

log = logging.getLogger(__name__)

#: NGinn's subscriber endpoint meaning the publisher itself (MessageBus.cs:274, any case).
LOCAL = "local"

#: Told of each copy not written: (subscriber endpoint as its row names it, reason).
Skipped = Callable[[str, str], None]


def copy_id(message_id: str, subscriber: str) -> str:
    """The `unique_id` of a copy after the first of message `message_id` for `subscriber`:
    the same on every delivery of the message, another for each subscriber."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"nginn-copy:{subscriber}#{message_id}").hex


class NGinnPublisher(Publisher):
    """Publishes as NGinn endpoint `endpoint` (see the module docstring)."""

    def __init__(
        self,
        dialect: Dialect,
        config: SqlConnection,
        endpoint: str,
        pool: Pool | None = None,
        event: str | None = None,
        on_skipped: Skipped | None = None,
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
        self._own_table = nginn_table(config, endpoint)
        self._on_skipped = on_skipped
        #: Copies not written so far, by (subscriber endpoint, reason).
        self.skipped: Counter[tuple[str, str]] = Counter()

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

    def _reachable(
        self, subscribers: list[str], skipped: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """(endpoint, table) of each subscriber that gets a copy; the others are added to
        `skipped` (subscriber, reason), counted once the batch is committed."""
        out: list[tuple[str, str]] = []
        for subscriber in subscribers:
            local = subscriber.casefold() == LOCAL
            table = self._own_table if local else nginn_table(self._config, subscriber)
            if table is None:
                skipped.append((subscriber, "other_database"))
            elif table == self._own_table:
                skipped.append((subscriber, "publisher"))
            else:
                out.append((subscriber, table))
        return out

    def _skip(self, subscriber: str, reason: str) -> None:
        # A subscriber's reason never changes (`_reachable`): warned of at its first count.
        first = (subscriber, reason) not in self.skipped
        self.skipped[subscriber, reason] += 1
        if self._on_skipped is not None:
            self._on_skipped(subscriber, reason)
        if not first:
            return
        if reason == "other_database":
            why = (
                f"is not a table of alias {self._options.alias!r} (this connection's database): "
                "NGinn forwards to other databases, the bridge does not"
            )
        else:
            why = (
                "is the publisher itself (NGinn's `local`, MessageBus.cs:274): the bridge "
                "publishes as its stand-in, and a copy there would go back to the publisher"
            )
        log.warning(
            "%s: publish as %s: subscriber endpoint %r %s; it gets no copy of the events "
            "(logged once, counted in bridge_nginn_copies_skipped_total)",
            self._dialect.describe(),
            self._endpoint,
            subscriber,
            why,
        )

    def _copies(
        self,
        envelope: Envelope,
        subscribers: list[str],
        now: float,
        where: str,
        index: int,
        skipped: list[tuple[str, str]],
    ) -> list[tuple[str, OutgoingNGinnRow]] | MessageRejected:
        layout = self._dialect.layout
        out = []
        for n, (subscriber, table) in enumerate(self._reachable(subscribers, skipped)):
            try:
                row: OutgoingNGinnRow = layout.outgoing(envelope, now, address=table)
            except HeadersFormatError as exc:
                return MessageRejected(f"{where}: {exc}", index=index)
            if row.unique_id is None:
                unique_id = self._unique_id()
            else:
                unique_id = row.unique_id if n == 0 else copy_id(row.unique_id, subscriber)
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
        cannot be published is returned before anything is written. The copies not written are
        counted after the commit only, so that a batch sent again is not counted twice."""
        now = time.time()
        where = f"{self._dialect.describe()}: publish as {self._endpoint}"
        rows: dict[str, list[Sequence[object]]] = {}
        skipped: list[tuple[str, str]] = []
        for index, received in enumerate(envelopes):
            envelope = published(received, self._event)
            subscribers = self._subscribers(db, self.message_types(envelope), time.monotonic())
            copies = self._copies(envelope, subscribers, now, where, index, skipped)
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
        for subscriber, reason in skipped:
            self._skip(subscriber, reason)
        return None
