"""The native subscriptions the bridge makes on its subscribers' behalf (`bridge.config.pubsub`).

`subscribe_all` makes every one the registry asks for: at `bridge install` and again when
`bridge run` starts, so a table or broker that lost them gets them back. Each is idempotent, as
NServiceBus's own are: an upsert of the SubscriptionRouting row on SQL (`transports/sql/
subscriptions.py`, the table created first when missing), on NGinn tables NGinn's update-then-
insert of a row of its subscription table (`transports/sql/nginn_subscriptions.py`), the event's
exchange declared and bound to the queue's on RabbitMQ (`transports/rabbitmq/events.py`).
A subscription to an NGinn publisher is made only once its event table exists (NGinn's Notify
would fail on a row naming a missing table), and a Kafka subscriber's only once its event queue
exists (a row or binding naming a missing queue loses the events: NServiceBus's SQL publisher
fails on the missing table, RabbitMQ's exchange-to-exchange binding cannot be made):
`EventTablesMissing` names the others, `bridge install` exits 1 with it, and `bridge run` logs
each as not ready and tries again.
`change` subscribes or unsubscribes one endpoint by hand (`bridge subscribe` / `bridge
unsubscribe`; the binding on RabbitMQ, or the NGinn row, that every Kafka subscriber of the
event shares stays while another uses it); the bridge never unsubscribes on its own. `state`
reads what each side holds, for `bridge endpoints --connect` (`subscription_state.py`).

Sinks that publish (`publisher`: `SqlPublisher`, `NGinnPublisher`, `RabbitMQPublisher`) are
made here too, so the supervisor asks one place how a derived route's events go. (Events for
Kafka subscribers, and an NGinn publisher's, reach no proxy: each has an event queue or table
and a route of its own, `pubsub.py`.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bridge.config.models import BridgeConfig
from bridge.config.pubsub import Subscribed, event_table_route
from bridge.errors import BridgeError, TransportError, TransportUnavailable, UsageError
from bridge.protocols import Sink, Transport
from bridge.service.subscription_state import SQL, grouped, nginn_row, proxy_endpoint

__all__ = [
    "EventTablesMissing",
    "change",
    "describe",
    "not_ready",
    "publisher",
    "subscribe_all",
]

log = logging.getLogger("bridge.subscriptions")


def describe(s: Subscribed, *, subscribe: bool = True) -> str:
    """One subscription, as `bridge install` and the logs say it."""
    what = "subscribed" if subscribe else "unsubscribed"
    return f"{what} {s.endpoint} to {s.event} at {s.address or s.queue} (publisher {s.publisher})"


async def _apply(
    config: BridgeConfig,
    transport: Transport,
    kind: str,
    made: list[Subscribed],
    *,
    subscribe: bool,
) -> list[Subscribed]:
    """Make (or remove) `made`, subscriptions on one connection, on a connection of its own;
    the subscriptions not made because their event table or event queue does not exist yet."""
    if kind in SQL:
        from bridge.transports.sql.subscriptions import SubscriptionTable
        from bridge.transports.sql.transport import Transport as SqlTransport

        assert isinstance(transport, SqlTransport)
        if transport.config.layout == "nginn":
            return await _apply_nginn(config, transport, made, subscribe=subscribe)
        table = SubscriptionTable(transport.dialect, transport.config.subscription_table)
        waiting: list[Subscribed] = []
        try:
            if subscribe:
                await table.create()
                waiting = await _missing_queues(transport, made)
            for s in made:
                if s in waiting:
                    continue
                if subscribe:
                    await table.subscribe(s.endpoint, s.address, s.event)
                else:
                    await table.unsubscribe(s.endpoint, s.event)
        finally:
            await table.close()
        return waiting
    if kind == "rabbitmq":
        from bridge.transports.rabbitmq import events
        from bridge.transports.rabbitmq.admin import run_declaration
        from bridge.transports.rabbitmq.config import describe as where
        from bridge.transports.rabbitmq.connection import link
        from bridge.transports.rabbitmq.errors import reply_code
        from bridge.transports.rabbitmq.transport import Transport as RabbitTransport

        assert isinstance(transport, RabbitTransport)
        name = transport.name
        waiting = await _missing_queues(transport, made) if subscribe else []
        admin = link(transport.config, name, "admin", where(name))
        try:
            for s in made:
                if s in waiting:
                    continue
                change = events.subscribe if subscribe else events.unsubscribe
                try:
                    for declaration in change(s.event, s.queue):
                        await admin.run(run_declaration(declaration), what=declaration.text)
                except TransportError as exc:
                    if not subscribe and reply_code(exc) == 404:
                        continue  # nothing to unbind: unsubscribed already, as NServiceBus takes it
                    raise TransportError(
                        f"{describe(s, subscribe=subscribe)}: {exc} (the exchange of queue "
                        f"{s.queue!r} must exist: `bridge install` with `proxies: {{create: "
                        "true}` creates it)"
                    ) from exc
        finally:
            await admin.close()
        return waiting
    return []


async def _missing_queues(transport: Transport, made: list[Subscribed]) -> list[Subscribed]:
    """The subscriptions of `made` whose event queue (`Subscribed.table`) does not exist."""
    queues = list(dict.fromkeys(s.table for s in made if s.table is not None))
    missing = set()
    for queue in queues:
        try:
            await transport.check([queue])
        except TransportUnavailable:
            raise
        except BridgeError:
            missing.add(queue)
    return [s for s in made if s.table in missing]


async def _apply_nginn(
    config: BridgeConfig, transport: Transport, made: list[Subscribed], *, subscribe: bool
) -> list[Subscribed]:
    """`_apply` on a connection of NGinn tables: rows of NGinn's subscription table. A
    subscription to an NGinn publisher whose event table does not exist is not made, and
    returned: NGinn's Notify inserts into each subscriber's table in the publisher's own
    transaction (Impl/MessageBus.cs:347-371 of lafar6502/nginn-messagebus @1fa4baf), so a row
    naming a missing table would make every publish of the event fail. Removing a
    subscription to an NGinn publisher removes the row whose subscriber is the proxy (or
    first Kafka subscriber's proxy) too, as subscriptions were made before they had event
    tables."""
    from bridge.transports.sql.nginn_subscriptions import NGinnSubscriptionTable
    from bridge.transports.sql.transport import Transport as SqlTransport

    assert isinstance(transport, SqlTransport) and transport.config.nginn is not None
    name = transport.config.nginn.subscriptions
    table = NGinnSubscriptionTable(transport.dialect, name)
    waiting: list[Subscribed] = []
    try:
        if subscribe:
            await table.create()
            wanted = [s.table for s in made if s.table is not None]
            missing = set(await table.missing(list(dict.fromkeys(wanted))))
            waiting = [s for s in made if s.table in missing]
        for s in made:
            if s in waiting:
                continue
            publisher, subscriber, message_type = nginn_row(config, s)
            if subscribe:
                await table.subscribe(publisher, subscriber, message_type)
                continue
            await table.unsubscribe(publisher, subscriber, message_type)
            if s.table is not None:
                proxy = config.registry.address(s.queue, s.connection)
                await table.unsubscribe(publisher, proxy, message_type)
    finally:
        await table.close()
    return waiting


class EventTablesMissing(TransportError):
    """Subscriptions not made because their event tables (NGinn publishers) or event queues
    (Kafka subscribers) do not exist (`waiting`); the others were made (`done`, as lines to
    print). Not retriable by itself, but `bridge run` tries again now and then, and subscribes
    each once its table or queue is there."""

    def __init__(self, waiting: list[Subscribed], done: list[str]) -> None:
        self.waiting = waiting
        self.done = done
        listed = "; ".join(
            f"{s.endpoint} to {s.event} at {s.address} ({_what(s)} {s.table!r} on "
            f"{s.connection!r}, read by route {event_table_route(s.connection, s.table or '')})"
            for s in waiting
        )
        super().__init__(
            f"not subscribed, as their event tables or queues do not exist: {listed}. A "
            "subscription naming a missing one would make the NGinn publisher's Notify, and "
            "with it the publisher's transaction, fail, or lose the events; `bridge install` "
            "with `proxies: {create: true}` creates them (or create them as the endpoints' "
            "installers create their queues), and the bridge subscribes each once it exists"
        )


def _what(s: Subscribed) -> str:
    return "event table" if s.queue != s.table else "event queue"


def not_ready(error: EventTablesMissing) -> list[str]:
    """One line per subscription `error` left unmade, as the logs say it."""
    return [
        f"{s.connection}: not subscribed {s.endpoint} to {s.event}: {_what(s)} {s.table!r} "
        f"does not exist; route {event_table_route(s.connection, s.table or '')} is not ready"
        for s in error.waiting
    ]


async def subscribe_all(config: BridgeConfig, transports: dict[str, Transport]) -> list[str]:
    """Make every native subscription of the registry; what was made, as lines to print.
    Raises `EventTablesMissing` after making all the others when a subscription's NGinn event
    table does not exist."""
    from bridge.transports import load

    done = []
    waiting: list[Subscribed] = []
    for connection, made in grouped(config.registry.pubsub.native()).items():
        if connection not in transports:
            transports[connection] = load(connection, config.connections[connection])
        kind = config.connections[connection].type
        left = await _apply(config, transports[connection], kind, made, subscribe=True)
        waiting += left
        for s in made:
            if s in left:
                continue
            log.info(describe(s), extra={"connection": connection})
            done.append(f"{connection}: {describe(s)}")
    if waiting:
        raise EventTablesMissing(waiting, done)
    return done


def _find(config: BridgeConfig, endpoint: str, event: str) -> Subscribed:
    if endpoint not in config.endpoints:
        known = ", ".join(sorted(config.endpoints)) or "none"
        raise UsageError(f"no endpoint named {endpoint!r} in the registry (known: {known})")
    for s in config.registry.pubsub.subscriptions():
        if s.endpoint == endpoint and s.event == event:
            return s
    listed = [x.event for x in config.endpoints[endpoint].subscribes]
    raise UsageError(
        f"endpoint {endpoint!r} does not subscribe to {event!r} in the config (it subscribes "
        f"to: {', '.join(listed) or 'nothing'}); add it under its `subscribes:` to name the "
        "publisher"
    )


async def change(config: BridgeConfig, endpoint: str, event: str, *, subscribe: bool) -> str:
    """Subscribe or unsubscribe one endpoint by hand; what was done."""
    from bridge.transports import load

    s = _find(config, endpoint, event)
    if not s.native:
        return f"{endpoint} lives with its publisher on {s.connection!r}: it subscribes itself"
    kind = config.connections[s.connection].type
    sharing = [
        other.endpoint
        for other in config.registry.pubsub.subscriptions()
        if other.kind == "kafka"
        and (other.connection, other.queue, other.event) == (s.connection, s.queue, s.event)
        and other.endpoint != endpoint
    ]
    shared = config.registry.pubsub.nginn_row(s) is not None or kind == "rabbitmq"
    if not subscribe and shared and sharing:
        # One binding (or NGinn row, whose subscriber is the event table or queue) carries
        # the event to Kafka for every Kafka subscriber: it stays while another uses it.
        topic = config.registry.pubsub.topic(event)
        what = "binding" if kind == "rabbitmq" else "NGinn subscription"
        removed = await _remove_proxy_row(config, s)
        to = s.address if s.queue != s.table else repr(s.queue)  # NGinn endpoint, or a queue
        return (
            f"{s.connection}: kept the {what} of {event} to {to}: "
            f"{', '.join(sharing)} also receive(s) it through it (an event goes to Kafka once, "
            f"to topic {topic!r}); {endpoint} stops receiving it when it no longer reads that "
            "topic (remove it from its `subscribes:`)" + removed
        )
    transport = load(s.connection, config.connections[s.connection])
    try:
        waiting = await _apply(config, transport, kind, [s], subscribe=subscribe)
    finally:
        await transport.close()
    if waiting:
        raise EventTablesMissing(waiting, [])
    return f"{s.connection}: {describe(s, subscribe=subscribe)}"


async def _remove_proxy_row(config: BridgeConfig, s: Subscribed) -> str:
    """Remove the NGinn row whose subscriber is `s`'s proxy (`Subscribed.queue`), which
    delivers every event a second time next to the event table's; what was done, to append
    to a message."""
    from bridge.transports import load
    from bridge.transports.sql.nginn_subscriptions import NGinnSubscriptionTable
    from bridge.transports.sql.transport import Transport as SqlTransport

    proxy = proxy_endpoint(config, s)
    if proxy is None:
        return ""
    publisher, _, message_type = nginn_row(config, s)
    transport = load(s.connection, config.connections[s.connection])
    try:
        assert isinstance(transport, SqlTransport) and transport.config.nginn is not None
        table = NGinnSubscriptionTable(transport.dialect, transport.config.nginn.subscriptions)
        try:
            if await table.exists():
                await table.unsubscribe(publisher, proxy, message_type)
        finally:
            await table.close()
    finally:
        await transport.close()
    return f"; removed the row of {proxy} (a bridge's from before event tables), if there was one"


def publisher(
    config: BridgeConfig,
    transport: Transport,
    connection: str,
    event: str | None = None,
    *,
    endpoint: str | None = None,
    queue: str | None = None,
    on_skipped: Callable[[str, str], None] | None = None,
) -> Sink:
    """The sink that publishes events on `connection` as NServiceBus publishers do; a message
    that names no type is taken to be an `event` (its route's: `EventRoute.event`). On NGinn
    tables it publishes as an NGinn endpoint: registered publisher `endpoint`'s there (its
    proxy, for an event published on Kafka), else the table `queue` (a written route's
    `to.queue`); `on_skipped` is told of each copy it does not write (`NGinnPublisher`)."""
    kind = config.connections[connection].type
    if kind in SQL:
        from bridge.transports.sql.publish import SqlPublisher
        from bridge.transports.sql.transport import Transport as SqlTransport

        assert isinstance(transport, SqlTransport)
        if transport.config.layout == "nginn":
            from bridge.transports.sql.addresses import canonical_address
            from bridge.transports.sql.nginn_publish import NGinnPublisher

            if endpoint is not None:
                as_ = config.registry.address(endpoint, connection)
            elif queue is not None:
                as_ = canonical_address(transport.config, queue)
            else:
                raise UsageError(
                    f"publishing on {connection!r} (NGinn tables) needs the publisher's table: "
                    "`to.queue`"
                )
            return NGinnPublisher(
                transport.dialect, transport.config, as_, transport.pool, event, on_skipped
            )
        return SqlPublisher(transport.dialect, transport.config, transport.pool, event)
    if kind == "rabbitmq":
        from bridge.transports.rabbitmq.events import RabbitMQPublisher
        from bridge.transports.rabbitmq.transport import Transport as RabbitTransport

        assert isinstance(transport, RabbitTransport)
        return RabbitMQPublisher(transport.config, connection, event)
    raise UsageError(f"connection {connection!r} ({kind}) cannot publish events")
