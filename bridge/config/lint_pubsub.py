"""The rules of publish/subscribe in routes.yaml: routes that publish, `events:`, and each
`subscribes:` entry against the registry (messaging-bridge.md §2, §4; nginn.md for NGinn's
subscription table), one precise message each, at `FILE:LINE:COL`. Called by `lint.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.config.event_tables import HASH_CHARS
from bridge.config.kinds import RULES
from bridge.config.models import BridgeConfig, EventRoute, Route
from bridge.config.names import address_name, nginn_width
from bridge.config.registry import Place, Registry
from bridge.errors import ConfigError
from bridge.nservicebus.events import exchange_name, type_name_problem
from bridge.transports.sql.config import (
    NGINN_ENDPOINT_CHARS,
    NGINN_MESSAGE_TYPE_CHARS,
    NGINN_SUBSCRIPTION_ENDPOINT_CHARS,
)

if TYPE_CHECKING:
    from bridge.config.loader import Positions
    from bridge.config.pubsub import PubSub, Subscribed

__all__ = ["PUBLISHES", "events", "publishes", "subscriptions"]


#: Connection types the bridge publishes events on.
PUBLISHES = ("sqlserver", "postgresql", "sqlite", "rabbitmq")


def publishes(
    config: BridgeConfig, route: Route, path: tuple[str | int, ...], at: Positions
) -> None:
    """A route that publishes: `to` names a connection that NServiceBus publishes on."""
    to = route.to
    connection = config.connections.get(to.connection)
    if connection is None:
        known = ", ".join(sorted(config.connections)) or "none"
        raise ConfigError(
            f"to names connection {to.connection!r}, which is not defined (known: {known})",
            at.at((*path, "to", "connection")),
        )
    if connection.type not in PUBLISHES:
        raise ConfigError(
            f"publish: connection {to.connection!r} is {connection.type}, where events are not "
            "published; publish on a SQL or RabbitMQ connection",
            at.at((*path, "publish")),
        )
    if getattr(connection, "layout", None) == "nginn":
        _publishes_as_nginn(config, route, path, at)
        return
    if getattr(connection, "topology", "conventional") != "conventional":
        raise ConfigError(
            f"publish: RabbitMQ connection {to.connection!r} has the direct topology; the bridge "
            "publishes to the conventional topology's exchanges",
            at.at((*path, "publish")),
        )
    if to.queue is not None or to.topic is not None or to.group is not None:
        raise ConfigError(
            "a route that publishes names only its destination's connection: the subscribers "
            "say where each event goes",
            at.at((*path, "to")),
        )


def _publishes_as_nginn(
    config: BridgeConfig, route: Route, path: tuple[str | int, ...], at: Positions
) -> None:
    """On NGinn tables an event is published as an NGinn endpoint: subscribers are found by the
    publisher's endpoint, so the route names the publisher's table, `to.queue`."""
    to = route.to
    if to.queue is None or to.topic is not None or to.group is not None:
        raise ConfigError(
            f"publish: connection {to.connection!r} holds NGinn tables, where subscribers are "
            "found by the publisher's endpoint: name the publisher's table as `to.queue` "
            "(the events are published as `sql://<alias>/<queue>`)",
            at.at((*path, "to")),
        )
    where = at.at((*path, "to", "queue"))
    if not to.queue.strip() or "\x00" in to.queue:
        raise ConfigError(f"to: empty or invalid name {to.queue!r}", where)
    address_name(config.connections[to.connection].type, to.queue, "to", where)
    model = config.connections[to.connection]
    endpoint = RULES[model.type].canonical_address(model, to.queue)
    nginn_width(endpoint, NGINN_ENDPOINT_CHARS, "publisher endpoint (from_endpoint)", where)


def events(config: BridgeConfig, at: Positions) -> None:
    """`events:`: .NET full names, each with a topic Kafka accepts."""
    for name, event in config.events.items():
        problem = type_name_problem(name)
        if problem is not None:
            raise ConfigError(problem, at.at(("events", name), key=True))
        if event.topic is not None:
            address_name("kafka", event.topic, f"event {name!r}", at.at(("events", name, "topic")))


def subscriptions(config: BridgeConfig, registry: Registry, at: Positions) -> None:
    """`subscribes:` (messaging-bridge.md §2, §4): events with .NET full names, one registered
    publisher per event, a proxy where the bridge subscribes, a legal topic where an event
    crosses Kafka, RabbitMQ's conventional topology where it crosses RabbitMQ."""
    publishers: dict[str, tuple[str, str]] = {}
    for name, endpoint in config.endpoints.items():
        seen: set[str] = set()
        for i, subscription in enumerate(endpoint.subscribes):
            path: tuple[str | int, ...] = ("endpoints", name, "subscribes", i)
            event, publisher = subscription.event, subscription.publisher
            problem = type_name_problem(event)
            if problem is not None:
                raise ConfigError(problem, at.at((*path, "event")))
            if event in seen:
                raise ConfigError(
                    f"endpoint {name!r} subscribes to {event!r} twice", at.at((*path, "event"))
                )
            seen.add(event)
            if publisher not in config.endpoints:
                raise ConfigError(
                    f"event {event!r}: publisher {publisher!r} is not a registered endpoint "
                    f"({registry.nearest(publisher, endpoint.connection)}); register it under "
                    "`endpoints:`",
                    at.at((*path, "publisher")),
                )
            first = publishers.setdefault(event, (publisher, name))
            if first[0] != publisher:
                raise ConfigError(
                    f"event {event!r} has two publishers: {first[0]!r} (for {first[1]!r}) and "
                    f"{publisher!r}; an event has one publisher",
                    at.at((*path, "publisher")),
                )
    pubsub = registry.pubsub
    # topics of events from Kafka
    read = {r.from_.address for r in pubsub.routes() if isinstance(r, EventRoute)}
    queues = {(p.connection, p.queue): p for p in registry.places()}
    for s in pubsub.subscriptions():
        if not s.native:
            continue
        i = [x.event for x in config.endpoints[s.endpoint].subscribes].index(s.event)
        where = at.at(("endpoints", s.endpoint, "subscribes", i))
        kinds = {config.connections[c].type for c in (s.connection, registry.home(s.endpoint))}
        # event tables (NGinn) or queues (Kafka subscribers), not proxies, carry it
        nginn = pubsub.nginn(s.connection) is not None
        if s.kind == "proxy" and not nginn and not registry.has_place(s.queue, s.connection):
            raise ConfigError(
                f"endpoint {s.endpoint!r} subscribes to {s.event!r}, published on "
                f"{s.connection!r}, where it has no proxy (`proxies: connections` leaves "
                f"{s.connection!r} out)",
                where,
            )
        if s.kind == "kafka" and not nginn and s.table is not None:
            kind = config.connections[s.connection].type
            address_name(kind, s.table, f"event queue of {s.event!r} on {s.connection!r}", where)
        _nginn_subscription(s, pubsub, where)
        _nginn_typed(
            config, registry, s, at.at(("endpoints", s.endpoint, "subscribes", i, "event"))
        )
        if s.kind == "home" and config.connections[s.connection].type == "kafka":
            topic = pubsub.topic(s.event)
            raise ConfigError(
                f"endpoint {s.endpoint!r} on Kafka connection {s.connection!r} subscribes to "
                f"{s.event!r}, which {s.publisher!r} publishes on Kafka connection "
                f"{registry.home(s.publisher)!r}: the bridge publishes events on SQL and "
                f"RabbitMQ connections, and a Kafka subscriber reads the event's topic "
                f"({topic!r}) where it is produced; copy the topic to {s.connection!r} with a "
                "written route, or move the subscriber",
                where,
            )
        for c in (s.connection, registry.home(s.endpoint), registry.home(s.publisher)):
            model = config.connections[c]
            exchange = exchange_name(s.event)
            if model.type == "rabbitmq" and len(exchange.encode()) > 255:
                raise ConfigError(
                    f"event {s.event!r} crosses RabbitMQ connection {c!r}, where its exchange "
                    f"{exchange!r} would be {len(exchange.encode())} bytes in UTF-8; RabbitMQ "
                    "takes 255",
                    where,
                )
            if model.type == "rabbitmq" and model.topology != "conventional":
                raise ConfigError(
                    f"endpoint {s.endpoint!r} subscribes to {s.event!r} across RabbitMQ "
                    f"connection {c!r}, whose topology is {model.topology}: the bridge "
                    "subscribes and publishes with the conventional topology's exchanges",
                    where,
                )
        if s.kind == "kafka" and pubsub.topic(s.event) in read:
            raise ConfigError(
                f"event {s.event!r} would go to topic {pubsub.topic(s.event)!r}, from which the "
                "bridge also publishes events published on Kafka: they would come back; give "
                "the events their own topics under `events:`",
                where,
            )
        if s.kind in ("kafka", "home"):
            _event_topic_is_no_queue(s, registry, queues, at, where)
        if "kafka" in kinds or s.kind == "home":
            topic = pubsub.topic(s.event)
            written = s.event in config.events and config.events[s.event].topic
            address_name(
                "kafka",
                topic,
                f"event {s.event!r} (its topic)",
                at.at(("events", s.event, "topic")) if written else where,
            )
    _publishing_loops(config, registry, at)


