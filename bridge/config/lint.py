"""The cross-field rules of routes.yaml, one precise message each, at `FILE:LINE:COL`.

Rules that belong to one connection type (Kafka's security settings, RabbitMQ's URL, each
transport's names) live with that transport in its driver-free `config.py`, listed in `RULES`.
A route whose two ends are one table, topic or queue loops, also when two connection names
reach it (`bridge.config.places`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from bridge.config.event_tables import HASH_CHARS
from bridge.config.kinds import RULES
from bridge.config.models import (
    ROUTE_NAME,
    BridgeConfig,
    ConnectionConfig,
    DerivedRoute,
    Endpoint,
    EventRoute,
    Route,
)
from bridge.config.places import place
from bridge.config.registry import Place, Registry
from bridge.errors import ConfigError
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE
from bridge.nservicebus.events import exchange_name, type_name_problem
from bridge.transports.sql.config import KINDS as SQL_KINDS
from bridge.transports.sql.config import (
    NGINN_ENDPOINT_CHARS,
    NGINN_MESSAGE_TYPE_CHARS,
    NGINN_SUBSCRIPTION_ENDPOINT_CHARS,
)

if TYPE_CHECKING:
    from bridge.config.loader import Positions
    from bridge.config.pubsub import PubSub, Subscribed

__all__ = [
    "RULES",
    "SECRET_KEYS",
    "connection_warnings",
    "credential_warnings",
    "is_secret",
    "lint",
    "registry_warnings",
    "route_warnings",
]

#: Connection fields that may hold a credential; nothing else in routes.yaml may.
SECRET_KEYS = ("dsn", "url", "management_url", "sasl_password")
_KEY_VALUE_SECRET = re.compile(
    r"\b(?:password|pwd)\s*=\s*(?P<value>\{[^}]*\}|'[^']*'|[^;\s&]+)", re.I
)
_VARIABLE = re.compile(r"\$\{[^}]*\}")
_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}")


def _endpoint(
    config: BridgeConfig, endpoint: Endpoint, role: str, path: tuple[str | int, ...], at: Positions
) -> None:
    """Check one route end against its connection."""
    connection = config.connections.get(endpoint.connection)
    if connection is None:
        known = ", ".join(sorted(config.connections)) or "none"
        raise ConfigError(
            f"{role} names connection {endpoint.connection!r}, which is not defined "
            f"(known: {known})",
            at.at((*path, "connection")),
        )
    kind = connection.type
    rules = RULES[kind]
    key, other = ("topic", "queue") if rules.ADDRESS_KEY == "topic" else ("queue", "topic")
    if getattr(endpoint, key) is None or getattr(endpoint, other) is not None:
        name = "Kafka" if kind == "kafka" else kind
        raise ConfigError(
            f"{role} is the {name} connection {endpoint.connection!r}: name a `{key}`, "
            f"not a `{other}`",
            at.at(path),
        )
    if rules.SOURCE_GROUP and role == "from" and not endpoint.group:
        raise ConfigError("a Kafka source needs a consumer `group`", at.at((*path, "topic")))
    if endpoint.group is not None and not (rules.SOURCE_GROUP and role == "from"):
        raise ConfigError("`group` is only for Kafka sources", at.at((*path, "group")))
    address = endpoint.address
    if not address.strip() or "\x00" in address:
        raise ConfigError(f"{role}: empty or invalid name {address!r}", at.at(path))
    _address_name(kind, address, role, at.at((*path, "queue" if endpoint.queue else "topic")))


def _publishes(
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
    _address_name(config.connections[to.connection].type, to.queue, "to", where)
    model = config.connections[to.connection]
    endpoint = RULES[model.type].canonical_address(model, to.queue)
    _nginn_width(endpoint, NGINN_ENDPOINT_CHARS, "publisher endpoint (from_endpoint)", where)


def _nginn_width(value: str, width: int, what: str, where: str) -> None:
    if len(value) > width:
        raise ConfigError(
            f"NGinn {what} {value[:60]!r} is {len(value)} characters; its column holds {width}",
            where,
        )


#: Connection types the bridge publishes events on.
PUBLISHES = ("sqlserver", "postgresql", "sqlite", "rabbitmq")


def _loop(config: BridgeConfig, route: Route) -> str | None:
    """Why `route` would forward each message back where it took it from, or None."""
    ends = (route.from_, route.to)
    if ends[0].connection == ends[1].connection and ends[0].address == ends[1].address:
        return "from and to are the same place: the route would loop"
    source, destination = (place(config.connections[e.connection], e.address) for e in ends)
    if source is None or destination is None or not source.same_as(destination):
        return None
    return (
        f"from and to are the same place: connections {ends[0].connection!r} and "
        f"{ends[1].connection!r} both reach {destination.shown}, so the route would loop"
    )


def _address_name(kind: str, name: str, role: str, where: str) -> None:
    """A queue, table or topic name its transport would refuse, found before anything runs.

    Empty names and NUL (every transport's rule) are checked above for every endpoint.
    """
    problem = RULES[kind].address_problem(kind, name)
    if problem is not None:
        raise ConfigError(f"{role}: {problem}", where)


def _connection(name: str, connection: ConnectionConfig, at: Positions) -> None:
    """The rules of the connection's own transport, at the key each is about."""
    for key, problem in RULES[connection.type].lint(connection):
        path: tuple[str | int, ...] = ("connections", name) + (tuple(key.split(".")) if key else ())
        raise ConfigError(f"connections.{name}: {problem}", at.at(path))


def lint(config: BridgeConfig, at: Positions) -> None:
    """Raise ConfigError for the first rule a valid-shaped config breaks."""
    for name, connection in config.connections.items():
        _connection(name, connection, at)
    seen: set[str] = set()
    for i, route in enumerate(config.routes):
        path: tuple[str | int, ...] = ("routes", i)
        if route.name in seen:
            raise ConfigError(f"duplicate route name {route.name!r}", at.at((*path, "name")))
        seen.add(route.name)
        _endpoint(config, route.from_, "from", (*path, "from"), at)
        if route.publish:
            _publishes(config, route, path, at)
        else:
            _endpoint(config, route.to, "to", (*path, "to"), at)
        loop = None if route.publish else _loop(config, route)
        if loop is not None:
            raise ConfigError(loop, at.at((*path, "to")))
        if route.error_queue is not None:
            where = at.at((*path, "error_queue"))
            # Empty means the default, `bridge.error`.
            if "\x00" in route.error_queue or (route.error_queue and not route.error_queue.strip()):
                raise ConfigError(f"error_queue: invalid name {route.error_queue!r}", where)
            source = config.connections[route.from_.connection].type
            _address_name(source, route.error_queue, "error_queue", where)
        for old, new in route.headers.rename.items():
            if not old or not new:
                raise ConfigError("header names cannot be empty", at.at((*path, "headers")))
    _events(config, at)
    if config.endpoints:
        _registry(config, at)
    if config.delays is not None:
        _delays(config, config.delays.connection, at)


def _delays(config: BridgeConfig, name: str, at: Positions) -> None:
    """`delays: {connection}` names a SQL connection (messaging-bridge.md §4)."""
    where = at.at(("delays", "connection"))
    if name not in config.connections:
        known = ", ".join(sorted(config.connections)) or "none"
        raise ConfigError(f"delays.connection: no connection {name!r} (known: {known})", where)
    kind = config.connections[name].type
    if kind not in SQL_KINDS:
        raise ConfigError(
            f"delays.connection: {name!r} is a {kind} connection; delays wait in a table of a "
            "SQL connection (sqlite, postgresql, sqlserver)",
            where,
        )


def _events(config: BridgeConfig, at: Positions) -> None:
    """`events:`: .NET full names, each with a topic Kafka accepts."""
    for name, event in config.events.items():
        problem = type_name_problem(name)
        if problem is not None:
            raise ConfigError(problem, at.at(("events", name), key=True))
        if event.topic is not None:
            _address_name("kafka", event.topic, f"event {name!r}", at.at(("events", name, "topic")))


def _registry(config: BridgeConfig, at: Positions) -> None:
    """The rules of `endpoints:` and `proxies:` (messaging-bridge.md §1 and §4)."""
    known = ", ".join(sorted(config.connections)) or "none"
    listed = config.proxies.connections
    for i, name in enumerate(listed or ()):
        where = at.at(("proxies", "connections", i))
        if name not in config.connections:
            raise ConfigError(f"proxies: no connection named {name!r} (known: {known})", where)
        if name in (listed or [])[:i]:
            raise ConfigError(f"proxies: connection {name!r} is listed twice", where)
    by_folded: dict[str, str] = {}
    for name, endpoint in config.endpoints.items():
        path: tuple[str | int, ...] = ("endpoints", name)
        if endpoint.connection not in config.connections:
            raise ConfigError(
                f"endpoint {name!r} names connection {endpoint.connection!r}, which is not "
                f"defined (known: {known})",
                at.at((*path, "connection")),
            )
        if not ROUTE_NAME.match(name):
            raise ConfigError(
                f"endpoint name {name!r}: use letters, digits, '.', '_' and '-' (it names the "
                "endpoint's proxies and their routes)",
                at.at(path, key=True),
            )
        other = by_folded.setdefault(name.casefold(), name)
        if other != name:
            raise ConfigError(
                f"endpoints {other!r} and {name!r} differ only in case: addresses are matched "
                "exactly, so one of them would never receive; register one spelling",
                at.at(path, key=True),
            )
        if endpoint.queue is not None:
            kind = config.connections[endpoint.connection].type
            _address_name(kind, endpoint.queue, f"endpoint {name!r}", at.at((*path, "queue")))
    registry = config.registry
    connections = registry.connections()
    if len(connections) < 2:
        raise ConfigError(
            "the endpoint registry needs at least two connections: an endpoint has proxies on "
            "the connections it does not live on",
            at.at(("endpoints",), key=True),
        )
    for connection in connections:
        if not ROUTE_NAME.match(connection):
            raise ConfigError(
                f"connection name {connection!r}: use letters, digits, '.', '_' and '-' (it "
                "names the routes of the proxies on it)",
                at.at(("connections", connection), key=True),
            )
        model = config.connections[connection]
        if model.type == "sqlserver" and not model.catalog:
            raise ConfigError(
                f"connections.{connection}: the endpoint registry needs `catalog` (the database) "
                "on SQL Server connections: addresses carry it as NServiceBus writes them "
                "(`Sales@[dbo]@[catalog]`)",
                at.at(("connections", connection), key=True),
            )
    for first, second in registry.collisions():

        def role(place: Place) -> str:
            return (
                f"the proxy of {place.endpoint!r}"
                if place.proxy
                else f"{place.endpoint!r}'s own queue"
            )

        raise ConfigError(
            f"endpoint {second.endpoint!r}: {second.queue!r} on {second.connection!r} would be "
            f"both {role(first)} and {role(second)}: one queue cannot be both",
            at.at(("endpoints", second.endpoint), key=True),
        )
    for proxy in registry.proxies():
        kind = config.connections[proxy.connection].type
        _address_name(
            kind,
            proxy.queue,
            f"endpoint {proxy.endpoint!r} (its proxy on {proxy.connection!r})",
            at.at(("endpoints", proxy.endpoint), key=True),
        )
    for place_ in registry.places():
        if getattr(config.connections[place_.connection], "layout", None) == "nginn":
            what = "proxy" if place_.proxy else "queue"
            _nginn_width(
                place_.address,
                NGINN_ENDPOINT_CHARS,
                f"{what} endpoint of {place_.endpoint!r} on {place_.connection!r} (to_endpoint)",
                at.at(("endpoints", place_.endpoint), key=True),
            )
    for derived in registry.routes():
        loop = None if derived.publish else _loop(config, derived)
        if loop is not None:
            raise ConfigError(
                f"endpoint {derived.endpoint!r}, its proxy on {derived.from_.connection!r}: {loop}",
                at.at(("endpoints", derived.endpoint), key=True),
            )
    if config.proxies.error_queue:
        for connection in registry.proxy_connections:
            kind = config.connections[connection].type
            where = at.at(("proxies", "error_queue"))
            _address_name(
                kind, config.proxies.error_queue, f"proxies.error_queue on {connection!r}", where
            )
    _error_queues(config, at)
    _subscriptions(config, registry, at)
    _routes_against_registry(config, registry, at)


def _error_queues(config: BridgeConfig, at: Positions) -> None:
    """No error queue may be named like an endpoint: the endpoint would receive poison."""
    folded = {name.casefold(): name for name in config.endpoints}
    queues: list[tuple[str, tuple[str | int, ...] | None]] = [
        (config.proxies.error_queue or DEFAULT_ERROR_QUEUE, ("proxies", "error_queue"))
    ]
    for i, route in enumerate(config.routes):
        queues.append((route.error_queue_name, ("routes", i, "error_queue")))
    for queue, path in queues:
        endpoint = folded.get(queue.casefold())
        if endpoint is not None:
            written = path is not None and path in at.values
            raise ConfigError(
                f"error queue {queue!r} is named like endpoint {endpoint!r}: messages the bridge "
                "cannot forward would be delivered to the endpoint; name another error queue",
                at.at(path) if written and path else at.at(("endpoints", endpoint), key=True),
            )


def _subscriptions(config: BridgeConfig, registry: Registry, at: Positions) -> None:
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
        if s.kind in ("proxy", "kafka") and not registry.has_place(s.queue, s.connection):
            raise ConfigError(
                f"endpoint {s.endpoint!r} subscribes to {s.event!r}, published on "
                f"{s.connection!r}, where it has no proxy (`proxies: connections` leaves "
                f"{s.connection!r} out)",
                where,
            )
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
            _address_name(
                "kafka",
                topic,
                f"event {s.event!r} (its topic)",
                at.at(("events", s.event, "topic")) if written else where,
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
    _nginn_width(publisher, NGINN_SUBSCRIPTION_ENDPOINT_CHARS, "publisher_endpoint", where)
    _nginn_width(subscriber, NGINN_SUBSCRIPTION_ENDPOINT_CHARS, "subscriber_endpoint", where)
    what = "subscriber_endpoint (the to_endpoint of each event NGinn sends it)"
    _nginn_width(subscriber, NGINN_ENDPOINT_CHARS, what, where)
    _nginn_width(message_type, NGINN_MESSAGE_TYPE_CHARS, "message_type", where)
    if s.kind == "home":
        what = f"publisher endpoint of {s.publisher!r} (from_endpoint of what it publishes)"
        _nginn_width(publisher, NGINN_ENDPOINT_CHARS, what, where)


def _nginn_typed(config: BridgeConfig, registry: Registry, s: Subscribed, where: str) -> None:
    """An event the bridge writes onto a subscriber's NGinn tables (through its proxy, or
    published there from Kafka) has a `nginn.types` entry: NGinn dispatches on the body's
    `$type` (nginn.md), NServiceBus bodies carry none, so the row mapping refuses every such
    event at run time (`nginn_rows.RowMapping.outgoing`). An event whose publisher is on NGinn
    tables too comes with NGinn's own `$type`."""
    home = registry.home(s.endpoint)
    model = config.connections[home]
    options = getattr(model, "nginn", None)
    if options is None or getattr(model, "layout", None) != "nginn" or s.event in options.types:
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


def _routes_against_registry(config: BridgeConfig, registry: Registry, at: Positions) -> None:
    """A written route must not do what a derived one does, nor take its name; two derived
    routes cannot share a name (`proxy.a.b.c`: connection `a.b`, endpoint `c`, or `a`, `b.c`)."""
    derived: dict[str, DerivedRoute] = {}
    for made in registry.routes():
        other = derived.setdefault(made.name, made)
        if other is not made:
            raise ConfigError(
                f"endpoint {made.endpoint!r}: its route from {made.from_.connection!r} would "
                f"be named {made.name!r}, as endpoint {other.endpoint!r}'s from "
                f"{other.from_.connection!r}; rename the endpoint or the connection",
                at.at(("endpoints", made.endpoint), key=True),
            )
    sources = {(r.from_.connection, r.from_.address): r for r in derived.values()}
    for i, route in enumerate(config.routes):
        if route.name in derived:
            raise ConfigError(
                f"route name {route.name!r} is the name of a route the registry derives",
                at.at(("routes", i, "name")),
            )
        same = sources.get((route.from_.connection, route.from_.address))
        if same is not None:
            raise ConfigError(
                f"route {route.name!r} reads {route.from_.address!r} on "
                f"{route.from_.connection!r}, the proxy of endpoint {same.endpoint!r}, which "
                f"route {same.name!r} (derived from the registry) already forwards",
                at.at(("routes", i, "from")),
            )


#: Connection types NServiceBus endpoints send and reply on. Kafka is not one: no NServiceBus
#: endpoint replies to a Kafka topic.
_NSERVICEBUS_TYPES = ("sqlserver", "postgresql", "sqlite", "rabbitmq")


def registry_warnings(config: BridgeConfig, at: Positions) -> list[str]:
    """A registry that works but where messages could not go where users expect."""
    if not config.endpoints:
        return []
    registry = config.registry
    out = []
    homes = {e.connection for e in config.endpoints.values()}
    for connection in sorted(homes - set(registry.proxy_connections)):
        out.append(
            f"{at.at(('proxies', 'connections'))}: warning: connection {connection!r} hosts "
            "endpoints but no proxies: its endpoints can receive from the other connections, "
            "but cannot send to them, and replies to them are refused"
        )
    if config.proxies.connections is None:
        for connection in config.connections:
            if connection not in homes:
                out.append(
                    f"{at.at(('connections', connection), key=True)}: warning: connection "
                    f"{connection!r} hosts no endpoint, yet gets a proxy and a route for every "
                    "endpoint; list the connections that take part in `proxies: connections`"
                )
    return out


def connection_warnings(config: BridgeConfig, at: Positions) -> list[str]:
    """Connection settings that work but that a transport's `warnings` advises against."""
    out = []
    for name, connection in config.connections.items():
        advise = getattr(RULES[connection.type], "warnings", None)
        for key, problem in advise(connection) if advise is not None else ():
            path: tuple[str | int, ...] = ("connections", name, *key.split("."))
            out.append(f"{at.at(path)}: warning: connection {name!r}: {problem}")
    return out


def route_warnings(config: BridgeConfig, at: Positions) -> list[str]:
    """Routes that work but whose replies may not: a written route between two NServiceBus
    transports with no address map carries reply addresses the other side cannot reach."""
    out = []
    for i, route in enumerate(config.routes):
        source = config.connections[route.from_.connection].type
        destination = config.connections[route.to.connection].type
        crosses = source != destination and {source, destination} <= set(_NSERVICEBUS_TYPES)
        if crosses and not route.address_map:
            out.append(
                f"{at.at(('routes', i, 'name'))}: warning: route {route.name!r} crosses from "
                f"{source} to {destination} with no address_map: NServiceBus.ReplyToAddress "
                f"values written on {route.from_.connection!r} are not addresses on "
                f"{route.to.connection!r}; register the endpoints under `endpoints:` or map "
                "them in `address_map`"
            )
    return out


def _defaults_used(raw: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """`raw` as the loader uses it, secrets aside: each `${VAR:-default}` becomes its default
    where VAR is unset or empty (the loader then uses the default), else `${VAR}` (the value
    comes from the environment); and the names of the variables whose defaults are used."""
    used: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name, default = match.groups()
        if env.get(name):
            return f"${{{name}}}"
        used.append(name)
        return default

    return _DEFAULT.sub(replace, raw), used


def _holds_password(text: str, key: str) -> bool:
    if key == "sasl_password":
        return bool(text) and not _VARIABLE.fullmatch(text.strip())
    try:
        password = urlsplit(text).password
    except ValueError:
        password = None
    found = [password] if password else []
    found += [m.group("value") for m in _KEY_VALUE_SECRET.finditer(text)]
    return any(value and not _VARIABLE.search(value) for value in found)


def is_secret(path: tuple[str | int, ...]) -> bool:
    """Whether the value at `path` is a connection field that may hold a credential."""
    return len(path) == 3 and path[0] == "connections" and path[2] in SECRET_KEYS


def credential_warnings(
    raw: dict[tuple[str | int, ...], str], at: Positions, env: Mapping[str, str]
) -> list[str]:
    """Credentials written into the file instead of taken from the environment: a literal
    password, or one in the default of a `${VAR:-default}` that is in use (VAR is not set in
    `env`). A default the environment overrides is not used, so it is not warned about: a
    local default such as RabbitMQ's guest:guest is harmless where the variable is set."""
    out = []
    for path, value in raw.items():
        if not is_secret(path):
            continue
        key = str(path[2])
        text, defaults = _defaults_used(value, env)
        if not _holds_password(text, key):
            continue
        where = f"{at.at(path)}: warning: connection {path[1]!r} has a password written in "
        written = _DEFAULT.sub(lambda match: f"${{{match.group(1)}}}", value)  # defaults aside
        if defaults and not _holds_password(written, key):
            names = ", ".join(defaults)
            out.append(
                f"{where}the default of `{key}`, used because {names} is not set; set {names}, "
                "or use ${VAR} and keep secrets in the environment"
            )
        else:
            out.append(f"{where}`{key}`; use ${{VAR}} and keep secrets in the environment")
    return out