def _publishing_loops(config: BridgeConfig, registry: Registry, at: Positions) -> None:
    """A written route with `publish: true` must not read a topic to which the bridge sends an
    event published on the route's destination (by an event queue's route or an NGinn event
    table's): each event would be published there again, reach the Kafka subscribers'
    subscription again and come back to the topic, for ever. On NGinn tables only when the
    route publishes as the event's publisher (its `to.queue`), whose subscribers they are."""
    pubsub = registry.pubsub
    produced: dict[tuple[str, str], list[Subscribed]] = {}
    for s in pubsub.subscriptions():
        if s.kind == "kafka":
            key = (registry.home(s.endpoint), pubsub.topic(s.event))
            produced.setdefault(key, []).append(s)
    for i, route in enumerate(config.routes):
        if not route.publish or route.from_.topic is None:
            continue
        topic = route.from_.topic
        for s in produced.get((route.from_.connection, topic), []):
            if route.to.connection != s.connection:
                continue
            as_ = f"{s.connection!r}"
            if pubsub.nginn(s.connection) is not None:
                model = config.connections[s.connection]
                queue = route.to.queue
                publisher = registry.address(s.publisher, s.connection)
                if queue is None or (
                    str(RULES[model.type].canonical_address(model, queue)).casefold()
                    != publisher.casefold()
                ):
                    continue
                as_ = f"{s.connection!r} as {publisher}"
            raise ConfigError(
                f"route {route.name!r} publishes on {as_} what it reads from topic {topic!r} "
                f"on {route.from_.connection!r}, where the bridge sends event {s.event!r} that "
                f"{s.publisher!r} publishes there, for Kafka subscriber {s.endpoint!r}: each "
                "event would be published again, reach that subscription and come back to the "
                "topic, for ever; read another topic, or give the event its own under `events:`",
                at.at(("routes", i, "from", "topic")),
            )


def _nginn_subscription(s: Subscribed, pubsub: PubSub, where: str) -> None:
    """A row of NGinn's subscription table fits its columns, and its subscriber endpoint the
    queue tables' `to_endpoint`, where NGinn's Notify writes it (Impl/MessageBus.cs:360-367 of
    lafar6502/nginn-messagebus @1fa4baf); an NGinn publisher's subscription has an event table
    (`event_tables.py`); where the bridge publishes as the publisher (an event from Kafka), its
    endpoint fits the queue tables' `from_endpoint`."""
    row = pubsub.nginn_row(s)
    if row is None:
        return
    options = pubsub.nginn(s.connection)
    if s.kind in ("proxy", "kafka") and s.table is None and options is not None:
        prefix = f"sql://{options.alias}/"
        raise ConfigError(
            f"endpoint {s.endpoint!r} subscribes to {s.event!r}, published on NGinn tables on "
            f"{s.connection!r}: the bridge subscribes an event table of its own there, and "
            f"its endpoint {prefix}<table> must fit NGinn's {NGINN_ENDPOINT_CHARS}-character "
            f"to_endpoint; {prefix!r} leaves {NGINN_ENDPOINT_CHARS - len(prefix)} characters, "
            f"a table needs {HASH_CHARS + 1}: shorten `nginn.alias` of {s.connection!r}",
            where,
        )
    publisher, subscriber, message_type = row
    nginn_width(publisher, NGINN_SUBSCRIPTION_ENDPOINT_CHARS, "publisher_endpoint", where)
    nginn_width(subscriber, NGINN_SUBSCRIPTION_ENDPOINT_CHARS, "subscriber_endpoint", where)
    what = "subscriber_endpoint (the to_endpoint of each event NGinn sends it)"
    nginn_width(subscriber, NGINN_ENDPOINT_CHARS, what, where)
    nginn_width(message_type, NGINN_MESSAGE_TYPE_CHARS, "message_type", where)
    if s.kind == "home":
        what = f"publisher endpoint of {s.publisher!r} (from_endpoint of what it publishes)"
        nginn_width(publisher, NGINN_ENDPOINT_CHARS, what, where)


def _nginn_typed(config: BridgeConfig, registry: Registry, s: Subscribed, where: str) -> None:
    """An event the bridge writes onto a subscriber's NGinn tables (through its proxy, or
    published there from Kafka) has a `nginn.types` entry: NGinn dispatches on the body's
    `$type` (nginn.md), NServiceBus bodies carry none, so the row mapping refuses every such
    event at run time (`nginn_outgoing.outgoing`). An event whose publisher is on NGinn
    tables too comes with NGinn's own `$type`."""
    home = registry.home(s.endpoint)
    options = registry.pubsub.nginn(home)
    if options is None or s.event in options.types:
        return
    source = registry.home(s.publisher)
    if getattr(config.connections[source], "layout", None) == "nginn":
        return
    raise ConfigError(
        f"endpoint {s.endpoint!r} on NGinn tables ({home!r}) subscribes to {s.event!r}, which "
        f"{s.publisher!r} publishes on {source!r}: its NServiceBus body carries no `$type`, "
        "which NGinn dispatches on, so every such event would go to the error queue; map it "
        f"under `connections.{home}.nginn.types` ({s.event}: 'Ns.Type, Assembly')",
        where,
    )


def _event_topic_is_no_queue(
    s: Subscribed,
    registry: Registry,
    queues: dict[tuple[str, str], Place],
    at: Positions,
    where: str,
) -> None:
    """An event's topic on a Kafka connection (where the bridge produces it, or where its
    publisher does and the bridge reads it) must not be an endpoint's topic or proxy there:
    events would reach the endpoint as messages, or its messages be published as events."""
    produced = s.kind == "kafka"
    connection = registry.home(s.endpoint if produced else s.publisher)
    topic = registry.pubsub.topic(s.event)
    found = queues.get((connection, topic))
    if found is None:
        return
    what = "the proxy of endpoint" if found.proxy else "the input topic of endpoint"
    doing = "sends it to" if produced else "publishes what it reads from"
    written = registry.config.events.get(s.event)
    raise ConfigError(
        f"event {s.event!r}: the bridge {doing} topic {topic!r} on {connection!r}, which is "
        f"{what} {found.endpoint!r}: "
        + (
            "the endpoint would receive the events as messages"
            if produced
            else "whatever is sent to the endpoint there would be published as the event too"
        )
        + "; give the event a topic of its own under `events:`",
        at.at(("events", s.event, "topic")) if written and written.topic else where,
    )
